"""The git side of every generator: how a candidate becomes an engine commit (DESIGN decision 5).

Store replay, variant search, compile region and the agent all commit through here, so a candidate
looks the same whichever generator made it. Messages are written by bot/generate/candidate.py
(``commit_message``, the one trailer writer) and read back by bot/trailers.py (the one parser).

Commits are made as the bot (bot/engine.BOT_ACTOR) with hooks disabled (``core.hooksPath=/dev/null``
and ``--no-verify``): a worktree's content may have been written by an agent, and nothing it wrote
may run in the bot's own process.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bot.engine import BOT_ACTOR
from bot.errors import OptbotError
from bot.generate.candidate import commit_message

_SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false")
_ENV = {"GIT_AUTHOR_NAME": BOT_ACTOR.name, "GIT_AUTHOR_EMAIL": BOT_ACTOR.email,
        "GIT_COMMITTER_NAME": BOT_ACTOR.name, "GIT_COMMITTER_EMAIL": BOT_ACTOR.email}


class CommitError(OptbotError):
    """git could not make a candidate's commit."""


def run_git(wt: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """git in worktree `wt`, hooks off, as the bot; the completed process (never raises on failure)."""
    return subprocess.run(["git", *_SAFE, *args], cwd=wt, input=input, capture_output=True, text=True,
                          env={**os.environ, **_ENV})


def _out(wt: Path, *args: str) -> str:
    proc = run_git(wt, *args)
    if proc.returncode != 0:
        raise CommitError(f"git {' '.join(args)} in {wt} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout


def commit_all(wt: Path, message: str, amend: bool = False, allow_empty: bool = False) -> tuple[str, str]:
    """Commit everything in the worktree; (sha, "") or ("", why it failed)."""
    run_git(wt, "add", "-A")
    proc = run_git(wt, "commit", "-q", "--no-verify", *(["--amend"] if amend else []),
                   *(["--allow-empty"] if allow_empty else []), "-F", "-", input=message)
    if proc.returncode != 0:
        return "", f"git commit failed: {(proc.stderr or proc.stdout).strip()[-300:]}"
    return run_git(wt, "rev-parse", "HEAD").stdout.strip(), ""


def snapshot(wt: Path, message: str) -> str:
    """Commit whatever the worktree holds (also when nothing changed) and return the sha."""
    sha, err = commit_all(wt, message, allow_empty=True)
    if not sha:
        raise CommitError(f"{wt}: {err}")
    return sha


def commit_candidate(wt: Path, base_sha: str, title: str, body: str, trailers: dict[str, str]) -> str:
    """Squash everything since base_sha (snapshots included) into one commit with trailers; its sha."""
    run_git(wt, "add", "-A")
    _out(wt, "reset", "--soft", base_sha)
    sha, err = commit_all(wt, commit_message(title, body, trailers), allow_empty=True)
    if not sha:
        raise CommitError(f"{wt}: {err}")
    return sha


def squash_of(wt: Path, base_sha: str, message: str) -> str:
    """One commit on base_sha holding HEAD's tree, with `message`; HEAD does not move. The agent's
    validations judge these: a one-commit stack whose trailers are the declaration in effect (a
    stack of snapshots would carry the union of every earlier declaration)."""
    tree = _out(wt, "rev-parse", "HEAD^{tree}").strip()
    proc = run_git(wt, "commit-tree", tree, "-p", base_sha, "-F", "-", input=message)
    if proc.returncode != 0:
        raise CommitError(f"git commit-tree in {wt} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout.strip()


def reset_to(wt: Path, sha: str) -> None:
    """Make the worktree (HEAD, index, files) commit `sha`'s, e.g. an earlier snapshot."""
    _out(wt, "reset", "-q", "--hard", sha)


def changed_since(wt: Path, base_sha: str, sha: str = "HEAD") -> bool:
    """Whether commit `sha` holds other files than base_sha."""
    return _out(wt, "rev-parse", f"{base_sha}^{{tree}}") != _out(wt, "rev-parse", f"{sha}^{{tree}}")
