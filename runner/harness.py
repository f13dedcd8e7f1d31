"""The workload harness: build the engine's model at a preset, make seeded inputs, run one step.

It runs inside the runner child process, whose PYTHONPATH starts with the engine worktree's import
root, and records which file the model class was loaded from as proof of that.
"""
from __future__ import annotations

import hashlib
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from runner import engines
from runner import env as envmod
from runner import inputs, quant
from runner.job import Job, split_precision
from runner.timing import time_fn

# what Python says when a call's keywords do not fit the signature of a forward
_SIGNATURE_ERROR = re.compile(r"forward\(\) (got an unexpected keyword argument|missing \d+ required)")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HarnessError(Exception):
    """A failure with a kind the bot maps to a clear message (e.g. model-class-not-found)."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


def import_model_class(dotted: str, engine_root: str):
    mod_name, _, cls_name = dotted.rpartition(".")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise HarnessError("model-class-not-found", f"cannot import module {mod_name!r} of model class {dotted!r} "
                           f"from engine root {engine_root}: {e}") from None
    cls = getattr(mod, cls_name, None)
    if cls is None:
        raise HarnessError("model-class-not-found", f"module {mod_name!r} ({mod.__file__}) has no class {cls_name!r}")
    src = str(Path(mod.__file__).resolve())
    if engine_root and not src.startswith(str(Path(engine_root).resolve())):
        raise HarnessError("engine-not-first", f"{dotted} was loaded from {src}, not from the engine worktree "
                           f"{engine_root}; the import path is wrong")
    return cls, src


@dataclass
class Built:
    model: torch.nn.Module
    engine_file: str
    device: str
    dtype: torch.dtype
    adapter: object = engines.get("plain")  # runner/engines/<name>.py: how the engine is built and called


def build(job: Job) -> Built:
    adapter = engines.for_job(job)
    adapter.prepare(job)  # engine set-up that must precede its import (runner/engines/)
    cls, src = import_model_class(job.model_class, job.engine_root)
    preset = job.workload["presets"][job.preset]
    base, recipe = split_precision(job.dtype)
    dtype = DTYPES[base]
    try:
        model = adapter.build_model(cls, job, preset, dtype)
    except TypeError as e:
        if "__init__()" not in str(e):
            raise
        raise HarnessError("config-rejected", f"{cls.__name__} rejected the preset's config: {e}") from None
    if recipe:  # after the weights: a deployment quantizes the loaded model
        # an engine with an FP8 path of its own deploys it (the adapter's `quantize`), else the recipe
        own = getattr(adapter, "quantize", None)
        try:
            envmod.note("quant", own(model, recipe, job) if own else quant.apply(model, recipe, job.device))
        except quant.QuantError as e:
            raise HarnessError("quant", str(e)) from None
    return Built(model, src, job.device, dtype, adapter)


def make_step(built: Built, job: Job, shape: dict, seed: int) -> tuple[Callable[[], dict], list[dict]]:
    """A callable running one denoising step (all its passes) on fixed inputs, and those inputs."""
    wl = job.workload
    try:
        passes = inputs.make_passes(wl, job.preset, shape, seed, job.device, built.dtype)
    except inputs.InputError as e:
        raise HarnessError("inputs", str(e)) from None  # "key 'inputs....': ..." already
    # The adapter turns each pass's inputs into a call of its engine's forward (for SGLang: RoPE
    # tables and timestep scaling prepared here, once, as its pipeline does before the loop).
    with torch.inference_mode():
        calls = built.adapter.make_calls(built.model, passes, job)

    def step() -> dict:
        with torch.inference_mode():
            try:
                outs = [call() for call in calls]
            except TypeError as e:
                if not _SIGNATURE_ERROR.search(str(e)):
                    raise
                raise HarnessError("inputs", f"{type(built.model).__name__}.forward rejected the declared inputs "
                                             f"({', '.join(passes[0])}): {e}") from None
            return inputs.combine(outs, wl["step"])

    return step, passes


def step_passes(workload: dict) -> int:
    """Forward passes in one step: two under true CFG (conditional + unconditional), else one."""
    return 2 if workload["step"]["cfg"] == "true-cfg" else 1


def prepare_first_step(job: Job) -> tuple[Built, Callable[[], dict], dict, Path]:
    """What the single-shape kinds (profile, graph, bench) start from: the built model, the step on
    the job's first shape and seed, that shape, and the job's output folder (created)."""
    built = build(job)
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = job.shapes[0]
    step, _ = make_step(built, job, shape, job.seeds[0])
    return built, step, shape, out_dir


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def run_step_job(job: Job) -> dict:
    built = build(job)
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = []
    timing = None
    for si, shape in enumerate(job.shapes):
        for seed in job.seeds:
            step, _ = make_step(built, job, shape, seed)
            res = step()
            if si == 0 and seed == job.seeds[0] and job.iters > 0:
                timing = time_fn(step, job.device, warmup=job.warmup, iters=job.iters).to_json()
            record = {"shape": shape, "seed": seed, "tensors": {}}
            if job.save_outputs:
                fname = f"out_{si}_{seed}.pt"
                cpu = {k: v.detach().to("cpu") for k, v in res.items()}
                torch.save(cpu, out_dir / fname)
                record["file"] = str(out_dir / fname)
            for k, v in res.items():
                record["tensors"][k] = {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", ""),
                                        "digest": tensor_digest(v), "finite": bool(torch.isfinite(v).all())}
            outputs.append(record)
    passes = step_passes(job.workload)
    return {
        "ok": True,
        "latency": timing,
        "passes": passes,
        "per_pass_ms": (timing["median_ms"] / passes) if timing else None,
        "outputs": outputs,
        "params": sum(p.numel() for p in built.model.parameters()),
        "env": envmod.capture(job.device, job.engine_sha, built.engine_file),
    }
