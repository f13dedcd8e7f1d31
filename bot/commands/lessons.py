"""`optbot lessons`: the knowledge base (lessons/<slug>.md)."""
from __future__ import annotations

from pathlib import Path

import click

from bot.commands.common import github_option, knowledge_options
from bot.knowledge import OPPORTUNITY_KINDS
from bot.knowledge.lessons import get_lesson, load_lessons, search

_dir_opt = knowledge_options()


@click.group("lessons")
def command():
    """Lessons learned: pattern (what worked) and caveat (what failed, and why).

    \b
    Examples:
      optbot lessons list
      optbot lessons show all-ones-mask-blocks-cudnn
      optbot lessons search rope --pattern attention-waste --engine diffusers --hardware h200
      optbot lessons review --repo team/sglang --knowledge-repo team/optbot   # lessons from review (GitHub)
    """


def _line(lesson) -> str:
    cond = ", ".join(f"{k}={v}" for k, v in lesson.applies_to.items())
    seen = f"\n    {lesson.seen_line()}" if lesson.seen_line() else ""
    return f"{lesson.slug:40} {lesson.kind:8} {lesson.confidence:7} {cond}\n    {lesson.title}{seen}"


@command.command("list")
@_dir_opt
@click.option("--kind", type=click.Choice(["pattern", "caveat"]), default=None)
def list_cmd(knowledge, kind):
    """List lessons."""
    found = [lesson for lesson in load_lessons(knowledge.lessons) if kind is None or lesson.kind == kind]
    if not found:
        click.echo(f"no lessons in {knowledge.lessons}")
    for lesson in found:
        click.echo(_line(lesson))


@command.command("show")
@_dir_opt
@click.argument("slug")
def show_cmd(knowledge, slug):
    """Show one lesson (front-matter and body)."""
    click.echo(get_lesson(slug, knowledge.lessons).path.read_text().rstrip())


@command.command("search")
@_dir_opt
@click.argument("query", required=False, default="")
@click.option("--pattern", type=click.Choice(OPPORTUNITY_KINDS), default=None, help="Opportunity kind it must apply to.")
@click.option("--engine", default=None, help="Engine it must apply to (diffusers, sglang).")
@click.option("--hardware", default=None, help="Hardware it must apply to (cpu, h200).")
@click.option("--kind", type=click.Choice(["pattern", "caveat"]), default=None)
def search_cmd(knowledge, query, pattern, engine, hardware, kind):
    """Lessons that apply to PATTERN/ENGINE/HARDWARE, ranked by the words of QUERY they contain."""
    found = search(query, pattern, engine, hardware, kind, knowledge.lessons)
    if not found:
        click.echo("no matching lessons")
    for lesson in found:
        click.echo(_line(lesson))


@command.command("review")
@_dir_opt
@github_option("repo", "The engine repository whose pull requests the bot opened.", required=True)
@github_option("knowledge-repo", "GitHub repository of the knowledge, for its pull request; without it the branch stays local.")
@github_option("knowledge-remote")
@github_option("github-api-url")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="Read at most this many of the repository's newest pull requests.")
@click.option("--dry-run", is_flag=True, help="Read GitHub, commit the branch locally, push nothing, open no pull request.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the result as JSON here.")
def review_cmd(knowledge, repo, knowledge_repo, knowledge_remote, github_api_url, limit, dry_run, json_path):
    """Lessons from review of the bot's pull requests in the engine repository REPO.

    \b
    For each pull request the bot opened (author: the token's user; branch optbot/...):
      closed unmerged   -> a caveat lesson with the closing person's last comment (else the last
                           review text of someone with write permission, else "closed without a reason")
      changes requested -> the same caveat, with that review's text (reviewers with write, maintain
                           or admin permission only: anyone can review a public pull request)
      merged            -> its store entries get `production: {repo, pr, merge_sha, merged_at}`
    One lesson per pull request (lessons/review-<repo>-pr-<n>-<hash>.md): a second run adds
    nothing, a changed reason rewrites it. Store replay then does not propose a declined patch again
    for the same engine and workload; a changed patch (another sha256) is proposed again. The
    reviewers' words are quoted as data (capped, no HTML, no markers). What changed is one commit on
    the branch optbot/review-lessons of the knowledge repository and one knowledge pull request.

    \b
    Examples:
      GITHUB_TOKEN=... optbot lessons review --repo team/sglang --knowledge-repo team/optbot
      GITHUB_TOKEN=... optbot lessons review --repo team/sglang --dry-run --json review.json
    Token from OPTBOT_GITHUB_TOKEN or GITHUB_TOKEN (the bot's own account, or set
    $OPTBOT_GITHUB_LOGIN); it reads pull requests and pushes the knowledge branch.
    """
    from bot.commands.common import write_json
    from bot.deliver.forge import github_token
    from bot.deliver.github import GitHubForge
    from bot.deliver.local import LocalForge
    from bot.deliver.review import sync
    from bot.errors import OptbotError
    from bot.jsonable import to_json
    from bot.paths import new_run_dir
    from bot.run.context import RunOptions

    token = github_token()
    if not token:
        raise OptbotError("optbot lessons review: no GitHub token (OPTBOT_GITHUB_TOKEN or GITHUB_TOKEN) to read "
                          f"the pull requests of {repo}")
    opts = RunOptions(workload="", repo=repo, knowledge_repo=knowledge_repo, knowledge_remote=knowledge_remote,
                      github_api_url=github_api_url)
    forge = GitHubForge(token, opts, run_id="lessons-review", log=lambda m: click.echo(m, err=True))
    publish = LocalForge(new_run_dir("review"), "--dry-run: no pushes, no pull requests") if dry_run else forge
    res = sync(forge, publish, repo, knowledge, limit, log=lambda m: click.echo(m, err=True))
    for line in res.ignored:
        click.echo(f"ignored {line}")
    for what, paths in (("wrote", res.written), ("unchanged", res.unchanged), ("removed", res.removed),
                        ("production", res.production)):
        for p in paths:
            click.echo(f"{what:10} {p}")
    click.echo(res.summary())
    if res.knowledge_pr.note:
        click.echo(f"knowledge: {res.knowledge_pr.note}")
    write_json(json_path, to_json(res))
