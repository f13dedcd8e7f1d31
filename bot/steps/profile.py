"""Step 3, profile: one step of the base engine under torch.profiler (runner `profile` job): time per
category and kernel, the module that launched each kernel, launches, roofline. `optbot profile`
runs the same job through ``profile_base``."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bot.jsonable import write_json_atomic
from bot.run.context import RunContext
from bot.steps.jobs import run_ok
from bot.target import Target


@dataclass
class Result:
    status: str
    device: str
    total_ms: float
    categories: dict[str, float]
    top_kernels: list[dict]
    launches: int | None
    profile_file: str  # the whole profile (profile.full.json): analyze and the generators read it
    env: dict = field(default_factory=dict)
    reused_from: str = ""  # an earlier run's profile of this very base (bot/run/base_cache.py)

    def summary(self) -> str:
        top = max(self.categories, key=self.categories.get) if self.categories else "?"
        return (f"{self.total_ms:.3f} ms/step ({self.device}); most time in {top}"
                + (f"; reused from {self.reused_from}" if self.reused_from else ""))

    def load(self) -> dict:
        return json.loads(Path(self.profile_file).read_text())


def profile_base(t: Target, worktree: Path | str, out_dir: Path, iters: int, timeout_s: float = 3600,
                 mode: str = "eager") -> dict:
    """The runner's profile of one step of `worktree` (warm-up 2, `iters` timed steps) in `mode`
    (runner/modes.py; the optimize run's profile is eager: the analyzer maps kernels to module ops)."""
    return run_ok(t, "profile", Path(worktree), out_dir, timeout_s, iters=iters, warmup=2, params={"mode": mode})


def run(ctx: RunContext) -> Result:
    from bot.run import base_cache

    out_dir = ctx.jobs_dir() / "profile"
    full = out_dir / "profile.full.json"
    key = ctx.base_key()
    hit = base_cache.lookup(key) if key else None
    if hit:  # the same base, machine, software and analyzer: the ranking input is known
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(hit[0] / "profile.full.json", full)
        return _result(json.loads(full.read_text()), full, hit[1].line())
    p = profile_base(ctx.target, ctx.results.checkout.base_worktree, out_dir, ctx.profile_iters())
    write_json_atomic(full, p)
    return _result(p, full, "")


def _result(p: dict, full: Path, reused_from: str) -> Result:
    kernels = sorted(p.get("kernels", []), key=lambda k: -float(k.get("ms", 0)))[:15]
    return Result(status="done", device=p.get("device", "?"), total_ms=float(p.get("total_ms", 0.0)),
                  categories=p.get("categories", {}), top_kernels=kernels,
                  launches=p.get("launches") or p.get("launch_count"), profile_file=str(full), env=p.get("env", {}),
                  reused_from=reused_from)
