"""Kernel test for gate_bias_residual.py (the kernel test contract, docs/store.md):
inputs (residual, gate, y, bias) -> residual + gate * (y + bias), y being the un-biased projection.
Shapes (B, S, D): M=1, odd S and D, Qwen-Image's dim; the gate is laid out as the engine passes it
(a [B, 1, D] strided chunk of the [B, 6D] modulation output). The extra pytest functions cover the
per-token gate (modulate_index), no bias, a strided residual, the torch fallbacks and the
bias-deferring linear helper."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate_bias_residual as op  # noqa: E402

SHAPES = [(1, 1, 64), (2, 37, 96), (1, 19, 100), (1, 64, 256), (1, 9, 3072)]
# bf16: the kernel rounds y + bias and gate * y where the unfused ops store them. On the GPU the
# casts round to nearest even, like torch; the Triton interpreter truncates fp32 -> bf16, so on CPU
# the output can be ~2 ulps off and, where residual and gate * y cancel, off by one ulp of
# gate * y: with |residual| up to ~9 that stays under 1/16
CASES = [("float32", 1e-6, 1e-5), ("bfloat16", 6.25e-2, 2e-2)]
BENCH_SHAPES = [(1, 4096, 3072), (1, 512, 3072)]  # Qwen-Image full: image / text tokens x dim

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _dt(dtype):
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def make_inputs(shape, dtype, device, seed):
    B, S, D = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = _dt(dtype)
    residual = (2.0 * torch.randn(B, S, D, generator=g) + 0.5).to(device, dt)
    y = torch.randn(B, S, D, generator=g).to(device, dt)
    mod = (0.5 * torch.randn(B, 6 * D, generator=g)).to(device, dt)  # like img_mod(temb)
    gate = mod.chunk(2, dim=-1)[1].chunk(3, dim=-1)[2].unsqueeze(1)  # as QwenImageTransformerBlock._modulate
    bias = (0.5 * torch.randn(D, generator=g)).to(device, dt)
    return residual, gate, y, bias


def reference(*inputs):
    return op.reference(*inputs)


def kernel(*inputs, **config):
    return op.gate_bias_residual(*inputs, **config)


def kernel_path() -> str:
    return op.last_path()


def _expected_path(t):
    return "triton" if op._use_triton(t) else "torch"


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_gate_bias_residual(shape, dtype, atol, rtol):
    for seed in (0, 1):
        inputs = make_inputs(shape, dtype, DEVICE, seed)
        torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)
        assert kernel_path() == _expected_path(inputs[0])


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
def test_per_token_gate_no_bias_strided_residual(dtype, atol, rtol):
    """modulate_index gives a [B, S, D] gate from torch.where; the text stream's update has no
    deferred bias when its Linear applied it; rows of the residual may be strided."""
    residual, gate, y, bias = make_inputs((2, 13, 96), dtype, DEVICE, 3)
    index = torch.arange(13, device=DEVICE).remainder(2).expand(2, 13).unsqueeze(-1)
    per_token = torch.where(index == 0, gate, -gate)
    wide = torch.randn(2, 13, 160, device=DEVICE).to(_dt(dtype))
    strided = wide[..., 32:128]
    strided.copy_(residual)
    for args in [(residual, per_token, y, bias), (residual, gate, y, None), (strided, gate, y, bias)]:
        torch.testing.assert_close(op.gate_bias_residual(*args), op.reference(*args), atol=atol, rtol=rtol)
        assert op.last_path() == _expected_path(residual)
    out = op.gate_bias_residual(residual, gate, y, bias, block_m=2, block_n=32, num_warps=2)
    torch.testing.assert_close(out, op.reference(residual, gate, y, bias), atol=atol, rtol=rtol)


def test_falls_back_to_the_unfused_ops():
    residual, gate, y, bias = make_inputs((1, 5, 64), "float32", DEVICE, 4)
    # mixed dtypes promote in torch: the reference, exactly
    out = op.gate_bias_residual(residual, gate, y, bias.double())
    assert op.last_path() == "torch" and torch.equal(out, op.reference(residual, gate, y, bias.double()))
    # autograd: the kernel has no backward
    y.requires_grad_(True)
    op.gate_bias_residual(residual, gate, y, bias).sum().backward()
    assert op.last_path() == "torch" and y.grad is not None


def test_linear_deferring_bias():
    lin = nn.Linear(32, 48).to(DEVICE)
    x = torch.randn(2, 7, 32, device=DEVICE)
    with torch.no_grad():
        y, b = op.linear_deferring_bias(lin, x)
        if op.fuses(x):
            assert b is lin.bias
            torch.testing.assert_close(y + b, lin(x))
        else:  # nothing would absorb it: the module runs as before, bit for bit
            assert b is None and torch.equal(y, lin(x))
        # a token slice of a joint [B=1, txt + img, D] tensor, as the attention processor passes it
        joint = torch.randn(1, 5 + 7, 32, device=DEVICE)
        y, b = op.linear_deferring_bias(lin, joint[:, 5:].contiguous())
        torch.testing.assert_close(y + b if b is not None else y, lin(joint[:, 5:]))
        assert y.shape == (1, 7, 48)
        no_bias = nn.Linear(32, 48, bias=False).to(DEVICE)
        assert op.linear_deferring_bias(no_bias, x)[1] is None
        # run_deferring_bias = the modules in order, the last one's bias deferred
        seq = nn.Sequential(nn.GELU(approximate="tanh"), nn.Dropout(0.0), lin)
        y2, b2 = op.run_deferring_bias(seq, x)
        torch.testing.assert_close(y2 + b2 if b2 is not None else y2, seq(x))
    # with autograd on and trainable weights the Linear keeps its bias
    assert op.linear_deferring_bias(lin, x)[1] is None
