"""Make one step's forward inputs from the workload's declaration (runner/input_spec.py).

Seeded inputs are drawn from one CPU generator in declaration order, so they are identical on
every device, then moved to the job's device and dtype. Under true CFG the conditional pass is
drawn first; the unconditional pass then draws its `cfg: redraw` inputs, in declaration order.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runner import input_spec
from runner.input_spec import Env, InputDecl, InputSpec

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


class InputError(Exception):
    """A declaration that cannot be made at this shape (named by its workload key)."""


@dataclass
class HookContext:
    """What a hook function receives: it returns the input's value for this pass."""
    dims: dict[str, Any]
    config: dict[str, Any]
    step: dict[str, Any]
    generator: torch.Generator  # the step's CPU generator: draw from it to stay seeded
    device: str
    dtype: torch.dtype  # the model's dtype on this device
    pass_index: int  # 0: conditional, 1: unconditional (true CFG)
    name: str  # the forward keyword being made


def spec_of(workload: dict) -> InputSpec:
    return input_spec.from_json(workload["inputs"])


def make_passes(workload: dict, preset: str, shape: dict, seed: int, device: str, dtype: torch.dtype) -> list[dict]:
    """One kwargs dict per forward pass of the step."""
    spec = spec_of(workload)
    step = workload["step"]
    try:
        env = spec.env(shape, workload["presets"][preset]["config"], step)
        decls = spec.active(env)
        g = torch.Generator(device="cpu").manual_seed(seed)
        cond = {d.name: _make(spec, d, env, g, device, dtype, 0) for d in decls}
        if step["cfg"] != "true-cfg":
            return [cond]
        uncond = {}
        for d in decls:
            if d.cfg == "redraw":
                uncond[d.name] = _make(spec, d, env, g, device, dtype, 1)
            elif d.cfg == "zeros":
                v = cond[d.name]
                uncond[d.name] = torch.zeros_like(v) if isinstance(v, torch.Tensor) else v
            else:
                uncond[d.name] = cond[d.name]
        return [cond, uncond]
    except input_spec.SpecError as e:
        raise InputError(str(e)) from None


def _dtype(d: InputDecl, model_dtype: torch.dtype) -> torch.dtype:
    return model_dtype if d.dtype == "model" else TORCH_DTYPES[d.dtype]


def _make(spec: InputSpec, d: InputDecl, env: Env, g: torch.Generator, device: str, model_dtype, pass_index: int):
    dt = _dtype(d, model_dtype)
    if d.make == "randn":
        return torch.randn(*spec.shape_of(d, env), generator=g).to(device, dt)
    if d.make == "full":
        return torch.full(spec.shape_of(d, env), spec.value_of(d, env), dtype=dt, device=device)
    if d.make == "timestep":
        t = float(env.step["timestep"]) * float(env.step.get("timestep_scale", 1.0))
        return torch.full(spec.shape_of(d, env), t, dtype=dt, device=device)
    if d.make == "grid":
        axes = [torch.arange(n) for n in spec.grid_axes(d, env)]
        ids = torch.cartesian_prod(*axes) if len(axes) > 1 else axes[0][:, None]
        return ids.to(device, dt)
    if d.make == "literal":
        return spec.value_of(d, env)
    if d.make == "hook":
        fn = _hook(spec.hooks, d.function)
        return fn(HookContext(dict(env.dims), env.config, env.step, g, device, model_dtype, pass_index, d.name))
    raise InputError(f"inputs.forward.{d.name}.make: {d.make!r} is not made here")


@functools.lru_cache(maxsize=None)
def _hook_module(path: str):
    p = Path(path)
    if not p.is_file():
        raise InputError(f"hooks file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"optbot_workload_hooks_{abs(hash(path))}", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hook(path: str, name: str):
    fn = getattr(_hook_module(path), name, None)
    if not callable(fn):
        raise InputError(f"hooks file {path} has no function {name!r}")
    return fn


def combine(outputs: list[torch.Tensor], step: dict) -> dict[str, torch.Tensor]:
    """The step's outputs from its passes' outputs.

    combine: passes (default) judges each pass's output on its own ("noise_pred", or "cond" and
    "uncond" under true CFG): the CFG arithmetic is identical for base and candidate and amplifies
    the cond-uncond difference (4x on seeded random weights), so judging it would judge the
    pipeline's amplification, not the candidate. combine: guided returns the guided prediction
    uncond + guidance_scale * (cond - uncond), for workloads that want it judged as served."""
    if len(outputs) == 1:
        return {"noise_pred": outputs[0]}
    cond, uncond = outputs
    if step.get("combine", "passes") == "guided":
        return {"noise_pred": uncond + float(step["guidance_scale"]) * (cond - uncond)}
    return {"cond": cond, "uncond": uncond}
