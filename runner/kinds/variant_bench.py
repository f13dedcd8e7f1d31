"""Variant search worker: check (and on a GPU, time) a slice of a Triton kernel's config space.

Job.params:
  test_module   path of a kernel test module (the kernel test contract, docs/store.md):
                make_inputs(shape, dtype, device, seed), reference(*inputs), SHAPES, CASES
                [(dtype, atol, rtol)], optionally BENCH_SHAPES (used for timing on GPU) and
                kernel_path() (must say "triton" after a call, proving the Triton path ran); the
                config is passed as keyword arguments to kernel_with_config(*inputs, **config) if the
                module defines it, else to kernel(*inputs, **config) if kernel takes them, else to the
                one public function of the kernel sources beside it that takes every config key, else
                as the defaults of the one kernel-source function with every config key as a defaulted
                parameter, for a call of kernel(*inputs)
  configs       list of config dicts (names -> values) this worker checks
  shapes        optional list of shapes (default: SHAPES; on GPU timing uses BENCH_SHAPES if given)
Job.seeds are the input seeds of the correctness check; Job.device picks the device (cuda:N).

On CPU, Triton kernels run under TRITON_INTERPRET=1 (set here before triton is imported): correctness
only, and the result says "speed needs a GPU". On CUDA every correct config is timed against the
reference with runner/timing.time_interleaved (the one timing routine), interleaved per shape.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from pathlib import Path

from runner.errors import error_line
from runner.job import Job, split_precision


def _load(path: str):
    p = Path(path).resolve()
    sys.path.insert(0, str(p.parent))  # the module imports its kernel from its own folder
    spec = importlib.util.spec_from_file_location(f"optbot_variant_{p.stem}", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kernel_source_functions(mod) -> list:
    """Functions defined by the kernel sources beside the test module (already imported by it)."""
    folder = Path(mod.__file__).resolve().parent
    out = []
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if m is mod or not f or Path(f).resolve().parent != folder:
            continue
        out += [obj for obj in vars(m).values() if inspect.isfunction(obj) and obj.__module__ == m.__name__]
    return out


def _defaulted(fn, keys: set[str]) -> bool:
    params = inspect.signature(fn).parameters
    return keys <= set(params) and all(params[k].default is not inspect.Parameter.empty for k in keys)


def _with_defaults(fn, kernel):
    """kernel(*inputs) with fn's defaults set to the config for the call: exactly what a committed
    config does (bot/generate/variants.write_config rewrites these defaults in the engine's copy),
    for wrappers whose config keywords the public entry points do not pass on (norm_modulate's
    _launch(num_warps=None))."""
    names = [p.name for p in inspect.signature(fn).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    tail = names[len(names) - len(fn.__defaults__ or ()):]  # the parameters __defaults__ belongs to

    def call(*inputs, **config):  # runs inside the timed region too: kept to a few dict lookups
        saved = fn.__defaults__, fn.__kwdefaults__
        if fn.__defaults__:
            fn.__defaults__ = tuple(config.get(n, d) for n, d in zip(tail, fn.__defaults__))
        if fn.__kwdefaults__:
            fn.__kwdefaults__ = {k: config.get(k, v) for k, v in fn.__kwdefaults__.items()}
        try:
            return kernel(*inputs)
        finally:
            fn.__defaults__, fn.__kwdefaults__ = saved
    return call


def _caller(mod, keys: set[str]):
    """What to call with (*inputs, **config): kernel_with_config; else kernel if it takes the config
    keywords; else the one public function of the kernel sources beside the test module whose
    parameters include every config key, e.g. swiglu(x, block_n=, num_warps=); else kernel(*inputs)
    with the defaults of the one kernel-source function (private too) that has every config key as a
    defaulted parameter set to the config."""
    fn = getattr(mod, "kernel_with_config", None)
    if fn is not None:
        return fn
    fn = getattr(mod, "kernel")
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) or keys <= set(params):
        return fn
    funcs = _kernel_source_functions(mod)
    found = [f for f in funcs if not f.__name__.startswith("_") and keys <= set(inspect.signature(f).parameters)]
    if len(found) == 1:
        return found[0]
    defaulted = [f for f in funcs if _defaulted(f, keys)]
    if not found and len(defaulted) == 1:
        return _with_defaults(defaulted[0], fn)
    raise TypeError(f"{mod.__file__}: kernel(*inputs) takes no config keywords {sorted(keys)}, "
                    f"{len(found)} public kernel-source functions take them all and {len(defaulted)} have them "
                    f"all as defaults; define kernel_with_config(*inputs, **config)")


def _label(cfg: dict) -> str:
    return ",".join(f"{k}={cfg[k]}" for k in sorted(cfg))


def cuda_index(device: str) -> int | None:
    """"cuda:1" -> 1; "cuda" (the job's one visible GPU) -> None."""
    _, _, idx = device.partition(":")
    return int(idx) if idx else None


def run(job: Job) -> dict:
    on_cuda = job.device.startswith("cuda")
    if not on_cuda:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from runner import env as envmod
    from runner.timing import time_interleaved

    mod = _load(job.params["test_module"])
    configs: list[dict] = job.params["configs"]
    call = _caller(mod, set().union(*(c.keys() for c in configs)) if configs else set())
    cases = [tuple(c) for c in mod.CASES]
    if not on_cuda:
        cases = [c for c in cases if c[0] == "float32"] or cases[:1]  # the interpreter: fp32 is what it checks well
    else:
        cases = [c for c in cases if c[0] == split_precision(job.dtype)[0]] or cases
        # bot/jobs.py pins a `cuda:N` job with CUDA_VISIBLE_DEVICES=N and hands it plain "cuda": only
        # an explicit index (a job run by hand) needs set_device, which refuses a device without one
        index = cuda_index(job.device)
        if index is not None:
            torch.cuda.set_device(index)
    shapes = [tuple(s) for s in (job.params.get("shapes") or mod.SHAPES)]
    rows = []
    good: dict[str, bool] = {}
    for cfg in configs:
        label = _label(cfg)
        ok, worst, reason = True, 0.0, "ok"
        for shape in shapes:
            for dtype, atol, rtol in cases:
                for seed in job.seeds:
                    inputs = mod.make_inputs(shape, dtype, job.device, seed)
                    try:
                        out = call(*inputs, **cfg)
                    except Exception as e:  # noqa: BLE001 - a config that fails to compile/launch is a result
                        ok, reason = False, error_line(e)
                        break
                    path = mod.kernel_path() if hasattr(mod, "kernel_path") else "triton"
                    if path != "triton":
                        ok, reason = False, f"the Triton path did not run (kernel_path() = {path!r})"
                        break
                    ref = mod.reference(*inputs)
                    err = (out.float() - ref.float()).abs()
                    bad = ~torch.isclose(out.float(), ref.float(), atol=atol, rtol=rtol)
                    worst = max(worst, float(err.max()) if err.numel() else 0.0)
                    if not torch.isfinite(out).all() or bad.any():
                        idx = tuple(int(i) for i in bad.nonzero()[0]) if bad.any() else ()
                        ok, reason = False, (f"shape {shape} {dtype} seed {seed}: max abs err {worst:.3g} "
                                             f"(atol {atol}, rtol {rtol}) first at {idx}")
                        break
                if not ok:
                    break
            if not ok:
                break
        good[label] = ok
        rows.append({"config": cfg, "label": label, "correct": ok, "max_abs_err": worst, "reason": reason})
    timings: dict[str, dict] = {}
    note = ""
    if on_cuda:
        bench_shapes = [tuple(s) for s in (job.params.get("shapes") or getattr(mod, "BENCH_SHAPES", None) or mod.SHAPES)]
        dtype = cases[0][0]
        for shape in bench_shapes:
            inputs = mod.make_inputs(shape, dtype, job.device, job.seeds[0])
            fns = {"reference": (lambda inp=inputs: mod.reference(*inp))}
            for cfg in configs:
                if good[_label(cfg)]:
                    fns[_label(cfg)] = (lambda inp=inputs, c=cfg: call(*inp, **c))
            res = time_interleaved(fns, job.device, warmup=max(job.warmup, 3), iters=max(job.iters, 20))
            timings[str(list(shape))] = {k: (v.to_json() if not isinstance(v, str) else v) for k, v in res.items()}
    else:
        note = "speed needs a GPU: configs were checked for correctness under TRITON_INTERPRET=1 on CPU, not timed"
    return {"ok": True, "device": job.device, "dtype": cases[0][0], "rows": rows, "timings": timings, "note": note,
            "shapes": [list(s) for s in shapes], "env": envmod.capture(job.device, job.engine_sha, "")}
