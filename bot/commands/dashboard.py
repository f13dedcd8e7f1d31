"""`optbot dashboard`: the dashboard issue (bot/deliver/dashboard.py), shown, its ticked boxes read back."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import click

from bot.commands.common import github_option, github_output_option, knowledge_options, write_github_output, write_json
from bot.deliver import dashboard as dash
from bot.errors import OptbotError

_repo_opt = github_option("repo", "The engine's GitHub repository (needs $OPTBOT_GITHUB_TOKEN). Without it: the local "
                              "dashboard, $OPTBOT_RUNS_DIR/dashboard.md.")
_api_opt = github_option("github-api-url")


def _forge(repo: str | None, api_url: str | None):
    """GitHub's dashboard with --repo (a token is then required), else the local one."""
    from bot.deliver.forge import github_token
    from bot.deliver.local import LocalForge, dashboard_file

    if repo is None:
        click.echo(f"local dashboard: {dashboard_file()} (no --repo)", err=True)
        return LocalForge(None, "no --repo")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
        raise click.BadParameter(f"{repo!r}: expected OWNER/NAME", param_hint="--repo")
    token = github_token()
    if not token:
        raise OptbotError(f"--repo {repo}: no GitHub token (OPTBOT_GITHUB_TOKEN / GITHUB_TOKEN / GH_TOKEN) is set; "
                          "set one, or leave out --repo for the local dashboard")
    from bot.deliver.github import GitHubForge
    from bot.run.context import RunOptions

    return GitHubForge(token, RunOptions(workload="", repo=repo, github_api_url=api_url), "dashboard",
                       log=lambda m: click.echo(m, err=True))


@click.group("dashboard")
def command():
    """The dashboard: one issue per engine repository that every `optbot optimize` run keeps up to date.

    Each workload has a section: its open optimization PR, every candidate of the latest run with
    its verdict and reason, the store entries retired or held for review, and boxes a maintainer
    ticks to ask for a re-run of the workload or a re-validation of an entry. Ticking a box edits the
    issue, which needs write access to the repository (docs/dashboard.md).

    \b
    Examples:
      optbot dashboard show --repo team/sglang          the issue's body, as markdown
      optbot dashboard show                             the local one (no token: $OPTBOT_RUNS_DIR/dashboard.md)
      optbot dashboard requests --repo team/sglang --github-output "$GITHUB_OUTPUT"
                                                        ticked boxes -> rerun=["flux2"], revalidate=[...]
      optbot dashboard done --repo team/sglang --revalidated flux2-merge-qkv
                                                        untick the boxes of work that was done
    """


@command.command("show")
@_repo_opt
@_api_opt
def show_cmd(repo, github_api_url):
    """Print the current dashboard."""
    found = _forge(repo, github_api_url).dashboard()
    if found is None:
        click.echo("no dashboard yet: the first `optbot optimize` run that delivers here opens it", err=True)
        return
    if not found.open:
        click.echo(f"dashboard issue #{found.number} was closed by a person (runs leave it closed): {found.url}",
                   err=True)
    elif found.url:
        click.echo(f"dashboard: {found.url}", err=True)
    click.echo(found.body.replace("\r\n", "\n").rstrip("\n"))


def _outputs(req: dash.Requests) -> dict[str, str]:
    """GitHub Actions step outputs: only names optbot checked (workloads it has, store entry ids)."""
    j = lambda xs: json.dumps(xs, separators=(",", ":"))  # noqa: E731
    return {"rerun": j(req.rerun), "revalidate": j(req.revalidate), "revalidate_ids": " ".join(req.revalidate),
            "refused": str(len(req.refused))}


@command.command("requests")
@_repo_opt
@_api_opt
@knowledge_options(store=True)
@github_output_option("the requests as step outputs (rerun, revalidate: JSON lists; revalidate_ids: space "
                      "separated; refused: a count)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the typed requests (and what was refused, and why) as JSON.")
def requests_cmd(repo, github_api_url, knowledge, github_output, json_path):
    """Read the ticked boxes back: the workloads to re-run, the entries to re-validate.

    A name counts only when it is a workload optbot has or an entry of the kernel store; anything
    else in a ticked box is refused with the reason (printed escaped, never passed on). Reading
    unticks nothing: the run that does the work does.
    """
    from bot.knowledge.store import load_store
    from bot.workload import available_workloads

    found = _forge(repo, github_api_url).dashboard()
    source = found.url if found else "(no dashboard)"
    if found is not None and not found.open:
        click.echo(f"dashboard issue #{found.number} is closed: no requests are read from it", err=True)
        found = None
    req = dash.read_requests(found.body if found else None, source, available_workloads(),
                             [e.id for e in load_store(knowledge.kernel_store)])
    for w in req.rerun:
        click.echo(f"re-run {w}")
    for e in req.revalidate:
        click.echo(f"re-validate {e}")
    for r in req.refused:  # escaped by read_requests: no control character, no workflow command
        click.echo(f"refused in section {r.section}: {r.request}: {r.reason}")
    if not (req.rerun or req.revalidate or req.refused):
        click.echo("no ticked box")
    write_github_output(github_output, _outputs(req))
    write_json(json_path, dataclasses.asdict(req))


@command.command("done")
@_repo_opt
@_api_opt
@click.option("--rerun", "rerun", multiple=True, metavar="WORKLOAD", help="A workload that was re-run (repeatable).")
@click.option("--revalidated", multiple=True, metavar="ENTRY", help="An entry that was re-validated (repeatable).")
@click.option("--workload", default=None, help="Untick only in this workload's section (default: every section).")
def done_cmd(repo, github_api_url, rerun, revalidated, workload):
    """Untick the boxes of work that was done (the store check's side; optimize runs untick their own)."""
    for name in (*rerun, *revalidated, *([workload] if workload else [])):
        if not re.fullmatch(dash.NAME, name):
            raise click.BadParameter(f"{name!r}: not a workload or entry name")
    done = [("rerun", w) for w in rerun] + [("revalidate", e) for e in revalidated]
    ref = dash.record_done(_forge(repo, github_api_url), done, workload)
    click.echo(f"dashboard: {ref.action} {ref.url} {ref.note}".strip())
