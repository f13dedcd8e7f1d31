"""A GitHub `issue_comment` event payload ($GITHUB_EVENT_PATH), read into the fields optbot uses.

GitHub writes the payload, but the comment's body is anyone's text and the file is read before
anyone is authorized, so every field is checked for its type, and names that go into API paths
(the repository, the login) for GitHub's own character sets. Nothing else of the payload is used:
not `sender`, not `author_association`, not the login as a credential (who may trigger is asked
of the API, bot/trigger/dispatch.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from bot.errors import OptbotError
from bot.trigger.grammar import is_command

REPO = re.compile(r"[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}")
LOGIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?")
TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{8,15}(?:Z|[+-][0-9]{2}:[0-9]{2})")
MAX_EVENT_BYTES = 4 << 20  # a comment is at most 65,536 characters; the payload around it is small


@dataclass(frozen=True)
class CommentEvent:
    action: str  # created | edited | deleted
    repo: str  # OWNER/NAME the comment was made in (the engine's repository)
    issue_number: int
    is_pull_request: bool  # `issue.pull_request` is present
    comment_id: int
    body: str
    login: str  # the comment's author
    user_type: str  # "User", "Bot", "Organization"
    created_at: str

    def ignored(self) -> str:
        """Why this event is not optbot's to answer ("" when it is). Nothing is posted for these."""
        if self.action != "created":
            return f"action {self.action!r}: only a newly created comment can start a run"
        if self.user_type == "Bot":
            return "the comment was written by a bot account"
        if not is_command(self.body):
            return "the comment's first line does not start with /optimize"
        return ""


def _get(d: dict, path: str, typ: type | tuple, file: Path):
    cur = d
    for k in path.split("."):
        if not isinstance(cur, dict) or k not in cur:
            raise OptbotError(f"{file}: key '{path}' is missing; expected an issue_comment event payload")
        cur = cur[k]
    if not isinstance(cur, typ) or (isinstance(cur, bool) and typ is int):  # JSON true is no number
        raise OptbotError(f"{file}: key '{path}': got {type(cur).__name__}; expected {getattr(typ, '__name__', typ)}")
    return cur


def load_event(path: str | Path) -> CommentEvent:
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as e:
        raise OptbotError(f"{file}: cannot read the event payload: {e.strerror}") from None
    if len(raw) > MAX_EVENT_BYTES:
        raise OptbotError(f"{file}: {len(raw)} bytes; an issue_comment payload is far smaller")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise OptbotError(f"{file}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise OptbotError(f"{file}: expected a JSON object (an issue_comment event payload)")
    repo = _get(data, "repository.full_name", str, file)
    login = _get(data, "comment.user.login", str, file)
    if not REPO.fullmatch(repo):
        raise OptbotError(f"{file}: key 'repository.full_name': not an OWNER/NAME of GitHub")
    if not LOGIN.fullmatch(login):
        raise OptbotError(f"{file}: key 'comment.user.login': not a GitHub login")
    made = _get(data, "comment.created_at", str, file)
    if not TIME.fullmatch(made):
        raise OptbotError(f"{file}: key 'comment.created_at': not a GitHub timestamp")
    body = data["comment"].get("body")
    return CommentEvent(action=_get(data, "action", str, file), repo=repo,
                        issue_number=_get(data, "issue.number", int, file),
                        is_pull_request=isinstance(data["issue"].get("pull_request"), dict),
                        comment_id=_get(data, "comment.id", int, file),
                        body=body if isinstance(body, str) else "",
                        login=login, user_type=_get(data, "comment.user.type", str, file),
                        created_at=made)
