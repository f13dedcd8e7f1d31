"""Resolve what a command works on: workload + engine + ref + preset + device.

Every command that takes a workload goes through ``resolve_target`` (DESIGN decision 2), so the
options mean the same everywhere and their errors read the same.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from bot.engine import EngineCheckout, add_worktree, checkout_engine, resolve_source
from bot.errors import OptbotError
from bot.workload import Workload, load_workload
from runner.job import Job


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

    def job(self, kind: str, worktree: Path | str, out_dir: Path | str, *, shapes: list | None = None,
            engine_sha: str | None = None, **kw) -> Job:
        """A runner job of `kind` on the engine in `worktree` (its HEAD unless `engine_sha`), at the
        preset's shape unless `shapes` are given; `kw`: the other Job fields (seeds, iters, params...)."""
        import git

        shape = self.workload.preset(self.preset).shapes
        return Job(kind=kind, workload=self.workload.to_json(), preset=self.preset, device=self.device,
                   dtype=self.dtype, engine_root=self.engine_root(worktree),
                   engine_sha=engine_sha or git.Repo(worktree).head.commit.hexsha, model_class=self.model_class,
                   shapes=shapes or [shape.to_json()], out_dir=str(out_dir), **kw)


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """Asked of a child process: the bot itself never imports torch."""
    try:
        out = subprocess.run([sys.executable, "-c", "import torch, json; print(json.dumps(torch.cuda.is_available()))"],
                             capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1]) is True
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError, OSError):
        return False


def resolve_target(workload: str, engine: str | None, ref: str | None, preset: str | None, device: str | None) -> Target:
    wl = load_workload(workload)
    if device is None:
        device = "cuda" if cuda_available() else "cpu"
    elif device.startswith("cuda") and not cuda_available():
        raise OptbotError(f"--device {device}: no CUDA device is visible to torch on this machine")
    if preset is None:
        preset = "full" if device.startswith("cuda") else "tiny"
    wl.preset(preset)  # validates the name against the file
    name, source = resolve_source(wl.engine(None).source, engine, wl.engines)
    spec = wl.engines.get(name) or wl.engine(None)
    checkout = checkout_engine(source, ref or spec.ref, spec.import_root, name or spec.name)
    click.echo(f"engine {checkout.name}: {checkout.repo_path} @ {checkout.base_sha[:12]}", err=True)
    return Target(wl, checkout.name, spec.model_class, checkout, preset, device, wl.dtype_for(device))


def base_worktree(t: Target) -> Path:
    return add_worktree(t.checkout, f"base-{t.checkout.base_sha[:12]}")
