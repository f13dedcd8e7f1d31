"""`optbot comment`: answer an `/optimize` comment of a GitHub issue_comment event (issue 15)."""
from __future__ import annotations

from pathlib import Path

import click

from bot.commands.common import github_option, write_github_output, write_json
from bot.errors import OptbotError

FILE = click.Path(dir_okay=False, path_type=Path)


@click.command("comment")
@click.option("--event", "event_path", required=True, type=FILE,
              help="The issue_comment event payload (in GitHub Actions: $GITHUB_EVENT_PATH).")
@click.option("--request", "request_path", type=FILE, default=None,
              help="Write the accepted run's request here (JSON), for `optbot optimize --request`.")
@click.option("--github-output", "github_output", type=FILE, default=None,  # its own help: what each output holds
              help="Append status=, and for an accepted run workload=, sha=, request= (the request as one "
                   "line of JSON) and shards= (a checked number: 1 runs on one host, more fan out), to this file "
                   "(in GitHub Actions: $GITHUB_OUTPUT).")
@click.option("--run-failed", is_flag=True,
              help="Only react 😕 on the event's comment: the workflow's step after an optimize run that failed, "
                   "timed out or was cancelled, so the pull request is not left looking busy.")
@github_option("github-api-url")
@click.option("--json", "json_path", type=FILE, default=None, help="Also write the outcome as JSON here.")
def command(event_path, request_path, github_output, run_failed, github_api_url, json_path):
    """Answer the `/optimize` comment of a GitHub issue_comment EVENT; never run anything.

    \b
    The comment's first line must be exactly
      /optimize <workload> [--preset tiny|full] [--gpus N] [--shards N] [--budget 30m|2h|1h30m] [--engine NAME]
    with a workload of optbot's and an engine that workload defines. In order:
      - ignored, nothing posted, exit 0: actions other than `created` (edits, deletions), comments
        by bot accounts, comments whose first line does not start with /optimize;
      - who may trigger is asked of GitHub's API: write, maintain or admin permission on the
        repository. Not a login or actor name: anyone else gets a reply saying who can;
      - an issue that is not a pull request gets a reply that /optimize works on pull requests;
      - anything else starting with /optimize gets the grammar as a reply;
      - a second /optimize while a run of the same workload goes on that pull request gets a reply
        that one is going (a run is going while its comment has optbot's 👀 and neither its 🚀 nor 😕);
      - accepted: 👀 on the comment, the pull request's head SHA recorded from the API now, and the
        request written (--request, --github-output). `optbot optimize WORKLOAD --request FILE`
        measures exactly that SHA and reacts 🚀 or 😕 when it ends.
    Refusals get 😕. Exit 0 for all of these; 2 for a malformed event or a failed API call.

    \b
    Why a request file and not a command line: the comment's text never reaches a shell. It is parsed
    here, in Python, into a typed request that holds only checked values (known names, bounded
    numbers, the SHA); the workflow moves that JSON between its jobs in an environment variable,
    and the next step passes the file's path to `optbot optimize`. No `${{ }}` of the comment is
    ever expanded into a `run:` script (.github/workflows/optimize.yml).

    \b
    GitHub: token from OPTBOT_GITHUB_TOKEN or GITHUB_TOKEN (the same account as the optimize run's,
    so that the run's 🚀 counts as optbot's); none is needed for an event that is ignored.
    """
    from bot.deliver.forge import github_token
    from bot.jsonable import to_json
    from bot.trigger.dispatch import handle, run_failed as react_failed
    from bot.trigger.event import load_event

    event = load_event(event_path)

    def connect():
        return _forge(event, github_token(), github_api_url)

    if run_failed:
        react_failed(event, connect())
        click.echo(f"optbot comment: reacted 😕 on comment {event.comment_id} (the run failed)")
        return
    outcome = handle(event, connect)
    click.echo(f"optbot comment: {outcome.status}: {outcome.note}" + (f" ({outcome.reply_url})" if outcome.reply_url else ""))
    if outcome.request is not None and request_path is not None:
        outcome.request.write(request_path)
    outputs = {"status": outcome.status}
    if outcome.request is not None:
        r = outcome.request
        outputs.update(workload=r.command.workload, sha=r.head_sha, request=r.line(), shards=r.command.shards)
    write_github_output(github_output, outputs)
    write_json(json_path, to_json(outcome), quiet=True)


def _forge(event, token: str | None, api_url: str | None):
    from bot.deliver.github import GitHubForge
    from bot.run.context import RunOptions

    if not token:
        raise OptbotError("optbot comment: no GitHub token (OPTBOT_GITHUB_TOKEN or GITHUB_TOKEN) to authorize "
                          "the commenter, reply and react")
    # not a run: the forge only asks, replies and reacts on this comment's pull request
    opts = RunOptions(workload="", repo=event.repo, trigger_pr=event.issue_number, trigger_comment=event.comment_id,
                      github_api_url=api_url)
    return GitHubForge(token, opts, run_id=f"comment-{event.comment_id}", log=lambda m: click.echo(m, err=True))
