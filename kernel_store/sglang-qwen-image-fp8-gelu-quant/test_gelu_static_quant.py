"""Kernel test for gelu_static_quant.py (the kernel test contract, docs/store.md).

`kernel` and `reference` return the dequantized values (e4m3 x the static scale). Shapes: M=1, odd
sizes, the element count not a whole block, Qwen-Image's MLP width (12288), strided rows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gelu_static_quant as op  # noqa: E402

SHAPES = [(1, 64), (37, 198), (2, 17, 96), (5, 4099)]
# one e4m3 step is 6.25-12.5% relative: a value whose GELU's last bit moved (exp-based tanh against
# the library's) can land one step away; the byte-level tests below bound how often
CASES = [("float32", 1e-2, 0.13), ("bfloat16", 1e-2, 0.13)]
TOLERANCE = {"float32": (1e-2, 0.13), "bfloat16": (1e-2, 0.13)}
BENCH_SHAPES = [(4096, 12288), (512, 12288)]  # Qwen-Image full: image / text tokens x MLP hidden
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(shape, dtype, device, seed):
    """h as the up projection leaves it (strided rows here), and a static scale as ModelOpt calibrates
    one: the largest |GELU| over 448, times a margin, so that a few values saturate."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    *lead, n = shape
    wide = (2.0 * torch.randn(*lead, n + 8, generator=g)).to(device, dt)
    h = wide[..., 8:]
    amax = torch.nn.functional.gelu(h.float(), approximate="tanh").abs().amax()
    scale = (amax / op.E4M3_MAX * (0.5 + torch.rand((), generator=g))).to(device, torch.float32)
    return h, scale


def reference(h, scale):
    return op.reference(h, scale).to(torch.float32) * scale


def kernel(h, scale):
    return op.gelu_static_quant(h, scale).to(torch.float32) * scale


def bench_kernel(*inputs):
    """What the microbenchmark times: the op as the engine calls it (kernel() adds a dequantization)."""
    return op.gelu_static_quant(*inputs)


def bench_reference(*inputs):
    return op.reference(*inputs)


def kernel_path() -> str:
    return op.last_path()


def _triton_runs() -> bool:
    return op.triton is not None and (DEVICE == "cuda" or op.os.environ.get("TRITON_INTERPRET") == "1")


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(shape, dtype, atol, rtol):
    for seed in (0, 1):
        inputs = make_inputs(shape, dtype, DEVICE, seed)
        torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bytes_are_the_unfused_ops(dtype):
    """The e4m3 bytes equal the unfused ops' for all but a few values (float32: all; bf16: the GELU's
    last bf16 bit may differ, exp-based tanh against the library's, and rarely crosses an e4m3 edge),
    saturated values included."""
    h, scale = make_inputs((64, 3000), dtype, DEVICE, 3)
    q, rq = op.gelu_static_quant(h, scale), op.reference(h, scale)
    assert q.dtype == torch.float8_e4m3fn and q.shape == h.shape
    assert (rq.float().abs() == 448.0).any() or scale.item() * 448.0 > h.float().abs().max().item()
    same = (q.view(torch.uint8) == rq.view(torch.uint8)).float().mean().item()
    assert same == 1.0 if dtype == "float32" else same >= 0.999, same


def test_saturates_at_448_and_keeps_zeros():
    """Values past the static scale's range saturate at +-448 (the cast alone would give NaN); zeros stay 0."""
    h = torch.tensor([[0.0, 30.0, -30.0, 1.0]], device=DEVICE)
    q = op.gelu_static_quant(h, torch.tensor(0.01, device=DEVICE)).float()
    assert q[0, 0].item() == 0.0 and q[0, 1].item() == 448.0
    assert q[0, 2].item() == 0.0  # gelu(-30) is -0.0: a negative zero, not -448
    assert not torch.isnan(q).any()


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's arithmetic: torch's CUDA GELU, Triton's e4m3 cast")
def test_on_the_gpu_almost_no_code_moves():
    """On the GPU the reference is torch's CUDA GELU (tanhf) and the kernel's tanh goes through exp: the
    GELU is rounded to bf16 before it is quantized, which absorbs the last bits. Bound: at most 1 in 10^4
    codes at Qwen-Image's image-call shape, each one e4m3 step at most."""
    h, scale = make_inputs((4096, 12288), "bfloat16", DEVICE, 9)
    q, rq = op.gelu_static_quant(h, scale), op.reference(h, scale)
    codes = q.view(torch.uint8) != rq.view(torch.uint8)
    assert codes.float().mean().item() <= 1e-4, codes.sum()
    dq, drq = q.float()[codes], rq.float()[codes]
    assert bool(((dq - drq).abs() <= torch.maximum(drq.abs() / 8, torch.full_like(drq, 2.0 ** -9))).all())


def test_refusals():
    with pytest.raises(ValueError, match="scale must be one value"):
        op.gelu_static_quant(torch.randn(2, 8), torch.ones(2))
    if _triton_runs():
        h, scale = make_inputs((2, 8), "float32", DEVICE, 0)
        with pytest.raises(ValueError, match=r"block must be 0 \(the default\) or a power of 2"):
            op.gelu_static_quant(h, scale, block=100)


@pytest.mark.parametrize("block", [64, 256])
def test_blocks_give_the_same_bytes(block):
    """A small block (many programs, a masked tail) and the default give the same bytes."""
    if not _triton_runs():
        pytest.skip("the Triton path (CUDA, or TRITON_INTERPRET=1)")
    h, scale = make_inputs((3, 1000), "bfloat16", DEVICE, 4)
    a, b = op.gelu_static_quant(h, scale, block=block), op.gelu_static_quant(h, scale)
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and op.last_path() == "triton"


def test_compiles_whole():
    """Under torch.compile(fullgraph=True) the Triton path is one registered op: no graph break."""
    h, scale = make_inputs((9, 130), "float32", DEVICE, 7)
    f = torch.compile(lambda x, s: op.gelu_static_quant(x, s), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(h, scale).view(torch.uint8), op.gelu_static_quant(h, scale).view(torch.uint8))
