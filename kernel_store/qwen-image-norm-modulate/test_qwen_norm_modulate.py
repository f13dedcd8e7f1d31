"""Kernel test for qwen_norm_modulate.py (the kernel test contract, docs/store.md):
inputs (x, shift, scale, eps) -> layer_norm(x) * (1 + scale) + shift.
Shapes (B, S, D): M=1, odd S and D, a batch of two; shift and scale are the [B, 1, D] strided views
QwenImageTransformerBlock._modulate makes (chunks of the [B, 3 * D] modulation parameters)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen_norm_modulate as op  # noqa: E402

SHAPES = [(1, 1, 64), (2, 37, 96), (1, 19, 100), (1, 64, 256)]
CASES = [("float32", 1e-5, 1e-5), ("bfloat16", 3e-2, 2e-2)]
BENCH_SHAPES = [(1, 4096, 3072), (1, 512, 3072)]  # Qwen-Image full: image / text tokens x dim
MODE_SHAPES = [(2, 37, 96), (1, 4096, 3072)]


def make_inputs(shape, dtype, device, seed):
    B, S, D = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    x = (2.0 * torch.randn(B, S, D, generator=g) + 0.5).to(device, dt)
    mod = (0.5 * torch.randn(B, 3 * D, generator=g)).to(device, dt)  # one of img_mod1 / img_mod2
    shift, scale, _gate = mod.chunk(3, dim=-1)
    return x, shift.unsqueeze(1), scale.unsqueeze(1), 1e-6


def reference(*inputs):
    return op.reference(*inputs)


def kernel(*inputs):
    return op.norm_modulate(*inputs)


def kernel_path() -> str:
    return op.last_path()


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_qwen_norm_modulate(shape, dtype, atol, rtol):
    inputs = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", 0)
    torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)
    assert kernel_path() == ("triton" if op._use_triton(inputs[0]) else "torch")


def test_per_token_modulation():
    """[B, S, D] shift and scale (not broadcast) take the same path."""
    x, shift, scale, eps = make_inputs((2, 5, 96), "float32", "cuda" if torch.cuda.is_available() else "cpu", 3)
    shift, scale = shift.expand(-1, 5, -1).contiguous(), (scale * 1.5).expand(-1, 5, -1).contiguous()
    torch.testing.assert_close(kernel(x, shift, scale, eps), reference(x, shift, scale, eps), atol=1e-5, rtol=1e-5)
