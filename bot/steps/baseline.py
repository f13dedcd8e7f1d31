"""Step 2, baseline: the base engine's per-step latency, output digests and environment, in a
runner `step` job."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bot.jobs import run_job
from bot.run.context import RunContext
from bot.steps.jobs import failed


@dataclass
class Measurement:
    """One latency measurement and THE device that measured it."""
    device: str  # cpu | cuda: which clock
    device_name: str
    mode: str  # eager | graph
    median_ms: float
    min_ms: float
    max_ms: float
    stdev_ms: float
    n: int
    passes: int = 1

    @property
    def per_pass_ms(self) -> float:
        return self.median_ms / max(self.passes, 1)

    @classmethod
    def from_timing(cls, t: dict | None, device_name: str, passes: int) -> "Measurement | None":
        """From the runner's timing routine (runner/timing.py) of one process."""
        if not isinstance(t, dict) or "median_ms" not in t:
            return None
        return cls(device=t.get("device", "?"), device_name=device_name, mode=t.get("mode", "eager"),
                   median_ms=float(t["median_ms"]), min_ms=float(t.get("min_ms", t["median_ms"])),
                   max_ms=float(t.get("max_ms", t["median_ms"])), stdev_ms=float(t.get("stdev_ms", 0.0)),
                   n=int(t.get("n", 1)), passes=passes)

    @classmethod
    def of_processes(cls, process_ms: list[float], mode: str, device: str, device_name: str, n_per_process: int,
                     passes: int) -> "Measurement | None":
        """Over several processes' medians (the validator's interleaved timing, one side of a Speed)."""
        if not process_ms:
            return None
        return cls(device=device, device_name=device_name, mode=mode, median_ms=float(statistics.median(process_ms)),
                   min_ms=float(min(process_ms)), max_ms=float(max(process_ms)),
                   stdev_ms=float(statistics.stdev(process_ms)) if len(process_ms) > 1 else 0.0,
                   n=int(n_per_process) * len(process_ms), passes=int(passes or 1))


@dataclass
class Result:
    status: str
    eager: Measurement | None
    graph: Measurement | None
    graph_note: str
    outputs: list[dict] = field(default_factory=list)  # the runner's output records: shape, seed, digests
    env: dict = field(default_factory=dict)  # the runner's environment record (runner/env.py)
    log: str = ""

    def summary(self) -> str:
        e = self.eager
        return f"{e.median_ms:.3f} ms/step eager (median of {e.n}, {e.device})" if e else "no timing"


def run(ctx: RunContext) -> Result:
    t = ctx.target
    out_dir = ctx.jobs_dir() / "baseline"
    job = t.job("step", ctx.results.checkout.base_worktree, out_dir, iters=ctx.iters(), seeds=[0])
    out = run_job(job, out_dir, timeout_s=3600, name="baseline")
    if not out.ok:
        raise failed(t, out, "baseline step job")
    r = out.result
    env = r.get("env", {})
    return Result(status="done", eager=Measurement.from_timing(r.get("latency"), env.get("device_name", ""),
                                                               r.get("passes", 1)),
                  graph=None, graph_note="the runner's step job times eager mode only; CUDA-graph numbers come "
                                         "from the validator's end-to-end check of the stack",
                  outputs=r.get("outputs", []), env=env, log=out.log_path)


def measurements(v) -> dict[str, Measurement | None]:
    """A Verdict's interleaved timing as Measurements, "base_MODE" and "cand_MODE" for each
    production mode (base_eager, cand_eager, base_graph, ..., cand_compile+graph); None where that
    mode was not timed."""
    from runner.job import MODES

    dev_name = (v.env or {}).get("device_name", "")
    out: dict[str, Measurement | None] = {f"{side}_{m}": None for m in MODES for side in ("base", "cand")}
    for s in v.speed:
        for side, ms in (("base", s.base_ms), ("cand", s.candidate_ms)):
            if side == "base" and s.base_mode:  # the base could not run this mode (outcome "enabled")
                continue
            out[f"{side}_{s.mode}"] = Measurement.of_processes(ms, s.mode, s.device, dev_name, s.n, s.passes)
    return out
