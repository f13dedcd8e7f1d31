"""Kernel test for norm_modulate.py (the kernel test contract, docs/store.md), gated-residual variant:
inputs (h, gate, y, shift, scale, eps) -> [h + gate * y, (1 + scale) * layer_norm(h') + shift] stacked.
Shapes (B, S, D): M=1, odd S and D, per-token and broadcast modulation.
test_norm_modulate_plain covers norm_modulate (no residual)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import norm_modulate as op  # noqa: E402

SHAPES = [(1, 1, 64), (2, 37, 96), (1, 19, 100), (1, 64, 256)]
CASES = [("float32", 1e-5, 1e-5), ("bfloat16", 3e-2, 2e-2)]
BENCH_SHAPES = [(1, 4096, 6144), (1, 512, 6144)]  # FLUX.2 full: image / text tokens x dim


def make_inputs(shape, dtype, device, seed):
    B, S, D = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    h = (2.0 * torch.randn(B, S, D, generator=g) + 0.5).to(device, dt)
    y = torch.randn(B, S, D, generator=g).to(device, dt)
    mod = (0.5 * torch.randn(B, 1, 3 * D, generator=g)).to(device, dt)  # like Flux2Modulation.split chunks
    shift, scale, gate = mod.chunk(3, dim=-1)  # [B, 1, D] strided views
    return h, gate, y, shift, scale, 1e-6


def reference(*inputs):
    return torch.stack(op.reference_residual(*inputs))


def kernel(*inputs):
    return torch.stack(op.gate_residual_norm_modulate(*inputs))


def kernel_path() -> str:
    return op.last_path()


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_gate_residual_norm_modulate(shape, dtype, atol, rtol):
    inputs = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", 0)
    torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_norm_modulate_plain(shape, dtype, atol, rtol):
    h, _, _, shift, scale, eps = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", 1)
    torch.testing.assert_close(op.norm_modulate(h, shift, scale, eps), op.reference(h, shift, scale, eps), atol=atol, rtol=rtol)
    assert op.last_path() == ("triton" if op._use_triton(h) else "torch")
