"""What one validation's checks share: the target, the options, the fresh seeds and weights, the
shapes, the run directory. The validator (validator.py) makes it; correctness, engagement and speed
read it. It lives apart so that those modules need not import the validator (no cycle).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bot.target import Target
from bot.validate.attempt import job_key, keep, reuse, tree_of
from bot.workload import Shape
from runner.job import Job

if TYPE_CHECKING:
    from bot.validate.validator import Options


@dataclass
class Context:
    target: Target
    opts: Options
    run_dir: Path
    seeds: list[int]
    weight_seed: int
    shapes: list[Shape]  # the preset's shape, then its extra shapes
    is_cuda: bool
    warmup: int
    iters: int
    notes: list[str] = field(default_factory=list)

    @property
    def gates(self) -> bool:
        """Does speed decide the verdict (slower / no-change reject)? Default: on CUDA only (DESIGN decision 7)."""
        return self.opts.speed_gates if self.opts.speed_gates is not None else self.is_cuda

    def say(self, msg: str) -> None:
        if self.opts.log:
            self.opts.log(msg)

    def run_job(self, job: Job, out_dir: Path, timeout_s: float, name: str, what: str):
        """Run one runner process of this validation (bot/jobs.run_job), or keep the one an earlier
        attempt finished with exactly this job (bot/validate/attempt.py); say how it went."""
        from bot.jobs import run_job

        key = job_key(job, tree_of(self.target.checkout.repo, job.engine_sha) if job.engine_sha else "")
        old = reuse(self.run_dir, name, key)
        if old is not None:
            self.say(f"{what}: finished in an earlier attempt ({old.seconds:.0f} s), kept")
            return old
        out = run_job(job, out_dir, timeout_s=timeout_s, name=name)
        if out.ok:
            keep(self.run_dir, name, key, out)
        self.ran(what, out)
        return out

    def ran(self, what: str, out) -> None:
        """Say how long a runner job took (its JobOutcome): a validation cut from outside (a device
        call's limit, a CI timeout) then shows which of its processes the time went to."""
        self.say(f"{what}: {out.took()}")

    def job(self, kind: str, worktree: Path | None, sha: str, name: str, params: dict, *, seeds=None,
            shapes=None) -> Job:
        """A job with this validation's seeds, weights and shapes (unless given), output under run_dir/name."""
        return self.target.job(kind, worktree, self.run_dir / name, engine_sha=sha, shapes=shapes or self.shapes,
                               seeds=seeds or self.seeds, weight_seed=self.weight_seed, warmup=self.warmup,
                               iters=self.iters, params=params)

    @property
    def modes(self) -> tuple[str, ...]:
        """The production modes checked and timed: Options.modes, else on CUDA the workload's
        production_modes (default all four), on CPU eager (CUDA graphs need CUDA; CPU compile would
        only slow the tiny presets' runs down)."""
        if self.opts.modes is not None:
            return tuple(self.opts.modes)
        return self.target.workload.production_modes if self.is_cuda else ("eager",)

    @property
    def checks_modes(self) -> bool:
        """Whether the correctness processes run the step in each production mode and save its outputs
        there: when timing, and on CUDA always. A correctness-only validation on a GPU (`--no-speed`,
        combine's stack checks) still compares every mode: a stack of members each correct alone was
        correct in eager and 8x over the bound under CUDA graphs (Qwen-Image, H100, 2026-12-07)."""
        return self.opts.speed or self.is_cuda

    def side_params(self, side: str = "candidate") -> dict:
        """validate_step parameters of one side's correctness process (runner/kinds/validate_step.py):
        the first process of a side also saves each mode's outputs, for the per-mode comparison."""
        o = self.opts
        return {"correctness": True, "profile": o.engagement,
                "timing": self.timing_params(save_outputs=True) if self.checks_modes else {},
                "flops": bool(o.speed and self.is_cuda and side == "candidate")}  # the roofline floor

    def timing_params(self, save_outputs: bool = False) -> dict:
        return {"modes": list(self.modes), "save_outputs": save_outputs, "compile_backend": self.opts.compile_backend}
