"""Resolve what a command works on: workload + engine + ref + preset + device.

Every command that takes a workload goes through ``resolve_target`` (DESIGN decision 2), so the
options mean the same everywhere and their errors read the same; every runner job of a target is
assembled by ``Target.job``.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import click
import git

from bot.engine import EngineCheckout, add_worktree, checkout_engine, resolve_source
from bot.errors import OptbotError
from bot.model_signature import check_inputs, read_signature
from bot.paths import REPO_ROOT
from bot.workload import Shape, Workload, load_workload
from runner.job import Job, split_precision


@dataclass(frozen=True)
class Target:
    workload: Workload
    engine_name: str
    model_class: str
    checkout: EngineCheckout
    preset: str
    device: str
    dtype: str

    def engine_root(self, worktree: Path) -> str:
        return str((Path(worktree) / self.checkout.import_root).resolve())

    def job(self, kind: str, worktree: Path | None, out_dir: Path, *, shapes: Iterable[Shape] | None = None,
            seeds: Iterable[int] = (0,), weight_seed: int = 0, warmup: int = 2, iters: int = 5,
            params: dict | None = None, engine_sha: str | None = None, save_outputs: bool = True,
            device: str | None = None) -> Job:
        """The runner job (runner/job.py) of `kind` on this target, for the engine checked out in `worktree`.

        worktree None: a job that imports no engine (compare); optbot's root stands in for the engine's.
        shapes: default the preset's shape. engine_sha: default the worktree's HEAD.
        device: another device for this one job (e.g. outputs compared on the CPU).
        """
        if shapes is None:
            shapes = [self.workload.preset(self.preset).shapes]
        if worktree is None:
            root, sha, model_class = str(REPO_ROOT), engine_sha or "", ""
        else:
            root, model_class = self.engine_root(worktree), self.model_class
            sha = engine_sha if engine_sha is not None else git.Repo(worktree).head.commit.hexsha
        return Job(kind=kind, workload=self.workload.to_json(), preset=self.preset, device=device or self.device,
                   dtype=self.dtype, engine_root=root, engine_sha=sha, model_class=model_class,
                   shapes=[s.to_json() for s in shapes], seeds=list(seeds), weight_seed=weight_seed, warmup=warmup,
                   iters=iters, out_dir=str(out_dir), save_outputs=save_outputs, params=dict(params or {}))


@functools.lru_cache(maxsize=1)
def cuda_device_count() -> int:
    """Asked of a child process: the bot itself never imports torch."""
    try:
        out = subprocess.run([sys.executable, "-c", "import torch, json; "
                              "print(json.dumps(torch.cuda.device_count() if torch.cuda.is_available() else 0))"],
                             capture_output=True, text=True, timeout=120)
        n = json.loads(out.stdout.strip().splitlines()[-1])
        return n if isinstance(n, int) else 0
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError, OSError):
        return 0


def cuda_available() -> bool:
    return cuda_device_count() > 0


def require_device(device: str) -> None:
    """--device cuda[:N] where torch sees no GPU (or fewer): the user's error, said before any work starts
    (a runner job would otherwise fail deep inside torch, once per entry or config)."""
    if not device.startswith("cuda"):
        return
    if not cuda_available():
        raise OptbotError(f"--device {device}: no CUDA device is visible to torch on this machine")
    idx = int(device[5:]) if device.startswith("cuda:") else 0
    n = cuda_device_count()
    if idx >= n:
        raise OptbotError(f"--device {device}: torch sees {n} CUDA device(s) on this machine (cuda:0..cuda:{n - 1})")


def run_label(workload: str, dtype: str) -> str:
    """The workload's name in branch names: with +RECIPE at a quantized precision, so that an FP8 run
    and an unquantized run of one base never share a branch or a pull request."""
    quant = split_precision(dtype)[1]
    return f"{workload}+{quant}" if quant else workload


def resolve_target(workload: str, engine: str | None, ref: str | None, preset: str | None, device: str | None,
                   quant: str | None = None) -> Target:
    wl = load_workload(workload)
    if device is None:
        device = "cuda" if cuda_available() else "cpu"
    require_device(device)
    if preset is None:
        preset = "full" if device.startswith("cuda") else "tiny"
    wl.preset(preset)  # validates the name against the file
    dtype = wl.precision_for(device, quant)  # before the engine: a missing tolerance is the file's error
    name, source = resolve_source(wl.engine(None).source, engine, wl.engines)
    spec = wl.engines.get(name) or wl.engine(None)
    checkout = checkout_engine(source, ref or spec.ref, spec.import_root, name or spec.name)
    click.echo(f"engine {checkout.name}: {checkout.repo_path} @ {checkout.base_sha[:12]}", err=True)
    t = Target(wl, checkout.name, spec.model_class, checkout, preset, device, dtype)
    check_model(t, spec.adapter)
    return t


def check_model(t: Target, adapter: str) -> None:
    """Before any runner starts: the declared inputs and every preset's config against the model
    class's signatures, read from the engine's source at the base commit (bot/model_signature.py).
    An adapter other than plain builds and calls its model its own way, so only plain is checked."""
    if adapter != "plain":
        return
    wt = base_worktree(t)
    key = f"engines.{t.engine_name}.model_class"
    sig = read_signature(wt, t.checkout.import_root, t.model_class, workload_file=t.workload.file, key=key)
    errors = check_inputs(sig, [d.name for d in t.workload.inputs.forward],
                          {p: list(pr.config) for p, pr in t.workload.presets.items()}, t.workload.file)
    if errors:
        raise OptbotError("\n".join(errors))


def base_worktree(t: Target) -> Path:
    return add_worktree(t.checkout, f"base-{t.checkout.base_sha[:12]}")
