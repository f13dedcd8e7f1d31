"""Kernel test contract for scaled_add.py (make_inputs, reference, kernel, SHAPES, CASES)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scaled_add as op  # noqa: E402

SHAPES = [(1,), (37,), (1000,)]
CASES = [("float32", 1e-6, 1e-6), ("bfloat16", 1e-2, 1e-2)]
BENCH_SHAPES = [(1 << 24,), (4096 * 3072,)]


def make_inputs(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype)
    return (torch.randn(*shape, generator=g).to(device, dt), torch.randn(*shape, generator=g).to(device, dt), 0.75)


def reference(x, y, alpha):
    return x + alpha * y


def kernel_with_config(x, y, alpha, **config):
    return op.scaled_add(x, y, alpha, **config)


def kernel(x, y, alpha):
    return op.scaled_add(x, y, alpha)


def kernel_path() -> str:
    return op.last_path()
