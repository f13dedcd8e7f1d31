"""What `optbot comment` does with an `/optimize` comment, through the GitHub API (PyGithub, with
the forge's rate-limit policy), in this order:

  1. authorize: GET /repos/O/R/collaborators/LOGIN/permission. Write, maintain or admin may trigger
     (the API's `permission` reports maintain as "write" and triage as "read"). Never a login or
     actor name, never the payload's `author_association`: a stranger learns who can trigger,
     and nothing runs.
  2. pull requests only: an issue has no head commit to measure.
  3. the grammar (bot/trigger/grammar.py); anything else that starts with /optimize gets the help.
  4. the head SHA, asked of the API now (GET /repos/O/R/pulls/N): a push after the comment does
     not change what is measured.
  5. 👀 on the comment: optbot took it on. The reaction's author is the bot's own account as
     GitHub sees it, whatever the token is (an installation token cannot ask GET /user).
  6. one run per pull request and workload: an earlier `/optimize` comment for the same workload
     that carries the bot's 👀 but neither its 🚀 (the run finished) nor its 😕 (it failed or was
     refused), and is younger than RUN_WINDOW_S (a killed job leaves no mark), is a run still
     going. Comments made within seconds of each other can both pass; the workflow's concurrency
     group then runs them one after the other.
  7. the OptimizeRequest (bot/trigger/request.py) for `optbot optimize --request`, whose run
     reacts 🚀 or 😕 on the same comment when it ends.
A refusal is one reply (found again by its marker, so a re-run edits it instead of repeating it)
and 😕. Replies never quote the comment.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timezone
from typing import TYPE_CHECKING, Callable

from github import GithubException

from bot.errors import OptbotError
from bot.trigger.event import CommentEvent
from bot.trigger.grammar import OptimizeCommand, help_text, parse
from bot.trigger.request import OptimizeRequest

if TYPE_CHECKING:
    from bot.deliver.github import GitHubForge

RUN_WINDOW_S = 6 * 3600  # the workflow's optimize job has timeout-minutes 360 (tests/test_workflows.py)
MAY_TRIGGER = ("admin", "write")
DONE = ("rocket", "confused")

UNAUTHORIZED = ("**optbot** runs are started by people with write, maintain or admin permission on this "
                "repository, as GitHub's API reports it for the comment's author. Nothing was started; "
                "someone with that permission can comment `/optimize` here if this pull request should be optimized.")
NOT_A_PULL_REQUEST = ("**optbot**: `/optimize` works on pull requests. A run measures a pull request's head "
                      "commit, and an issue has none; comment on the pull request you want optimized.")
ALREADY = ("**optbot** is already optimizing `{workload}` on this pull request ({url}); this comment started "
           "nothing. Comment again once that comment has its 🚀 or 😕.")


@dataclass
class Outcome:
    status: str  # ignored | unauthorized | not-a-pull-request | help | already-running | dispatched
    note: str
    request: OptimizeRequest | None = None
    reply_url: str = ""


def marker(comment_id: int) -> str:
    """The hidden line that finds optbot's answer to one comment again."""
    return f"<!-- optbot-comment: {comment_id} -->"


