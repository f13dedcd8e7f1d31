"""Kernel test for qk_norm_rope.py (the kernel test contract, docs/store.md):
reference(*inputs), kernel(*inputs), make_inputs(shape, dtype, device, seed), SHAPES, CASES.
The kernel under test is the engine's call, `qk_rmsnorm_rope_joint`: text and image q (or k), each
a strided view of its fused projection output, into one new [txt, img] tensor. Shapes are
(B, S, H, D) with S = S_txt + S_img (S_txt = S // 3, none when that is 0): M=1 (one token, one
head), odd sequence lengths, a non-power-of-two head dim. Run on CPU with TRITON_INTERPRET=1 to
execute the Triton kernel in the interpreter.
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
# The compile modes (CUDA) also at FLUX.2's size: the old call pattern passed every small shape in
# compile + CUDA graph and faulted only here (benchmarks/results/h200-qknorm-compile-graph-20261201/).
MODE_SHAPES = SHAPES + [(1, 4608, 48, 128)]


def make_inputs(shape, dtype, device, seed):
    """(x, weight, ex, eweight, cos, sin, eps, eeps): the arguments of qk_rmsnorm_rope_joint."""
    B, S, H, D = shape
    s_txt = S // 3
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype

    def key_view(n):  # [B, n, H, D]: the key third of a fused projection output, a strided view
        qkv = (3.0 * torch.randn(B, n, 3 * H * D, generator=g)).to(device, dt)
        return qkv[..., H * D:2 * H * D].unflatten(-1, (H, D))

    x = key_view(S - s_txt)
    ex = key_view(s_txt) if s_txt else None
    weight = (1.0 + 0.1 * torch.randn(D, generator=g)).to(device, dt)
    eweight = (1.0 + 0.1 * torch.randn(D, generator=g)).to(device, dt) if s_txt else None
    pos = torch.arange(S, dtype=torch.float64)[:, None] * (1000.0 ** (-torch.arange(D // 2, dtype=torch.float64) / (D // 2)))
    cos = pos.cos().repeat_interleave(2, dim=1).float().to(device)  # [S, D]
    sin = pos.sin().repeat_interleave(2, dim=1).float().to(device)
    return x, weight, ex, eweight, cos, sin, 1e-6, 1e-5


def reference(x, weight, ex, eweight, cos, sin, eps, eeps):
    """The unfused engine code: norm and RoPE of each stream, text first, concatenated."""
    s_txt = 0 if ex is None else ex.shape[1]
    img = op.reference(x, weight, cos[s_txt:], sin[s_txt:], eps)
    return img if ex is None else torch.cat([op.reference(ex, eweight, cos[:s_txt], sin[:s_txt], eeps), img], dim=1)


def kernel(*inputs):
    return op.qk_rmsnorm_rope_joint(*inputs)


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


def test_compiled_whole_graph_matches_reference():
    """torch.compile(fullgraph=True) of the engine's call: no graph break (the registered op is
    one node), the same numbers."""
    inputs = make_inputs((1, 37, 3, 32), "float32", "cuda" if torch.cuda.is_available() else "cpu", 0)
    compiled = torch.compile(kernel, fullgraph=True)
    torch.testing.assert_close(compiled(*inputs), reference(*inputs), atol=1e-5, rtol=1e-5)
