"""Ablation of a stack: each commit's contribution by leave-one-out.

For a stack of N commits between the base and the candidate, variant i is the whole stack with
commit i reverted (``git revert`` in a temporary worktree, deterministic identity and date), or,
when the caller knows each commit's own self-contained commit on the base (`members`: combine's
candidates), the others cherry-picked onto the base again. The second is what leaving one out means
when later commits rely on what an earlier one added: the template generator's kernel package and
its import line come with the first template commit, so reverting it takes them from the others
(on FLUX.2, 2026-12-02, that variant could not run). Base,
stack and every variant are timed in their own runner processes, in rounds (base, stack, v1..vN,
base, stack, v1..vN, ...), so drift hits all alike; the rounds of the base give the A/A noise.

contribution_i = step(stack without i) - step(stack): what commit i buys on top of the others.
The contributions need not add up to base - stack (commits interact); the table says so.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import git

from bot.engine import add_worktree
from bot.jobs import run_job
from bot.paths import new_run_dir
from bot.target import Target
from bot.validate.resolve import GIT_ENV, resolve_base, resolve_candidate
from bot.validate.validator import fresh_seeds


@dataclass
class AblationRow:
    sha: str
    subject: str
    without_ms: float | None = None  # step with this commit reverted (mean of round medians)
    contribution_ms: float | None = None
    contribution_pct: float | None = None  # of the base step
    note: str = ""


@dataclass
class Ablation:
    workload: str
    preset: str
    device: str
    mode: str
    base_sha: str
    candidate_sha: str
    base_ms: float | None = None
    stack_ms: float | None = None
    noise_pct: float | None = None
    rounds: int = 0
    rows: list[AblationRow] = field(default_factory=list)
    run_dir: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def render(self) -> str:
        dev = self.device if not self.device.startswith("cuda") else "cuda"
        lines = [f"ablation (leave-one-out, {self.mode}, measured on {dev}; {self.rounds} rounds): base "
                 f"{_f(self.base_ms)} ms, stack {_f(self.stack_ms)} ms, A/A noise {_f(self.noise_pct, 2)}%"]
        rows = [["commit", "subject", "without it (ms)", "contribution (ms)", "% of base", "note"]]
        for r in self.rows:
            rows.append([r.sha[:12], r.subject[:50], _f(r.without_ms), _f(r.contribution_ms),
                         _f(r.contribution_pct, 2), r.note])
        widths = [max(len(str(x[i])) for x in rows) for i in range(len(rows[0]))]
        for k, row in enumerate(rows):
            lines.append("  " + "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
            if k == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        lines.append("  (contributions interact: they need not sum to base - stack)")
        return "\n".join(lines)


def _f(x, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _revert_worktree(target: Target, stack_sha: str, sha: str) -> tuple[Path | None, str]:
    wt = add_worktree(target.checkout, f"ablate-{stack_sha[:10]}-minus-{sha[:10]}", stack_sha)
    repo = git.Repo(wt)
    if repo.head.commit.hexsha != stack_sha:
        return wt, ""  # reused: the revert is already there
    try:
        repo.git.revert("--no-edit", sha, env=GIT_ENV)
    except git.GitCommandError:
        try:
            repo.git.revert("--abort")
        except git.GitCommandError:
            pass
        return None, "revert conflicts with later commits; not measured"
    return wt, ""


def _rebuilt_worktree(target: Target, base_sha: str, members: list[str], leave: int) -> tuple[Path | None, str]:
    """The stack rebuilt from its members' own commits without member `leave`."""
    wt = add_worktree(target.checkout, f"ablate-{base_sha[:10]}-rebuilt-minus-{members[leave][:10]}", base_sha)
    repo = git.Repo(wt)
    for i, sha in enumerate(members):
        if i == leave:
            continue
        try:
            repo.git.cherry_pick("--allow-empty", "--keep-redundant-commits", sha, env=GIT_ENV)
        except git.GitCommandError:
            try:
                repo.git.cherry_pick("--abort")
            except git.GitCommandError:
                pass
            return None, f"the others do not apply without it ({sha[:12]} conflicts); not measured"
    return wt, ""


def ablate(target: Target, candidate: str, base: str | None = None, *, iters: int | None = None, rounds: int = 2,
           log=None, run_dir: Path | None = None, members: list[str] | None = None) -> Ablation:
    say = log or (lambda m: None)
    base_sha = resolve_base(target.checkout, base)
    rev = resolve_candidate(target.checkout, candidate, base_sha)
    run_dir = run_dir or new_run_dir("ablate")
    is_cuda = target.device.startswith("cuda")
    mode = "eager"
    ab = Ablation(workload=target.workload.name, preset=target.preset, device=target.device, mode=mode,
                  base_sha=base_sha, candidate_sha=rev.sha, rounds=rounds, run_dir=str(run_dir))
    variants: dict[str, tuple[Path, str]] = {
        "base": (add_worktree(target.checkout, f"base-{base_sha[:12]}", base_sha), base_sha),
        "stack": (rev.worktree, rev.sha),
    }
    if members is not None and len(members) != len(rev.commits):
        members = None  # not this stack's: leave-one-out by revert
    for i, (sha, subject) in enumerate(rev.commits):
        row = AblationRow(sha=sha, subject=subject)
        ab.rows.append(row)
        if len(rev.commits) == 1:
            row.note = "the only commit: without it is the base"
            continue
        wt, note = _rebuilt_worktree(target, base_sha, members, i) if members else _revert_worktree(target, rev.sha, sha)
        if wt is None:
            row.note = note
            continue
        variants[sha] = (wt, git.Repo(wt).head.commit.hexsha)
    seed, wseed = fresh_seeds(1)[0], fresh_seeds(1)[0]
    medians: dict[str, list[float]] = {k: [] for k in variants}
    notes: dict[str, str] = {}
    for r in range(rounds):
        for name, (wt, sha) in variants.items():
            if name in notes:
                continue
            job = target.job("validate_step", wt, run_dir / f"{name[:12]}-r{r}", engine_sha=sha, seeds=[seed],
                             weight_seed=wseed, warmup=3 if is_cuda else 1, iters=iters or (10 if is_cuda else 5),
                             params={"correctness": False, "timing": {"modes": ["eager"]}})
            say(f"ablation round {r + 1}/{rounds}: {name[:12]}")
            out = run_job(job, Path(job.out_dir), timeout_s=1800, name="timing")
            if not out.ok:
                notes[name] = f"{out.reason()}"
                continue
            t = out.result["timing"].get("eager")
            if not isinstance(t, dict) or "median_ms" not in t:  # the mode failed in the job: say how
                notes[name] = f"eager timing: {str(t)[:300]}"
                continue
            medians[name].append(t["median_ms"])
    mean = {k: statistics.fmean(v) for k, v in medians.items() if v and k not in notes}
    ab.base_ms, ab.stack_ms = mean.get("base"), mean.get("stack")
    if len(medians["base"]) > 1 and ab.base_ms:
        ab.noise_pct = 100 * (max(medians["base"]) - min(medians["base"])) / ab.base_ms
    for row in ab.rows:
        key = "base" if len(rev.commits) == 1 else row.sha
        if key in notes:
            row.note = f"variant failed: {notes[key]}"
        if key in mean and ab.stack_ms is not None:
            row.without_ms = mean[key]
            row.contribution_ms = mean[key] - ab.stack_ms
            if ab.base_ms:
                row.contribution_pct = 100 * row.contribution_ms / ab.base_ms
    return ab