class Conversation:
    """The pull request (or issue) the comment was made on, through one GitHubForge (its options
    name the repository, the issue and the comment)."""

    def __init__(self, forge: GitHubForge, event: CommentEvent):
        self.forge, self.event = forge, event
        self.repo = forge.repo(event.repo)
        self._issue = self._comment = None

    def issue(self):
        if self._issue is None:
            self._issue = self.forge.call(f"get #{self.event.issue_number}", self.repo.get_issue, self.event.issue_number)
        return self._issue

    def comment(self):
        if self._comment is None:
            self._comment = self.forge.call("get the comment", self.issue().get_comment, self.event.comment_id)
        return self._comment

    def react(self, content: str) -> int:
        """React on the comment; the id of the account that reacted (the bot, as GitHub sees it)."""
        reaction = self.forge.call(f"react {content}", self.comment().create_reaction, content)
        return reaction.user.id

    def reply(self, body: str) -> str:
        return self.forge.reply(body, marker(self.event.comment_id)).url

    def permission(self) -> str:
        def ask():
            try:
                return self.repo.get_collaborator_permission(self.event.login)
            except GithubException as e:
                if e.status == 404:  # no such user: no permission
                    return "none"
                raise  # the forge's call retries rate limits and reports the rest

        return self.forge.call("get the commenter's permission", ask)

    def head_sha(self) -> str:
        pr = self.forge.call(f"get PR #{self.event.issue_number}", self.repo.get_pull, self.event.issue_number)
        return pr.head.sha

    def run_going(self, cmd: OptimizeCommand, me: int, now: float) -> str:
        """The address of an earlier comment whose run with cmd's run_key (workload, engine, recipe) is
        still going, or ""."""
        comments = self.forge.call("list comments", lambda: list(self.issue().get_comments()))
        key = cmd.run_key()
        for c in reversed(comments):  # newest first
            if c.id >= self.event.comment_id or c.user is None or c.user.type == "Bot":
                continue
            p = parse(c.body or "")
            if p.command is None or p.command.run_key() != key:
                continue
            made = c.created_at if c.created_at.tzinfo else c.created_at.replace(tzinfo=timezone.utc)
            if now - made.timestamp() > RUN_WINDOW_S:
                continue
            marks = {r.content for r in self.forge.call("list reactions", lambda c=c: list(c.get_reactions()))
                     if r.user is not None and r.user.id == me}
            if "eyes" in marks and not marks.intersection(DONE):
                return c.html_url
        return ""


def handle(event: CommentEvent, connect: Callable[[], GitHubForge], now: float | None = None) -> Outcome:
    """Answer one comment event; the Outcome says whether a run was requested. `connect()` makes
    the GitHubForge, only for an event that is not ignored (those need no token)."""
    why = event.ignored()
    if why:
        return Outcome("ignored", why)
    conv = Conversation(connect(), event)
    perm = conv.permission()
    if perm not in MAY_TRIGGER:
        return _refuse(conv, "unauthorized", UNAUTHORIZED, f"the commenter's permission is {perm!r}")
    if not event.is_pull_request:
        return _refuse(conv, "not-a-pull-request", NOT_A_PULL_REQUEST, f"#{event.issue_number} is an issue")
    parsed = parse(event.body)
    if parsed.command is None:
        return _refuse(conv, "help", help_text(parsed.problem), parsed.problem)
    cmd = parsed.command
    sha = conv.head_sha()
    me = conv.react("eyes")
    try:
        going = conv.run_going(cmd, me, time.time() if now is None else now)
    except OptbotError:
        _react_quietly(conv, "confused")  # a 👀 with no end would read as a run going
        raise
    if going:
        return _refuse(conv, "already-running", ALREADY.format(workload=cmd.workload, url=going),
                       f"a run of {cmd.workload} is going ({going})")
    req = OptimizeRequest(repo=event.repo, pull_request=event.issue_number, comment_id=event.comment_id,
                          head_sha=sha, command=cmd, requested_by=event.login, permission=perm,
                          commented_at=event.created_at)
    return Outcome("dispatched", f"{cmd.workload} at {sha[:12]} of PR #{event.issue_number}", req)


def run_failed(event: CommentEvent, forge: GitHubForge) -> None:
    """😕 on the comment of a run that failed, timed out or was cancelled (the workflow's last step)."""
    Conversation(forge, event).react("confused")


def _refuse(conv: Conversation, status: str, body: str, note: str) -> Outcome:
    url = conv.reply(body)
    _react_quietly(conv, "confused")
    return Outcome(status, note, reply_url=url)


def _react_quietly(conv: Conversation, content: str) -> None:
    try:
        conv.react(content)
    except OptbotError as e:  # a reaction is courtesy: the reply or the error already says it
        conv.forge.log(f"could not react {content}: {e}")
