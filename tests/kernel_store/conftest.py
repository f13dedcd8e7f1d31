"""Fixtures for the kernel store tests: a tiny-model runner for base and patched engines."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_TINY = Path(__file__).with_name("run_tiny.py")


def run_tiny(workload: str, engine_root: Path, out: Path, precision: str = "float32") -> dict:
    """One tiny-preset step (both workload shapes) in a child process at `precision` (float32, or
    float32+fp8: the FP8 recipe applied), Triton not interpreted (the entries run here have no
    kernels); returns outputs + kernel paths."""
    import torch

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(engine_root), str(ROOT)])
    proc = subprocess.run([sys.executable, str(RUN_TINY), workload, str(engine_root), str(out), precision],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads(Path(str(out) + ".json").read_text())
    return {"outputs": torch.load(str(out) + ".pt"), **meta}


@pytest.fixture(scope="session")
def tiny_runner():
    return run_tiny


@pytest.fixture(scope="session")
def tiny_base(base_worktree, tmp_path_factory):
    """Base-engine tiny outputs per workload and precision, computed once per session."""
    cache: dict[tuple[str, str], dict] = {}

    def get(workload: str, precision: str = "float32") -> dict:
        if (workload, precision) not in cache:
            d = tmp_path_factory.mktemp(f"base-{workload}-{precision.replace('+', '-')}")
            cache[workload, precision] = run_tiny(workload, base_worktree / "src", d / "out", precision=precision)
        return cache[workload, precision]

    return get


def assert_matches_base(got: dict, base: dict, tol) -> None:
    """Each output of a patched engine's step against the base engine's (same weights, inputs and
    precision): finite, within the workload's relative L2 bound and its atol/rtol."""
    import torch

    assert base.keys() == got.keys()
    for k, ref in base.items():
        out = got[k]
        assert torch.isfinite(out).all(), k
        rel = float((out - ref).norm() / ref.norm())
        assert rel <= tol.rel_l2, f"{k}: rel L2 {rel:.3g} from the base engine > {tol.rel_l2}"
        torch.testing.assert_close(out, ref, atol=tol.atol, rtol=tol.rtol)
