"""Why is a validation's first (correctness) process slower in eager than its timing-only processes?

Seen on the H200 (benchmarks/results/h200-template-20261203/): SD3.5-large eager 273.1 ms in the
base's correctness process against 193.1 ms in its timing process, Qwen-Image 436.3 against 408.4;
graph and compile modes were not affected. A correctness process does, before it times
(runner/kinds/validate_step.py): the poisoned correctness steps, the engagement profile
(torch.profiler), and on the candidate side the FLOP count. This script repeats those phases on
the base engine in ONE process and times eager after each, so the phase that leaves the slowdown
behind shows as the first slow row.

    python benchmarks/probe_first_process.py sd3.5-large [--iters 10]     # on the H200; prints a table

It runs the base engine (trusted code) in this process, without the runner's sandbox.
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cpu: the tiny preset, to try the script (CPU times mean nothing here)")
    a = ap.parse_args()

    import torch

    from bot.target import base_worktree, resolve_target
    from runner.harness import build, make_step
    from runner.poison import PoisonEmpty, poison_allocator
    from runner.profiler import count_flops, profile_step
    from runner.timing import time_interleaved

    t = resolve_target(a.workload, None, None, "full" if a.device == "cuda" else "tiny", a.device)
    out = Path(tempfile.mkdtemp(prefix="probe-"))
    job = t.job("validate_step", base_worktree(t), out, seeds=range(a.seeds), iters=a.iters)
    sys.path.insert(0, job.engine_root)  # as the runner child does: the engine worktree's package first
    built = build(job)
    rows: list[tuple[str, float]] = []

    def eager(after: str) -> None:
        step, _ = make_step(built, job, job.shapes[0], job.seeds[0])
        r = time_interleaved({"eager": step}, job.device, warmup=job.warmup, iters=job.iters)["eager"]
        rows.append((after, r.median_ms))
        print(f"eager after {after:<34} {r.median_ms:9.3f} ms/step", flush=True)

    eager("build (a timing-only process)")
    eager("one more timing")
    for shape in job.shapes:
        for seed in job.seeds:
            step, _ = make_step(built, job, shape, seed)
            poison_allocator(job.device)
            with PoisonEmpty():
                step()
            if a.device == "cuda":
                torch.cuda.synchronize()
    eager("the poisoned correctness steps")
    step, _ = make_step(built, job, job.shapes[0], job.seeds[0])
    step()
    profile_step(built.model, step, job.device, out / "trace.json.gz")
    eager("the engagement profile")
    count_flops(step)
    eager("the FLOP count")
    gc.collect()
    if a.device == "cuda":
        torch.cuda.empty_cache()
    eager("gc.collect + empty_cache")
    base = rows[0][1]
    print("\n| after | eager ms/step | vs a fresh process |\n|---|---:|---:|")
    for what, ms in rows:
        print(f"| {what} | {ms:.3f} | {ms / base:.3f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
