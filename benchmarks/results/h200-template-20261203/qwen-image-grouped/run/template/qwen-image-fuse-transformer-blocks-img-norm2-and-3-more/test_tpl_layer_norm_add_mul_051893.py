"""Kernel test for tpl_layer_norm_add_mul_051893.py (the kernel test contract, docs/store.md), template-generated:
layer_norm -> add -> mul -> add on inputs a0, a1, a2; shapes: the captured one, M=1 and odd ones."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tpl_layer_norm_add_mul_051893 as op  # noqa: E402

SHAPES = [(1, 4096, 3072), (1, 1, 3072), (2, 37, 96), (1, 19, 100), (1, 512, 3072)]
# bf16: every node is rounded where the unfused op stores it, and a norm's fp32 statistics differ in
# the last bits between kernels, so one rounding can flip and be carried through the chain (a few
# ulps at |x| ~ 4, where one is 0.03): wider than the store's hand-tuned 3e-2 / 2e-2
CASES = [("float32", 2e-5, 2e-5), ("bfloat16", 6e-2, 3e-2)]
BENCH_SHAPES = [(1, 4096, 3072), (1, 512, 3072)]


def make_inputs(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    a0 = torch.randn(*shape, generator=g).to(device, dt)
    a1 = (0.5 * torch.randn(shape[0], 1, shape[2], generator=g)).to(device, dt)
    a2 = (0.5 * torch.randn(shape[0], 1, shape[2], generator=g)).to(device, dt)
    return (a0, a1, a2,)


def reference(*inputs):
    return op.reference(*inputs)


def kernel(*inputs):
    return op.tpl_layer_norm_add_mul_051893(*inputs)


def kernel_with_config(*inputs, **config):
    return op._launch(*inputs, **config) if op._use_triton(inputs[0]) else op.reference(*inputs)


def kernel_path() -> str:
    return op.last_path()


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_tpl_layer_norm_add_mul_051893(shape, dtype, atol, rtol):
    inputs = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", 0)
    torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)
    assert op.last_path() == ("triton" if op._use_triton(inputs[0]) else "torch")
