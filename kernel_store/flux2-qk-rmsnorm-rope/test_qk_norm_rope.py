"""Kernel test for qk_norm_rope.py (the kernel test contract, docs/store.md):
reference(*inputs), kernel(*inputs), make_inputs(shape, dtype, device, seed), SHAPES, CASES.
Shapes are (B, S, H, D): M=1 (one token, one head), odd sequence lengths, a non-power-of-two
head dim, and x as a strided view of a fused projection output, as the engine passes it.
Run on CPU with TRITON_INTERPRET=1 to execute the Triton kernel in the interpreter.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qk_norm_rope as op  # noqa: E402

SHAPES = [(1, 1, 1, 32), (1, 37, 3, 32), (2, 17, 4, 48), (1, 64, 2, 128)]
CASES = [("float32", 1e-5, 1e-5), ("bfloat16", 2e-2, 2e-2)]


def make_inputs(shape, dtype, device, seed):
    B, S, H, D = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    qkv = (3.0 * torch.randn(B, S, 3 * H * D, generator=g)).to(device, dt)  # a fused projection output
    x = qkv[..., H * D:2 * H * D].unflatten(-1, (H, D))  # [B, S, H, D], a strided view (like attn key)
    weight = (1.0 + 0.1 * torch.randn(D, generator=g)).to(device, dt)
    pos = torch.arange(S, dtype=torch.float64)[:, None] * (1000.0 ** (-torch.arange(D // 2, dtype=torch.float64) / (D // 2)))
    cos = pos.cos().repeat_interleave(2, dim=1).float().to(device)  # [S, D]
    sin = pos.sin().repeat_interleave(2, dim=1).float().to(device)
    return x, weight, cos, sin, 1e-6


def reference(*inputs):
    return op.reference(*inputs)


def kernel(*inputs):
    return op.qk_rmsnorm_rope(*inputs)


def kernel_path() -> str:
    return op.last_path()


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(shape, dtype, atol, rtol):
    for seed in (0, 1):
        inputs = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", seed)
        x_before = inputs[0].clone()
        torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)
        assert torch.equal(inputs[0], x_before), "the kernel modified its input"
