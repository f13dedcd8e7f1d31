"""The agent's way into THE validator (DESIGN decision 6): ``validate_commit`` calls
``bot.validate.validate`` and hands back its Verdict (bot/validate/verdict.py) unchanged.

Verdicts are kept per (git tree, declared trailers, speed) for the run, so a snapshot the agent
validated and the final candidate commit of the same files and the same declaration (the kernels it
adds and removes, its kernel tests) share one validation. Calls are serialized: the validator adds
shared base worktrees, and an agent asking for a tree another agent is validating waits for that
verdict instead of running it again.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from bot.target import Target
from bot.trailers import parse_trailer_lists
from bot.validate import Options, validate
from bot.validate.verdict import Verdict


@dataclass
class ValidationContext:
    """What the agent's validations share within one generation."""
    target: Target
    base_sha: str
    work_dir: Path  # validation run directories and the base side's cache go under <work_dir>/validation
    kernel_store: Path | None = None  # the run's store: where a replayed entry's kernel tests are (None: locate()'s)
    _verdicts: dict[tuple[str, bool], Verdict] = field(default_factory=dict, repr=False)  # (tree, speed) -> verdict
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_target(cls, target: Target, work_dir: Path, *, base_sha: str | None = None,
                    kernel_store: Path | None = None) -> "ValidationContext":
        return cls(target=target, base_sha=base_sha or target.checkout.base_sha, work_dir=Path(work_dir),
                   kernel_store=kernel_store)


# the trailers the validator acts on (bot/validate/resolve.py): part of what a verdict is about
JUDGED_TRAILERS = ("Optbot-Adds-Kernels", "Optbot-Removes-Kernels", "Optbot-Kernel-Tests", "Optbot-Entry")


def _key(ctx: ValidationContext, sha: str, speed: bool) -> tuple:
    """(tree, the stack's judged trailers, speed): what makes two commits the same validation."""
    repo = ctx.target.checkout.repo
    declared: set[tuple[str, str]] = set()
    for c in repo.iter_commits(f"{ctx.base_sha}..{sha}"):
        declared |= {(k, v) for k, vs in parse_trailer_lists(c.message).items() if k in JUDGED_TRAILERS for v in vs}
    return (repo.commit(sha).tree.hexsha, tuple(sorted(declared)), speed)


def cached_verdict(ctx: ValidationContext, sha: str, *, speed: bool) -> Verdict | None:
    """The verdict already given to commit `sha` (or the same tree and declaration), else None."""
    key = _key(ctx, sha, speed)
    with ctx._lock:
        return ctx._verdicts.get(key)


def validate_commit(ctx: ValidationContext, sha: str, *, speed: bool) -> Verdict:
    """The validator's verdict on commit `sha` against the base: correctness (and engagement, kernel
    checks), plus end-to-end speed when `speed`. Raises OptbotError when the validator cannot judge
    (e.g. the base engine itself fails)."""
    key = _key(ctx, sha, speed)
    with ctx._lock:
        hit = ctx._verdicts.get(key)
        if hit is not None:
            return hit
        what = "speed" if speed else "correctness"
        opts = Options(speed=speed, run_dir=ctx.work_dir / "validation" / f"{what}-{sha[:12]}",
                       cache_dir=ctx.work_dir / "validation" / "base-cache", kernel_store=ctx.kernel_store)
        verdict = validate(ctx.target, sha, base=ctx.base_sha, opts=opts)
        ctx._verdicts[key] = verdict
        return verdict


def strength(verdict: Verdict | None) -> tuple[int, float]:
    """Ordering for "the strongest candidate": accepted, then held, then rejected, then no verdict at
    all (the validator could not judge); within a status, the eager speedup."""
    if verdict is None:
        return (-1, 0.0)
    return ({"accepted": 2, "held": 1}.get(verdict.status, 0), verdict.speedup("eager") or 0.0)


def verdict_line(verdict: Verdict) -> str:
    """One line: status (reason): summary."""
    return verdict.status + (f" ({verdict.reason})" if verdict.reason else "") + f": {verdict.summary}"
