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

The rounds are timed in one production mode (`mode`: optimize passes the one its stack verdict
measured fastest, since on an engine whose eager step is host-bound the eager rounds are noise: SGLang's
FP8 Qwen-Image, H100, 2026-12-07, 20% A/A noise eager against 1.2% under a CUDA graph). Each finished
round is kept in `rounds.json` of the run directory and `between_rounds` (optimize: its --pause-after
check) runs before the next, so an attempt that stops keeps what it measured and a resumed one goes on
from there, on a GPU of the same name (a round is base, stack and variants back to back: rounds from
two machines of one kind compare; rounds from another kind are dropped).
"""
from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import git

from bot.engine import add_worktree
from bot.jobs import run_job
from bot.paths import new_run_dir
from bot.target import Target
from bot.validate.resolve import GIT_ENV, resolve_base, resolve_candidate
from bot.validate.validator import fresh_seeds
from bot.validate.verdict import Verdict
from runner.job import parse_mode


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


def ablation_mode(v: Verdict | None) -> tuple[str, str]:
    """(the production mode to time the leave-one-out in, why): the mode in which the stack's verdict
    measured the stack fastest, of those that ran for base and stack alike; eager where none did. The
    fastest mode is the one production serves, and on a host-bound engine the only one whose rounds
    are not noise (SGLang's FP8 Qwen-Image, H100, 2026-12-07: eager 268 ms at 20% A/A noise, CUDA graph
    196 ms at 1.2%; compiled modes fail there)."""
    timed = [(statistics.fmean(s.candidate_ms), s.mode) for s in (v.speed if v else [])
             if s.base_ms and s.candidate_ms and s.outcome != "n/a" and not s.base_mode]
    if not timed:
        return "eager", "no mode of the stack's verdict was timed for base and stack: eager"
    ms, mode = min(timed)
    return mode, f"the stack's fastest mode in its verdict, {ms:.3f} ms"


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
           log=None, run_dir: Path | None = None, members: list[str] | None = None, mode: str = "eager",
           between_rounds: Callable[[str], None] | None = None) -> Ablation:
    parse_mode(mode)  # an unknown mode fails here, before any worktree or process
    say = log or (lambda m: None)
    base_sha = resolve_base(target.checkout, base)
    rev = resolve_candidate(target.checkout, candidate, base_sha)
    run_dir = run_dir or new_run_dir("ablate")
    is_cuda = target.device.startswith("cuda")
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
    kept = _Rounds.load(run_dir, mode, {k: sha for k, (_, sha) in variants.items()})
    if kept.done:
        say(f"ablation: {kept.done} round(s) kept from an earlier attempt on {kept.device_name}")
    medians, notes = kept.medians, kept.notes
    first = kept.done
    for r in range(first, rounds):
        if r > first and between_rounds is not None:
            between_rounds(f"ablation round {r + 1}/{rounds}")
        for name, (wt, sha) in variants.items():
            if name in notes:
                continue
            job = target.job("validate_step", wt, run_dir / f"{name[:12]}-r{r}", engine_sha=sha, seeds=[kept.seed],
                             weight_seed=kept.weight_seed, warmup=3 if is_cuda else 1,
                             iters=iters or (10 if is_cuda else 5),
                             params={"correctness": False, "timing": {"modes": [mode]}})
            say(f"ablation round {r + 1}/{rounds}: {name[:12]}")
            out = run_job(job, Path(job.out_dir), timeout_s=1800, name="timing")
            say(f"ablation round {r + 1}/{rounds}: {name[:12]}: {out.took()}")
            if not out.ok:
                notes[name] = f"{out.reason()}"
                continue
            kept.device_name = kept.device_name or (out.result.get("env") or {}).get("device_name", "")
            t = out.result["timing"].get(mode)
            if not isinstance(t, dict) or "median_ms" not in t:  # the mode failed in the job: say how
                notes[name] = f"{mode} timing: {str(t)[:300]}"
                continue
            medians[name].append(t["median_ms"])
        kept.done = r + 1
        kept.save()
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


@dataclass
class _Rounds:
    """The finished rounds of one ablation (its `rounds.json`): which variants at which shas, in which
    mode, on which GPU, with which seeds, and each variant's medians and failures so far."""
    path: Path
    mode: str
    variants: dict[str, str]
    seed: int
    weight_seed: int
    device_name: str = ""
    done: int = 0
    medians: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path, mode: str, variants: dict[str, str]) -> "_Rounds":
        path = Path(run_dir) / "rounds.json"
        fresh = cls(path, mode, variants, fresh_seeds(1)[0], fresh_seeds(1)[0], medians={k: [] for k in variants})
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            return fresh
        if d.get("mode") != mode or d.get("variants") != variants or not isinstance(d.get("done"), int):
            return fresh  # another stack or mode: measured anew
        here = _gpu_name()
        if here and d.get("device_name") and d["device_name"] != here:
            return fresh  # measured on another kind of GPU: its rounds do not compare with this one's
        try:
            return cls(path, mode, variants, int(d["seed"]), int(d["weight_seed"]), d.get("device_name", ""),
                       d["done"], {k: [float(x) for x in (d.get("medians") or {}).get(k, [])] for k in variants},
                       {k: str(v) for k, v in (d.get("notes") or {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError):
            return fresh  # a file this code did not write whole: measured anew

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {k: getattr(self, k) for k in ("mode", "variants", "seed", "weight_seed", "device_name", "done",
                                              "medians", "notes")}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.path)


def _gpu_name() -> str:
    """This machine's first GPU's name as nvidia-smi lists it ("" without one; the runner's environment
    records the same name). nvidia-smi, not torch: the bot process does not initialise CUDA."""
    from bot.runner_host import query_gpus

    gpus, _ = query_gpus()
    return gpus[0].name if gpus else ""
