"""Git side of generated candidates: snapshot commits while an agent works, and the final candidate
commit with its trailers (DESIGN decision 5). Used by every generator of mine (agent, compile region,
variant search), so a candidate looks the same whichever generator made it.

Commits are made with hooks disabled (core.hooksPath=/dev/null, --no-verify): the worktree's content
was written by an agent, and nothing it wrote may run in the bot's process.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import git

from bot.generate.candidate import make_trailers as _design_trailers
from bot.trailers import parse_trailers

ACTOR_NAME, ACTOR_EMAIL = "optbot", "optbot@localhost"
_SAFE = ("-c", "core.hooksPath=/dev/null", "-c", f"user.name={ACTOR_NAME}", "-c", f"user.email={ACTOR_EMAIL}",
         "-c", "commit.gpgsign=false")


def _git(repo: git.Repo, *args: str) -> str:
    return repo.git.execute(["git", *_SAFE, *args])


def has_changes(worktree: Path) -> bool:
    return git.Repo(worktree).is_dirty(untracked_files=True)


def snapshot(worktree: Path, message: str) -> str:
    """Commit whatever the worktree holds (also when nothing changed) and return the sha."""
    repo = git.Repo(worktree)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--no-verify", "--allow-empty", "-m", message)
    return repo.head.commit.hexsha


def trailer_block(trailers: dict[str, str]) -> str:
    lines = []
    for k, v in trailers.items():
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*", k):
            raise ValueError(f"bad trailer key {k!r}")
        lines.append(f"{k}: {' '.join(str(v).split())}")
    return "\n".join(lines)


def commit_candidate(worktree: Path, base_sha: str, subject: str, body: str, trailers: dict[str, str]) -> str:
    """Squash everything since base_sha (snapshots included) into one commit with trailers; return its sha."""
    repo = git.Repo(worktree)
    _git(repo, "add", "-A")
    _git(repo, "reset", "--soft", base_sha)
    msg = subject.strip() + "\n\n" + (body.strip() + "\n\n" if body.strip() else "") + trailer_block(trailers) + "\n"
    _git(repo, "commit", "-q", "--no-verify", "--allow-empty", "-m", msg)
    return repo.head.commit.hexsha


def read_trailers(repo_path: Path, sha: str) -> dict[str, str]:
    return parse_trailers(git.Repo(repo_path).commit(sha).message)


def diff_against(worktree: Path, base_sha: str, sha: str | None = None) -> str:
    repo = git.Repo(worktree)
    return repo.git.diff(base_sha, sha or "HEAD", "--no-color", "--no-ext-diff")


def changed_files(worktree: Path, base_sha: str, sha: str | None = None) -> list[str]:
    repo = git.Repo(worktree)
    return [p for p in repo.git.diff(base_sha, sha or "HEAD", "--name-only").splitlines() if p]


def make_trailers(opportunity_id: str, kind: str, generator: str, run_id: str, adds: list[str] | None = None,
                  removes: list[str] | None = None, entry_id: str = "") -> dict[str, str]:
    """The five DESIGN trailers (bot/generate/candidate.make_trailers, one writer) plus who
    generated it in which run."""
    return {**_design_trailers(opportunity_id, kind, list(adds or []), list(removes or []), entry_id),
            "Optbot-Generator": generator, "Optbot-Run": run_id}


@dataclass
class GeneratedCandidate:
    """Same fields as bot/generate/candidate.Candidate (the store helper's, on branch `store`); kept
    here so this branch stands alone. as_candidate() converts, in one place."""
    id: str
    opportunity_id: str
    kind: str
    generator: str
    worktree: str
    commit_sha: str
    base_sha: str = ""
    entry_id: str = ""
    adds_kernels: list[str] = field(default_factory=list)
    removes_kernels: list[str] = field(default_factory=list)
    trailers: dict[str, str] = field(default_factory=dict)
    title: str = ""

    def to_json(self) -> dict:
        return dict(vars(self))


def as_candidate(c: GeneratedCandidate):
    """The store helper's Candidate when bot/generate/candidate.py is present, else `c` itself."""
    try:
        from bot.generate.candidate import Candidate  # type: ignore[import-not-found]
    except ImportError:
        return c
    fields = getattr(Candidate, "__dataclass_fields__", {})
    return Candidate(**{k: v for k, v in vars(c).items() if k in fields})
