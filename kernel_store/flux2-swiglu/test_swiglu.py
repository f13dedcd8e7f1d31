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


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape, width, block_n", [((1, 64), 32, 1024), ((37, 198), 37, 32), ((2, 17, 96), 80, 64),
                                                   ((129, 2048), 512, 256)])
def test_prefix_is_the_concatenation(shape, width, block_n, dtype, atol, rtol):
    """With a prefix (the single-stream block's attention output) the kernel writes cat([prefix, swiglu(x)]):
    prefix widths that are not a multiple of block_n put the boundary inside a program's columns; the
    prefix is copied exactly and the SwiGLU part equals the call without one."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    (x,) = make_inputs(shape, dtype, device, 0)
    g = torch.Generator(device="cpu").manual_seed(5)
    prefix = torch.randn(*x.shape[:-1], width, generator=g).to(device, x.dtype)
    out = op.swiglu(x, prefix, block_n=block_n)
    assert out.shape == (*x.shape[:-1], width + x.shape[-1] // 2)
    torch.testing.assert_close(out, op.reference(x, prefix), atol=atol, rtol=rtol)
    assert torch.equal(out[..., :width], prefix)
    torch.testing.assert_close(out[..., width:], op.swiglu(x, block_n=block_n), atol=0, rtol=0)


def test_prefix_must_match():
    (x,) = make_inputs((3, 64), "float32", "cpu", 0)
    with pytest.raises(ValueError, match="prefix must match"):
        op.swiglu(x, torch.zeros(4, 8))
    with pytest.raises(ValueError, match="prefix must match"):
        op.swiglu(x, torch.zeros(3, 8, dtype=torch.bfloat16))


def test_prefix_compiles_as_one_op():
    (x,) = make_inputs((2, 17, 96), "float32", "cpu", 0)
    prefix = torch.randn(2, 17, 24)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    f = torch.compile(lambda a, p: op.swiglu(a, p), backend=backend, fullgraph=True)
    torch.testing.assert_close(f(x, prefix), op.swiglu(x, prefix), atol=0, rtol=0)
    if op.last_path() == "triton":  # the registered op only on the Triton path (else plain torch ops)
        assert any("optbot.swiglu.default" in g for g in graphs), graphs
