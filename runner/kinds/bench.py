"""The bench job: one engine worktree, several execution modes, timed and with outputs saved.

params:
  modes   list of "eager" | "graph" | "compile" | "compile+graph" (default ["eager", "graph"])
  flops   bool: also count the step's linear + attention FLOPs (for the roofline row)

Modes run in that order on ONE built model, because `compile` changes the model in place:
- eager:   the step as the engine runs it;
- graph:   the eager step captured once into a CUDA graph and replayed (capture failure is reported);
- compile: torch.compile of the repeated blocks (diffusers' compile_repeated_blocks: "regional"
           compilation, the way diffusers recommends for DiTs), else of the whole model;
- compile+graph: the compiled step captured into a CUDA graph.
Each mode's outputs are saved for a correctness comparison against the reference done in a
separate clean process (runner/kinds/compare.py), never here.

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
from runner.profiler import count_flops
from runner.timing import capture_graph, time_interleaved

MODES = ("eager", "graph", "compile", "compile+graph")


def _compile(model: torch.nn.Module) -> str:
    if hasattr(model, "compile_repeated_blocks") and getattr(model, "_repeated_blocks", None):
        model.compile_repeated_blocks(fullgraph=False)
        return "regional (compile_repeated_blocks)"
    model.compile()
    return "whole model"


def run(job) -> dict:
    modes = job.params.get("modes", ["eager", "graph"])
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown bench modes {bad}; known: {MODES}")
    built, step, shape, out_dir = prepare_first_step(job)
    seed = job.seeds[0]
    passes = step_passes(job.workload)
    result: dict = {"ok": True, "device": "cuda" if job.device.startswith("cuda") else "cpu", "passes": passes,
                    "shape": shape, "seed": seed, "modes": {}}
    if job.params.get("flops"):
        result["flops"] = count_flops(step)
        result["peaks"] = peaks.measure(job.device, built.dtype)
    compiled_how = None
    for i, mode in enumerate(modes):
        entry: dict = {}
        t0 = time.monotonic()
        try:
            if mode.startswith("compile") and compiled_how is None:
                compiled_how = _compile(built.model)
            fn = step
            if mode.endswith("graph"):
                if not job.device.startswith("cuda"):
                    raise RuntimeError("CUDA-graph mode needs a CUDA device")
                fn = capture_graph(step, warmup=job.warmup)
            outs = fn()  # the first call: compilation / capture warm-up happen here
            entry["first_call_s"] = round(time.monotonic() - t0, 2)
            if compiled_how and mode.startswith("compile"):
                entry["compiled"] = compiled_how
            timed = time_interleaved({mode: fn}, job.device, warmup=job.warmup, iters=job.iters)[mode]
            entry["latency"] = timed.to_json()
            entry["per_pass_ms"] = timed.median_ms / passes
            outs = fn()  # graph modes: the static outputs the replay just rewrote
            fname = out_dir / f"bench_{mode.replace('+', '_')}.pt"
            torch.save({k: v.detach().to("cpu") for k, v in outs.items()}, fname)
            entry["outputs"] = {"file": str(fname), "digests": {k: tensor_digest(v) for k, v in outs.items()}}
        except Exception as e:  # noqa: BLE001 - a mode that fails is reported, the others still run
            err = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            result["modes"][mode] = {"error": err}
            if not _cuda_usable(job.device):
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


def _cuda_usable(device: str) -> bool:
    """Whether the CUDA context survived the last error (a fault is sticky: every later call fails)."""
    if not device.startswith("cuda"):
        return True
    try:
        torch.cuda.synchronize()
        torch.empty(1, device=device).add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False
