"""`optbot store check --propose`: each entry's check becomes a decision, the decisions one pull request
of the knowledge repository, and a section of the dashboard (bot/knowledge/upkeep.py does the work)."""
from __future__ import annotations

from pathlib import Path

import click

from bot.commands.common import command_line, echo_err, utc_now
from bot.errors import OptbotError


def proposal_preflight(knowledge) -> None:
    """--propose commits into the knowledge repository: it must be one, holding the store and lessons."""
    if knowledge.repo is None:
        raise OptbotError(f"--propose: {knowledge.root} ({knowledge.why}) is not a git repository with a commit; "
                          f"the proposal is a branch of the knowledge repository (--knowledge-path)")
    for what, folder in (("--store", knowledge.kernel_store), ("--lessons-dir", knowledge.lessons)):
        if not folder.resolve().is_relative_to(knowledge.root):
            raise OptbotError(f"--propose: {what} {folder} is outside the knowledge repository {knowledge.root}")


def propose(knowledge, entries, prepared, results, tips, run_dir: Path, device: str, preset, engine, ref,
             forge_opts: dict):
    """Each entry's check -> a decision -> the staged change -> one knowledge pull request."""
    from bot.deliver.forge import make_forge
    from bot.knowledge.upkeep import Proposal, Staging, act, decide, publish
    from bot.run.context import RunOptions

    staging = Staging(run_dir / "proposal" / "knowledge", knowledge.kernel_store.resolve().relative_to(knowledge.root).as_posix(),
                      knowledge.lessons.resolve().relative_to(knowledge.root).as_posix(), knowledge.lessons)
    decisions = []
    for e, prep, r in zip(entries, prepared, results):
        d = decide(e, r)
        click.echo(f"{e.id}: {d.outcome} -> {d.action}: {d.why[:200]}", err=True)
        act(d, e, r, prep, staging, command_line(), run_dir, preset, log=echo_err)
        decisions.append(d)
    checked = [t.checkout for t in tips if t is not None and t.checkout is not None]
    engines = sorted({e.engine.name for e, t in zip(entries, tips) if t is None or t.checkout is not None})
    name = engines[0] if len(engines) == 1 else "all"
    tip = checked[0].base_sha if checked and len({c.base_sha for c in checked}) == 1 else ""
    where = (f"`{checked[0].name}` ({checked[0].repo_path}, ref `{checked[0].ref}`)" if checked
             else "of each entry's `engine.source`")
    measured = next((d.measured_on for d in decisions if d.outcome != "not-checked"), device)
    p = Proposal(name, tip, where, measured, command_line(), decisions)
    # the forge of `optimize`: GitHub with a token, else the local forge; its `repo` is only where an
    # engine PR or a reply would go, and a store check makes neither
    o = forge_opts
    from bot.deliver.forge import github_token

    if github_token() and not o["dry_run"] and not o["knowledge_repo"]:
        raise OptbotError("--propose with a GitHub token opens the pull request in the knowledge repository: give "
                          "--knowledge-repo OWNER/NAME (or $OPTBOT_KNOWLEDGE_REPO), or --dry-run for a local branch")
    opts = RunOptions(workload="", dry_run=o["dry_run"], repo=o["repo"] or o["knowledge_repo"],
                      knowledge_repo=o["knowledge_repo"], knowledge_remote=o["knowledge_remote"],
                      github_api_url=o["github_api_url"], command=command_line())
    forge = make_forge(opts, run_dir.name, run_dir, log=echo_err)
    publish(p, staging, knowledge, forge, log=echo_err)
    click.echo(f"proposal: {p.pr.action} {p.pr.url} {p.pr.note}".rstrip()
               + (f" (branch {p.branch}, {len(p.files)} files)" if p.files else ""))
    _dashboard(forge, p, bool(o["repo"]))
    return p


def _dashboard(forge, p, engine_repo: bool) -> None:
    """The store check's section of the dashboard; on GitHub only with the engine repository
    (--repo: the dashboard is its issue). A failure there is a line, the proposal stands."""
    from bot.deliver import dashboard
    from bot.deliver.github import GitHubForge

    if isinstance(forge, GitHubForge) and not engine_repo:
        click.echo("dashboard: not updated (no --repo / $OPTBOT_ENGINE_REPO: the engine repository holds it)", err=True)
        return
    try:
        ref = dashboard.update(forge, dashboard.store_check_of(p, utc_now()))
    except OptbotError as e:
        click.echo(f"dashboard: not updated: {e}", err=True)
        return
    click.echo(f"dashboard: {ref.action} {ref.url} {ref.note}".rstrip())


