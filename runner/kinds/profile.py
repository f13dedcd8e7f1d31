"""The profile job: time the step, count its FLOPs, profile it, measure the ceilings, and put the
roofline figures together.

params:
  mode   the production mode the step is timed and profiled in (runner/modes.py; default eager). Under
         a compile mode the kernels are inductor's (its fused Triton kernels, the extern GEMMs), each
         attributed to the compiled block as a whole (runner/profiler.attach_module_ranges); a graph
         mode's replay runs no module code, so its kernels are attributed to no module.
"""
from __future__ import annotations

from runner import env as envmod
from runner import peaks
from runner.harness import prepare_first_step, step_passes
from runner.job import split_precision
from runner.modes import ModeWalk, compile_report
from runner.profiler import count_flops, profile_step
from runner.roofline import compute_floor
from runner.timing import time_fn


def run(job) -> dict:
    built, step, shape, out_dir = prepare_first_step(job)
    mode = job.params.get("mode", "eager")
    flops = count_flops(step)  # of the eager step: the same work in every mode
    walk = ModeWalk(built.model, step, job.device, job.warmup)
    timed = walk.callable(mode)
    latency = time_fn(timed, job.device, warmup=job.warmup, iters=job.iters)
    prof = profile_step(built.model, timed, job.device, out_dir / "trace.json.gz")
    fp8 = split_precision(job.dtype)[1] == "fp8"  # FP8 linear layers: GEMMs against the FP8 ceiling
    ceil = peaks.measure(job.device, built.dtype, fp8=fp8)
    passes = step_passes(job.workload)
    cats = prof["categories"]
    floor_ms, floor_basis = compute_floor(flops, ceil, fp8=fp8)
    if floor_ms is None:  # no FP8 ceiling on this device: the matmul one, said so
        floor_ms, basis = compute_floor(flops, ceil)
        floor_basis = f"{floor_basis}; {basis}"
    gemm_peak = (ceil.get("fp8_matmul_tflops") or ceil["matmul_tflops"]) if fp8 else ceil["matmul_tflops"]
    bw = ceil["copy_gbps"] * 1e9
    mem_ms = sum(cats[c] for c in ("normalization", "elementwise", "copy", "quantization"))
    mem_bytes = sum(prof["memory_bytes"].values())
    roofline = {
        "peak_matmul_tflops": ceil["matmul_tflops"],
        "peak_copy_gbps": ceil["copy_gbps"],
        "linear_tflop": flops["linear"] / 1e12,
        "attention_tflop": flops["attention"] / 1e12,
        # the floor of the step if every FLOP ran at the measured matmul rate (FP8 linear: its rate)
        "compute_floor_ms": floor_ms,
        "compute_floor_basis": floor_basis,
        "gemm_peak_tflops": gemm_peak,
        "gemm_tflops_achieved": flops["linear"] / (cats["gemm"] * 1e-3) / 1e12 if cats["gemm"] else None,
        "attention_tflops_achieved": flops["attention"] / (cats["attention"] * 1e-3) / 1e12 if cats["attention"] else None,
        "memory_bound_gb": mem_bytes / 1e9,
        "memory_bound_floor_ms": mem_bytes / bw * 1e3,
        "memory_bound_gbps_achieved": mem_bytes / (mem_ms * 1e-3) / 1e9 if mem_ms else None,
        "memory_bound_basis": "estimated from op shapes",
    }
    if mode.startswith("compile"):
        # inductor's fused kernels run under no aten op, so they carry no shapes: the bytes are those of
        # the aten ops left (an H100 FP8 profile said "~0 GB", 2026-12-06), and no rate follows from them
        roofline.update(memory_bound_basis="op shapes of the aten ops left; inductor's kernels carry none: a lower bound",
                        memory_bound_gbps_achieved=None)
    roofline["gemm_pct_of_peak"] = _pct(roofline["gemm_tflops_achieved"], gemm_peak)
    roofline["attention_pct_of_peak"] = _pct(roofline["attention_tflops_achieved"], ceil["matmul_tflops"])
    roofline["memory_bound_pct_of_peak"] = _pct(roofline["memory_bound_gbps_achieved"], ceil["copy_gbps"])
    is_cuda = job.device.startswith("cuda")
    return {
        "ok": True,
        "device": "cuda" if is_cuda else "cpu",
        # total_ms is the *unprofiled* step latency (median): the profiler's own overhead inflates
        # the profiled span of launch-heavy steps (Qwen-Image: 12k launches) and must not count.
        "total_ms": latency.median_ms,
        # device idle in an unprofiled step ~ latency minus the kernels' busy time (GPU only)
        "idle_ms": round(max(0.0, latency.median_ms - prof["busy_ms"]), 4) if is_cuda else None,
        "shape": shape,
        "passes": passes,
        "latency": latency.to_json(),
        "step_ms": latency.median_ms,
        "per_pass_ms": latency.median_ms / passes,
        **prof,
        "flops": flops,
        "peaks": ceil,
        "roofline": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in roofline.items()},
        "params": sum(p.numel() for p in built.model.parameters()),
        "mode": mode,
        "compiled": walk.how,
        "compile_report": compile_report() if walk.recipe else None,  # graphs and graph breaks
        "trace": str(out_dir / "trace.json.gz"),
        "env": envmod.capture(job.device, job.engine_sha, built.engine_file),
    }


def _pct(x, peak):
    return round(100.0 * x / peak, 1) if x and peak else None
