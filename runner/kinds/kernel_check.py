"""Check a candidate's kernel against its reference on randomized inputs (docs/validate.md).

The kernel test module (a file in the candidate's engine worktree, or a kernel_store entry's
test_<op>.py) defines:
  SHAPES                              list of shape tuples; shape[0] is M, the row count
  make_inputs(shape, dtype, device, seed) -> tuple of tensors   (fresh random data, never zeros)
  reference(*inputs) -> tensor | tuple of tensors              (plain torch)
  kernel(*inputs)    -> tensor | tuple of tensors              (the candidate's kernel)
and optionally DTYPES (dtype names; default: the job's dtype) and TOLERANCE
({dtype name: (atol, rtol)}; default: the workload's tolerance for that dtype).

We add M=1 and an odd M (37) to the first shape, draw fresh seeds (job.seeds), and run the kernel
under PoisonEmpty with a poisoned allocator, checking outputs (finite, atol + rtol) and that the
inputs are unmodified. On CUDA the kernel and its reference are also timed with
runner/timing.time_interleaved, reference twice (A/A) for the noise, at one shape (BENCH_SHAPES[0] where
the module has it) through bench_kernel / bench_reference where it has them (kernel_test.bench_subject). On CPU, Triton kernels run
with TRITON_INTERPRET=1 and get no speed figure ("speed needs a GPU").

job.params: {"tests": [PATH, ...], "tolerance": {dtype: {"atol", "rtol"}}}.
"""
from __future__ import annotations

import faulthandler
import importlib.util
import os
import sys
from pathlib import Path

import torch

from runner import env as envmod
from runner.harness import DTYPES
from runner.job import split_precision
from runner.kinds.kernel_test import bench_subject
from runner.kinds.validate_step import input_changes
from runner.poison import PoisonEmpty, poison_allocator
from runner.timing import time_interleaved

ODD_M = 37


def _load(path: str):
    name = "optbot_kernel_test_" + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    for attr in ("SHAPES", "make_inputs", "reference", "kernel"):
        if not hasattr(mod, attr):
            raise ValueError(f"kernel test {path} lacks {attr!r} (see docs/validate.md: the kernel test contract)")
    return mod


def shapes_for(mod) -> list[tuple]:
    shapes = [tuple(s) for s in mod.SHAPES]
    first = shapes[0]
    for m in (1, ODD_M):
        s = (m, *first[1:])
        if s not in shapes:
            shapes.append(s)
    return shapes


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _compare(ref, out, atol: float, rtol: float) -> tuple[bool, str, dict]:
    ref, out = _as_tuple(ref), _as_tuple(out)
    if len(ref) != len(out):
        return False, f"{len(out)} outputs, reference has {len(ref)}", {}
    worst: dict = {}
    for i, (r, o) in enumerate(zip(ref, out)):
        if not isinstance(o, torch.Tensor) or o.shape != r.shape:
            return False, f"output {i}: shape {getattr(o, 'shape', type(o))} != reference {tuple(r.shape)}", {}
        r64, o64 = r.detach().double().cpu().flatten(), o.detach().double().cpu().flatten()
        bad_nf = ~torch.isfinite(o64)
        if bool(bad_nf.any()):
            j = int(bad_nf.nonzero()[0])
            at = [int(k) for k in torch.unravel_index(torch.tensor(j), tuple(r.shape))]
            return False, f"output {i}: {int(bad_nf.sum())} NaN/Inf elements (first at {at})", {}
        diff = (o64 - r64).abs()
        excess = diff - (atol + rtol * r64.abs())
        j = int(excess.argmax())
        at = [int(k) for k in torch.unravel_index(torch.tensor(j), tuple(r.shape))]
        m = int(diff.argmax())
        info = {"max_abs": float(diff[m]), "at": [int(k) for k in torch.unravel_index(torch.tensor(m), tuple(r.shape))]}
        if not worst or info["max_abs"] > worst["max_abs"]:
            worst = info
        if float(excess[j]) > 0:
            return False, (f"output {i}: {int((excess > 0).sum())} elements exceed atol {atol:g} + rtol {rtol:g}; "
                           f"worst at {at}: kernel {float(o64[j]):.6g} vs reference {float(r64[j]):.6g}"), info
    return True, f"max abs {worst.get('max_abs', 0):.3g} at {worst.get('at')}", worst


def run(job) -> dict:
    faulthandler.enable()  # a segfault in candidate code leaves its Python stack in the log tail
    if not job.device.startswith("cuda"):
        os.environ["TRITON_INTERPRET"] = "1"  # before any test module imports triton
    p = job.params
    tests = []
    for path in p["tests"]:
        mod = _load(path)
        dtypes = list(getattr(mod, "DTYPES", None) or [split_precision(job.dtype)[0]])
        tolmap = getattr(mod, "TOLERANCE", {}) or {}
        cases = []
        for dname in dtypes:
            dtype = DTYPES[dname]
            if dname in tolmap:
                atol, rtol = tolmap[dname]
            else:
                t = (p.get("tolerance") or {}).get(dname) or {"atol": 1e-4, "rtol": 1e-3}
                atol, rtol = t["atol"], t["rtol"]
            for shape in shapes_for(mod):
                for seed in job.seeds:
                    inputs = _as_tuple(mod.make_inputs(shape, dtype, job.device, seed))
                    before = {f"input{i}": x.detach().cpu().clone() for i, x in enumerate(inputs)
                              if isinstance(x, torch.Tensor)}
                    ref = mod.reference(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
                    poison_allocator(job.device, max_bytes=1 << 30)
                    with PoisonEmpty():
                        out = mod.kernel(*inputs)
                    if job.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    changed = input_changes(before, {f"input{i}": x for i, x in enumerate(inputs)
                                                     if isinstance(x, torch.Tensor)})
                    ok, reason, info = _compare(ref, out, atol, rtol)
                    if changed:
                        ok = False
                        reason = f"modified input {changed[0]['input']} in place ({changed[0].get('changed', '?')} elements)"
                    cases.append({"shape": list(shape), "dtype": dname, "seed": seed, "ok": ok, "reason": reason, **info})
        entry = {"test": path, "name": getattr(mod, "NAME", Path(path).stem), "cases": cases,
                 "ok": all(c["ok"] for c in cases)}
        if job.device.startswith("cuda") and entry["ok"]:
            # one shape, the first the module benchmarks at (the full model's where it says), timing the op
            # as the engine calls it: SHAPES[0] timed launches (0.19 ms for [1, 1, 64] on an H100,
            # 2026-12-07) and kernel() a quantization kernel's dequantization too
            bench_shapes, kern, ref = bench_subject(mod)
            dtype = DTYPES[dtypes[0]]
            inputs = _as_tuple(mod.make_inputs(bench_shapes[0], dtype, job.device, job.seeds[0]))
            t = time_interleaved({"reference": lambda: ref(*inputs),
                                  "reference_aa": lambda: ref(*inputs),
                                  "kernel": lambda: kern(*inputs)}, job.device,
                                 warmup=job.warmup, iters=job.iters)
            entry["micro"] = {k: (v if isinstance(v, str) else v.to_json()) for k, v in t.items()}
            entry["micro"]["shape"] = list(bench_shapes[0])
        else:
            entry["micro"] = None if job.device.startswith("cuda") else "speed needs a GPU"
        tests.append(entry)
    return {"ok": True, "tests": tests, "env": envmod.capture(job.device, job.engine_sha)}
