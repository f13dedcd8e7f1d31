"""Kernel test job: a kernel against its torch reference on randomized inputs, and on CUDA a
microbenchmark of the two, A/B interleaved.

It imports a kernel_store entry's test module, which follows the kernel test contract (docs/store.md):
    make_inputs(shape, dtype, device, seed) -> tuple   fresh random inputs, never zeros
    reference(*inputs) -> Tensor                       the torch reference
    kernel(*inputs) -> Tensor                          the Triton kernel (through its dispatching wrapper)
    SHAPES                                             include M=1 and odd sizes
    CASES                                              [(dtype, atol, rtol), ...]
    kernel_path() -> "triton" | "torch"                optional: which path the last kernel() call took
    BENCH_SHAPES                                       optional: shapes for the GPU microbenchmark
    MODE_SHAPES                                        optional: shapes the compile modes check (default
                                                       SHAPES); include the workload's real size: an
                                                       over-read past a small buffer lands in memory the
                                                       allocator owns and goes unseen

params:
    test_file     absolute path of test_<op>.py (its folder goes first on sys.path)
    seeds         input seeds per (shape, case) (default [0, 1, 2])
    interpret     on CPU, run Triton kernels in the interpreter (TRITON_INTERPRET=1; default true)
    require_triton  fail a case whose kernel() did not take the Triton path (default: true when the
                  kernel can run Triton: CUDA, or CPU with interpret)
    bench         on CUDA, time kernel vs reference (default true on CUDA; never on CPU)
    bench_iters   timed trials per callable (default 50)
    bench_compiled  also time the reference compiled by inductor (torch.compile), the bar a kernel
                  must beat to be worth its place under compile (default true)
    modes         the production modes each (shape, dtype) is also checked in, on its first seed
                  (default on CUDA: compile and compile+graph; on CPU: none). compile is
                  torch.compile(kernel, fullgraph=True): a graph break fails the case. compile+graph
                  is that compiled call warmed up on a side stream and captured into a CUDA graph, as
                  `optbot bench` and the validator capture a step, then replayed.
    mode_shapes   shapes for the modes instead of the module's MODE_SHAPES (tests on CPU: the
                  interpreter at a full model's size takes minutes)

Result: {"ok", "passed", "cases": [{mode, shape, dtype, seed, atol, rtol, max_abs, max_rel, where, path,
         passed, reason}], "micro": [{shape, dtype, kernel, reference, reference_aa, reference_compiled,
         speedup (reference / kernel), vs_compiled (compiled reference / kernel), noise}] | null, "env"}.
A mode that crashes (a CUDA fault poisons the process's context) fails its case with the error and
ends the mode checks; the eager cases before it stand.
A case passes when every element obeys |k - r| <= atol + rtol * |r|, nothing is NaN/Inf, the inputs
are unmodified after the call and (when required) the Triton path ran.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from runner.errors import error_line
from runner.job import Job


def _load(test_file: Path):
    sys.path.insert(0, str(test_file.parent))
    spec = importlib.util.spec_from_file_location(f"optbot_kernel_test_{test_file.stem}", test_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("make_inputs", "reference", "kernel", "SHAPES", "CASES"):
        if not hasattr(mod, name):
            raise AttributeError(f"{test_file}: the kernel test contract needs {name!r} (docs/store.md)")
    return mod


def compare(out, ref, atol: float, rtol: float) -> dict:
    """Max abs/rel error and where: the numbers a reason is made of."""
    import torch

    if out.shape != ref.shape:
        return {"passed": False, "reason": f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}",
                "max_abs": None, "max_rel": None, "where": None}
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(o).all():
        idx = torch.nonzero(~torch.isfinite(o))[0].tolist()
        return {"passed": False, "reason": f"non-finite output at {idx}", "max_abs": None, "max_rel": None, "where": idx}
    diff = (o - r).abs()
    rel = diff / r.abs().clamp_min(1e-12)
    flat = int(diff.argmax()) if diff.numel() else 0
    where = [int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)] if diff.numel() else []
    bad = diff > atol + rtol * r.abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    res = {"max_abs": max_abs, "max_rel": float(rel.max()) if diff.numel() else 0.0, "where": where,
           "passed": not bool(bad.any())}
    if bad.any():
        first = torch.nonzero(bad)[0].tolist()
        res["reason"] = (f"{int(bad.sum())} elements out of tolerance (atol {atol}, rtol {rtol}); first at {first}: "
                         f"got {float(o[tuple(first)]):.6g}, expected {float(r[tuple(first)]):.6g}; max abs {max_abs:.3g} at {where}")
    else:
        res["reason"] = f"max abs {max_abs:.3g} at {where}"
    return res


def bench_subject(mod) -> tuple[list[tuple], object, object]:
    """(shapes, kernel, reference) that a microbenchmark of this kernel test module times: its
    BENCH_SHAPES (the full model's) else SHAPES, and bench_kernel / bench_reference where it defines them
    (the op as the engine calls it; a quantization test's kernel() adds a dequantization) else kernel /
    reference. One rule for `store check`'s micro (this kind) and the validator's (kernel_check)."""
    shapes = [tuple(s) for s in getattr(mod, "BENCH_SHAPES", None) or mod.SHAPES]
    return shapes, getattr(mod, "bench_kernel", mod.kernel), getattr(mod, "bench_reference", mod.reference)


def _in_mode(kernel, inputs, mode: str, is_cuda: bool):
    """kernel(*inputs) as production runs it: compiled whole (a graph break raises), and on CUDA
    also captured into a CUDA graph after a warm-up on a side stream (what capture needs)."""
    import torch

    torch._dynamo.reset()  # a fresh compile per case: no cache limit, no guard from the last shape
    compiled = torch.compile(kernel, fullgraph=True)
    if mode == "compile":
        return compiled(*inputs)
    if mode != "compile+graph" or not is_cuda:
        raise ValueError(f"mode {mode!r}: expected compile, or compile+graph on CUDA")
    from runner.timing import capture_graph

    replay = capture_graph(lambda: compiled(*inputs), warmup=2)  # the bench's and validator's capture
    out = replay()
    torch.cuda.synchronize()
    return out


def run(job: Job) -> dict:
    p = job.params
    test_file = Path(p["test_file"]).resolve()
    is_cuda = job.device.startswith("cuda")
    if not is_cuda and p.get("interpret", True):
        os.environ["TRITON_INTERPRET"] = "1"  # before triton.jit decorates the kernel module
    import torch

    from runner import env as envmod
    from runner.timing import time_interleaved

    mod = _load(test_file)
    can_triton = is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    require_triton = p.get("require_triton", can_triton) and hasattr(mod, "kernel_path")
    seeds = p.get("seeds", [0, 1, 2])
    cases = []
    for shape in mod.SHAPES:
        for dtype, atol, rtol in mod.CASES:
            for seed in seeds:
                inputs = mod.make_inputs(shape, dtype, job.device, seed)
                before = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
                ref = mod.reference(*inputs)
                out = mod.kernel(*inputs)
                if is_cuda:
                    torch.cuda.synchronize()
                res = compare(out, ref, atol, rtol)
                path = mod.kernel_path() if hasattr(mod, "kernel_path") else None
                for i, (a, b) in enumerate(zip(inputs, before)):
                    if isinstance(a, torch.Tensor) and not torch.equal(a, b):
                        res["passed"], res["reason"] = False, f"input {i} was modified by the call"
                if require_triton and path != "triton":
                    res["passed"], res["reason"] = False, f"kernel() took the {path!r} path, not triton"
                cases.append({"mode": "eager", "shape": list(shape), "dtype": dtype, "seed": seed, "atol": atol,
                              "rtol": rtol, "path": path, **res})
    modes = p.get("modes", ["compile", "compile+graph"] if is_cuda else [])
    crashed = False
    mode_shapes = [tuple(x) for x in p["mode_shapes"]] if "mode_shapes" in p else getattr(mod, "MODE_SHAPES", mod.SHAPES)
    for shape in mode_shapes if modes else []:
        for dtype, atol, rtol in mod.CASES:
            for mode in modes:
                if crashed:
                    break
                inputs = mod.make_inputs(shape, dtype, job.device, seeds[0])
                ref = mod.reference(*inputs)
                try:
                    out = _in_mode(mod.kernel, inputs, mode, is_cuda)
                    res = compare(out, ref, atol, rtol)
                except Exception as e:  # noqa: BLE001 - the crash is the finding
                    crashed = is_cuda and "CUDA" in str(e)
                    res = {"passed": False, "max_abs": None, "max_rel": None, "where": None,
                           "reason": f"crashed under {mode}: {error_line(e)}"}
                path = mod.kernel_path() if hasattr(mod, "kernel_path") else None
                if res["passed"] and require_triton and path != "triton":
                    res["passed"], res["reason"] = False, f"kernel() under {mode} took the {path!r} path, not triton"
                cases.append({"mode": mode, "shape": list(shape), "dtype": dtype, "seed": seeds[0], "atol": atol,
                              "rtol": rtol, "path": path, **res})
    micro = None
    if is_cuda and p.get("bench", True) and not crashed:  # after a CUDA fault no microbenchmark can run
        micro = []
        bench_shapes, kern, ref = bench_subject(mod)
        for shape in bench_shapes:
            dtype = "bfloat16" if any(c[0] == "bfloat16" for c in mod.CASES) else mod.CASES[0][0]
            inputs = mod.make_inputs(shape, dtype, job.device, 0)
            # A/A pair (reference twice) estimates the noise; kernel and reference interleaved A/B.
            # The reference compiled by inductor is the other bar: under torch.compile a registered
            # op stands where inductor would have fused the same ops itself, so a kernel that does
            # not beat that costs the compiled model time (H200, 2026-12-02: both FLUX.2 stacks
            # slower than compile alone).
            # bench_kernel / bench_reference (bench_subject): a quantization kernel's dequantization would be
            # most of what is timed, and inductor would fuse it into the compiled reference
            fns = {"kernel": lambda: kern(*inputs), "reference": lambda: ref(*inputs),
                   "reference_aa": lambda: ref(*inputs)}
            if p.get("bench_compiled", True):
                torch._dynamo.reset()
                compiled_ref = torch.compile(ref)
                try:
                    compiled_ref(*inputs)
                    fns["reference_compiled"] = lambda: compiled_ref(*inputs)
                except Exception as e:  # noqa: BLE001 - a reference inductor cannot compile is a note
                    compile_error = error_line(e)
                else:
                    compile_error = None
            t = time_interleaved(fns, job.device, warmup=5, iters=int(p.get("bench_iters", 50)))
            row = {"shape": list(shape), "dtype": dtype, **{k: v.to_json() for k, v in t.items() if not isinstance(v, str)}}
            k_ms, r_ms, aa = t["kernel"].median_ms, t["reference"].median_ms, t["reference_aa"].median_ms
            row["speedup"] = r_ms / k_ms if k_ms > 0 else None
            row["noise"] = abs(aa - r_ms) / r_ms if r_ms > 0 else None
            if "reference_compiled" in t and not isinstance(t["reference_compiled"], str):
                c_ms = t["reference_compiled"].median_ms
                row["vs_compiled"] = c_ms / k_ms if k_ms > 0 else None
            elif p.get("bench_compiled", True):
                row["vs_compiled"], row["compile_error"] = None, compile_error
            micro.append(row)
    passed = bool(cases) and all(c["passed"] for c in cases)
    return {"ok": True, "passed": passed, "test_file": str(test_file), "device": job.device,
            "interpret": os.environ.get("TRITON_INTERPRET") == "1", "cases": cases, "micro": micro,
            "env": envmod.capture(job.device, job.engine_sha, str(test_file))}
