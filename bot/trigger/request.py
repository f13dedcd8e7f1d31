"""The request an accepted `/optimize` comment becomes: what `optbot comment` writes and
`optbot optimize --request` reads.

It carries only values optbot checked (a known workload and engine name, a preset, a bounded GPU
count and budget, the head SHA the API reported), never the comment's text, so the workflow moves
it between jobs as one JSON value in an environment variable and no shell ever parses a word of
the comment. Read back, it is checked again: a request file is input like any other.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from bot.errors import OptbotError
from bot.jsonable import from_json, to_json, write_json_atomic
from bot.trigger.event import REPO
from bot.trigger.grammar import OptimizeCommand, check

VERSION = 1
SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class OptimizeRequest:
    repo: str  # OWNER/NAME of the engine, where the pull request is
    pull_request: int
    comment_id: int  # the triggering comment: the run reacts 🚀 or 😕 on it
    head_sha: str  # the pull request's head when the comment was read: the commit the run measures
    command: OptimizeCommand
    requested_by: str  # for the record; the run was authorized by `permission`, never by this name
    permission: str  # the commenter's repository permission, as the API said
    commented_at: str
    version: int = VERSION

    def line(self) -> str:
        """One line of JSON (a GitHub Actions output value holds no newline)."""
        return json.dumps(to_json(self), separators=(",", ":"), sort_keys=True)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, self)


def problem(req: OptimizeRequest) -> str:
    if req.version != VERSION:
        return f"version {req.version!r}; this optbot reads version {VERSION}"
    if not (isinstance(req.head_sha, str) and SHA.fullmatch(req.head_sha)):
        return "head_sha is not a full commit SHA"
    if not (isinstance(req.repo, str) and REPO.fullmatch(req.repo)):
        return "repo is not OWNER/NAME"
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (req.pull_request, req.comment_id)):
        return "pull_request and comment_id must be positive integers"
    if not isinstance(req.command, OptimizeCommand) or not isinstance(req.command.workload, str):
        return "command is not an /optimize command"
    return check(req.command)


def load_request(path: str | Path) -> OptimizeRequest:
    file = Path(path)
    try:
        req = from_json(OptimizeRequest, json.loads(file.read_text()))
    except OSError as e:
        raise OptbotError(f"{file}: cannot read the request: {e.strerror}") from None
    except (ValueError, TypeError) as e:
        raise OptbotError(f"{file}: not an optbot request: {e}") from None
    why = problem(req)
    if why:
        raise OptbotError(f"{file}: not a valid optbot request: {why}")
    return req
