"""The bench job: one engine worktree, several execution modes, timed and with outputs saved.

params:
  modes   list of runner/modes.py modes: "eager" | "graph" | "compile[:RECIPE][+graph]"
          (default ["eager", "graph"])
  flops   bool: also count the step's linear + attention FLOPs (for the roofline row)
  compile_backend  torch.compile backend of the compile modes (default inductor)

Modes run in that order on ONE built model (runner/modes.ModeWalk: compiling changes the model in
place; a recipe switch undoes the last one). Each mode's outputs are saved for a correctness
comparison against the reference done in a separate clean process (runner/kinds/compare.py), never
here.

A mode that fails is reported and the others still run. A CUDA fault (an illegal memory access)
leaves the process's CUDA context unusable: the modes after it are reported as not run, and the
job still returns what the modes before it measured, so the bot keeps those rows.
"""
from __future__ import annotations

import time

import torch

from runner import env as envmod
from runner import peaks
from runner.harness import prepare_first_step, step_passes, tensor_digest
from runner.job import parse_mode
from runner.errors import error_line
from runner.modes import ModeWalk, compile_report, cuda_usable
from runner.profiler import count_flops
from runner.timing import time_interleaved

def run(job) -> dict:
    modes = job.params.get("modes", ["eager", "graph"])
    for m in modes:
        parse_mode(m)  # an unknown mode fails the job before the model is built
    built, step, shape, out_dir = prepare_first_step(job)
    seed = job.seeds[0]
    passes = step_passes(job.workload)
    result: dict = {"ok": True, "device": "cuda" if job.device.startswith("cuda") else "cpu", "passes": passes,
                    "shape": shape, "seed": seed, "modes": {}}
    if job.params.get("flops"):
        result["flops"] = count_flops(step)
        result["peaks"] = peaks.measure(job.device, built.dtype, fp8=True, sustained=True)  # the floor rows
    walk = ModeWalk(built.model, step, job.device, job.warmup, backend=job.params.get("compile_backend") or "inductor")
    for i, mode in enumerate(modes):
        entry: dict = {}
        t0 = time.monotonic()
        try:
            fn = walk.callable(mode)
            outs = fn()  # the first call: compilation / capture warm-up happen here
            entry["first_call_s"] = round(time.monotonic() - t0, 2)
            if walk.how:
                entry["compiled"], entry["graphs"] = walk.how, compile_report(top=1)
            w0 = time.time()
            timed = time_interleaved({mode: fn}, job.device, warmup=job.warmup, iters=job.iters)[mode]
            # wall-clock span of the timed steps, to join with a clock/power log taken beside the run
            # (benchmarks/gpu_bench.sh CLOCKS=1, benchmarks/clocks.py)
            entry["window"] = [round(w0, 3), round(time.time(), 3)]
            entry["latency"] = timed.to_json()
            entry["per_pass_ms"] = timed.median_ms / passes
            outs = fn()  # graph modes: the static outputs the replay just rewrote
            fname = out_dir / f"bench_{mode.replace('+', '_').replace(':', '-')}.pt"
            torch.save({k: v.detach().to("cpu") for k, v in outs.items()}, fname)
            entry["outputs"] = {"file": str(fname), "digests": {k: tensor_digest(v) for k, v in outs.items()}}
        except Exception as e:  # noqa: BLE001 - a mode that fails is reported, the others still run
            err = error_line(e)
            result["modes"][mode] = {"error": err}
            if not cuda_usable(job.device):
                for later in modes[i + 1:]:
                    result["modes"][later] = {"error": f"not run: the CUDA context was lost in {mode} ({err[:120]})"}
                break
            continue
        result["modes"][mode] = entry
    try:
        result["env"] = envmod.capture(job.device, job.engine_sha, built.engine_file)
    except Exception as e:  # noqa: BLE001 - after a CUDA fault the device cannot be asked; the rows stand
        result["env"] = {"device_kind": result["device"], "engine_sha": job.engine_sha,
                         "error": f"environment not captured: {type(e).__name__}"}
    return result

