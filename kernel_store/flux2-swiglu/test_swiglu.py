"""Kernel test for swiglu.py (the kernel test contract, docs/store.md). Shapes are (M, 2I) rows of
a fused projection output: M=1, odd M and odd I, and x as a strided slice (the single-stream
block's MLP half of to_qkv_mlp_proj)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import swiglu as op  # noqa: E402

SHAPES = [(1, 64), (37, 198), (2, 17, 96), (129, 2048)]
CASES = [("float32", 1e-6, 1e-5), ("bfloat16", 2e-2, 2e-2)]
BENCH_SHAPES = [(4608, 2 * 18432), (512, 2 * 18432)]  # FLUX.2 full: image / text tokens x 2 * mlp_hidden


def make_inputs(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    *lead, two_i = shape
    fused = (2.0 * torch.randn(*lead, 96 + two_i, generator=g)).to(device, dt)  # [..., qkv | mlp]
    return (fused[..., 96:],)  # strided rows, like the engine's mlp_hidden_states


def reference(*inputs):
    return op.reference(*inputs)


def kernel(*inputs):
    return op.swiglu(*inputs)


def kernel_path() -> str:
    return op.last_path()


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(shape, dtype, atol, rtol):
    for seed in (0, 1):
        inputs = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", seed)
        torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)
