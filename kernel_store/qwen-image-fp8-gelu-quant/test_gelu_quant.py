"""Kernel test for gelu_quant.py (the kernel test contract, docs/store.md).

`kernel` and `reference` return the dequantized rows (e4m3 values x per-row scale) so the contract's
one comparison covers values and scales together; the tests below also compare the e4m3 bytes and
the scales themselves. Shapes: M=1, odd M and N, N above one block (Qwen-Image's MLP hidden is 12288),
strided rows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gelu_quant as op  # noqa: E402

SHAPES = [(1, 64), (37, 198), (2, 17, 96), (5, 4099)]
# one e4m3 step is 6.25-12.5% relative: a value the GELU's last bit moved across a rounding boundary
# lands one step away, in float32 too (under TRITON_INTERPRET the kernel's exp is numpy's, not
# torch's: one element of a [5, 4099] case at a fresh seed came out one step off, -0.00362 against
# -0.00338, 2026-12-05); the byte-level tests below bound how often (CPU) and forbid it (GPU)
CASES = [("float32", 1e-2, 0.13), ("bfloat16", 1e-2, 0.13)]
BENCH_SHAPES = [(4096, 12288), (512, 12288)]  # Qwen-Image full: image / text tokens x MLP hidden
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    *lead, n = shape
    wide = (2.0 * torch.randn(*lead, n + 8, generator=g)).to(device, dt)
    return (wide[..., 8:],)  # strided rows


def _deq(q, s):
    return q.to(torch.float32) * s


def reference(*inputs):
    return _deq(*op.reference(*inputs))


def kernel(*inputs):
    return _deq(*op.gelu_quant(*inputs))


def bench_kernel(*inputs):
    """What the microbenchmark times: the op as the engine calls it (kernel() adds a dequantization)."""
    return op.gelu_quant(*inputs)


def bench_reference(*inputs):
    return op.reference(*inputs)


def kernel_path() -> str:
    return op.last_path()


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(shape, dtype, atol, rtol):
    for seed in (0, 1):
        inputs = make_inputs(shape, dtype, DEVICE, seed)
        torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)


@pytest.mark.parametrize("recipe", op.RECIPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bytes_and_scales_are_the_recipes(recipe, dtype):
    """The scales equal the recipe's (torchao: amax / 448 rounded in the input's dtype; the emulation:
    in float32, clamped); the e4m3 bytes equal the unfused ops' for all but a few values."""
    (h,) = make_inputs((64, 3000), dtype, DEVICE, 3)
    q, s = op.gelu_quant(h, recipe)
    rq, rs = op.reference(h, recipe)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (64, 3000) and s.shape == (64, 1)
    if recipe == "torchao" and dtype == "bfloat16":  # the scale went through a bf16 division
        assert torch.equal(s, s.to(torch.bfloat16).to(torch.float32))
    same = (q.view(torch.uint8) == rq.view(torch.uint8)).float().mean().item()
    if dtype == "float32":
        assert torch.equal(s, rs) and same == 1.0
    else:  # GELU's last bf16 bit may differ (exp-based tanh vs the library's); rarely crosses a rounding edge
        assert (s != rs).float().mean().item() <= 0.05 and same >= 0.999, (same, (s != rs).sum())


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's arithmetic (ARITHMETIC): torch's CUDA kernels")
@pytest.mark.parametrize("recipe", op.RECIPES)
def test_on_the_gpu_exact_arithmetic_gives_the_unfused_ops_bytes(recipe, monkeypatch):
    """With ARITHMETIC "exact" the kernel computes as torch's CUDA kernels do (GELU's order with tanhf,
    correctly rounded division, the reciprocal for a division by a number): the e4m3 bytes and the
    scales equal the unfused ops' at Qwen-Image's MLP width, so the fused path is the FP8 baseline
    itself (docs/fp8.md: a last-bit difference can cross an e4m3 edge and grow through the blocks)."""
    monkeypatch.setattr(op, "ARITHMETIC", "exact")
    (h,) = make_inputs((512, 12288), "bfloat16", DEVICE, 9)
    q, s = op.gelu_quant(h, recipe)
    rq, rs = op.reference(h, recipe)
    assert torch.equal(s, rs), (s != rs).sum()
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), (q.view(torch.uint8) != rq.view(torch.uint8)).sum()


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's arithmetic (ARITHMETIC)")
@pytest.mark.parametrize("recipe", op.RECIPES)
def test_on_the_gpu_fast_arithmetic_moves_almost_no_code(recipe):
    """The default, "fast" (tanh through exp, Triton's division): the GELU is rounded to bf16 before it
    is quantized, which absorbs the last bits; measured on an H100, 0 of 56.6M e4m3 codes differed
    from the unfused ops' (benchmarks/gelu_quant_micro.py). Bound here: at most 1 in 10^4 codes, each
    one e4m3 step at most, and at most 1% of the rows' scales (a row whose amax element moved)."""
    assert op.ARITHMETIC == "fast"
    (h,) = make_inputs((4096, 12288), "bfloat16", DEVICE, 9)
    q, s = op.gelu_quant(h, recipe)
    rq, rs = op.reference(h, recipe)
    rows = (s != rs).flatten()
    assert rows.float().mean().item() <= 0.01, rows.sum()
    same = ~rows  # codes compared where the row's scale is the recipe's
    codes = q.view(torch.uint8)[same] != rq.view(torch.uint8)[same]
    assert codes.float().mean().item() <= 1e-4, codes.sum()
    # one e4m3 step: the differing codes' values are neighbours (|q - rq| at most an eighth of |rq|, or
    # one subnormal step of 2^-9)
    dq, drq = q[same].float()[codes], rq[same].float()[codes]
    assert bool(((dq - drq).abs() <= torch.maximum(drq.abs() / 8, torch.full_like(drq, 2.0 ** -9))).all())


def test_amax_row_is_exactly_448_and_a_zero_row():
    """Each row's largest |GELU| maps to +-448 exactly; a zero row gets the emulation's 1e-12 floor
    (torchao divides 0 by 0 there, as its own code does: not tested)."""
    h = torch.randn(3, 257, device=DEVICE)
    h[2] = 0
    q, s = op.gelu_quant(h, "optbot-emulation")
    assert torch.equal(q[:2].float().abs().amax(dim=-1), torch.full((2,), 448.0, device=DEVICE))
    assert s[2].item() == pytest.approx(1e-12 / 448.0) and q[2].float().abs().max().item() == 0.0


def test_engine_path_gives_the_fp8_linears_output():
    """gelu_quant + fp8_linear with the emulation's weight: the FP8 down projection of the unfused
    GELU, as runner/quant.Fp8Linear computes it."""
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from runner.quant import Fp8Linear

    plain = torch.nn.Linear(96, 64).to(DEVICE)
    fp8 = Fp8Linear.from_linear(torch.nn.Linear(96, 64).to(DEVICE))
    (h,) = make_inputs((33, 96), "float32", DEVICE, 5)
    w = op.fp8_weight(fp8)
    assert w is not None and w.recipe == "optbot-emulation" and op.fp8_weight(plain) is None
    q, s = op.gelu_quant(h, w.recipe)
    out = op.fp8_linear(q, s, w, fp8.bias, h.dtype)
    want = fp8(torch.nn.functional.gelu(h, approximate="tanh"))
    torch.testing.assert_close(out, want, atol=0, rtol=0)


def test_refusals():
    with pytest.raises(ValueError, match="recipe must be one of"):
        op.gelu_quant(torch.randn(2, 8), "nvfp4")
    if op.triton is not None and (DEVICE == "cuda" or op.os.environ.get("TRITON_INTERPRET") == "1"):
        with pytest.raises(ValueError, match=r"block_n must be 0 \(the default\) or a power of 2"):
            op.gelu_quant(make_inputs((2, 8), "float32", DEVICE, 0)[0], block_n=100)


def test_compiles_whole():
    """Under torch.compile(fullgraph=True) the Triton path is one registered op: no graph break."""
    (h,) = make_inputs((9, 130), "float32", DEVICE, 7)
    f = torch.compile(lambda x: op.gelu_quant(x, "optbot-emulation"), fullgraph=True, backend="aot_eager")
    q, s = f(h)
    rq, rs = op.gelu_quant(h, "optbot-emulation")
    assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8))


def test_torchao_path_is_torchaos_own_linear_bit_for_bit(monkeypatch):
    """A down projection quantized the way torchao's Float8DynamicActivationFloat8WeightConfig
    (PerRow) quantizes it, built with torchao's own constructors (its quantize_ refuses float8 on
    the CPU, its Float8Tensor and linear run there): gelu_quant + fp8_linear give exactly what
    torchao's linear gives on the unfused GELU (its bf16 scale division, its bias in _scaled_mm).
    On the GPU under ARITHMETIC "exact": on an H100 (2026-12-06) the "fast" default failed this
    equality (the fast test bounds how far it may move); the exact form here is not yet run there."""
    monkeypatch.setattr(op, "ARITHMETIC", "exact")
    ao = pytest.importorskip("torchao.quantization")
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import (Float8Tensor,
                                                                              QuantizeTensorToFloat8Kwargs)

    cfg = ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow())
    act_g, w_g = cfg.granularity
    g = torch.Generator(device="cpu").manual_seed(11)
    lin = torch.nn.Linear(96, 64).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(64, 96, generator=g).to(lin.weight))
        lin.bias.copy_(torch.randn(64, generator=g).to(lin.bias))
    act = QuantizeTensorToFloat8Kwargs(cfg.activation_dtype, act_g, hp_value_lb=cfg.activation_value_lb,
                                       hp_value_ub=cfg.activation_value_ub, kernel_preference=cfg.kernel_preference)
    lin.weight = torch.nn.Parameter(Float8Tensor.from_hp(lin.weight.detach(), float8_dtype=cfg.weight_dtype,
                                                         granularity=w_g, mm_config=cfg.mm_config,
                                                         kernel_preference=cfg.kernel_preference,
                                                         act_quant_kwargs=act), requires_grad=False)
    w = op.fp8_weight(lin)
    assert w is not None and w.recipe == "torchao" and w.bias_in_gemm and w.fast_accum == cfg.mm_config.use_fast_accum
    (h,) = make_inputs((333, 96), "bfloat16", DEVICE, 12)
    with torch.no_grad():
        want = lin(torch.nn.functional.gelu(h, approximate="tanh"))
        q, s = op.gelu_quant(h, w.recipe)
        got = op.fp8_linear(q, s, w, lin.bias, h.dtype)
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("recipe", op.RECIPES)
@pytest.mark.parametrize("shape", [(5, 4099), (2, 4000), (3, 12288)])
def test_one_pass_and_two_passes_give_the_same_bytes(recipe, shape):
    """The default holds a row of up to 16384 values in registers and computes its GELU once; a block
    shorter than the row takes two passes, computing it twice. Same arithmetic, so the same e4m3
    bytes and scales, whichever runs (Qwen-Image's MLP hidden is 12288: one pass)."""
    if op.triton is None or not (DEVICE == "cuda" or op.os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("the Triton path runs on CUDA or under TRITON_INTERPRET=1")
    (h,) = make_inputs(shape, "bfloat16", DEVICE, 3)
    assert op._config(shape[-1], 0, 0)[1] > 0  # the default is one pass here
    q1, s1 = op.gelu_quant(h, recipe)
    # every one-pass form (1 to 4 blocks: 4000 in 4 of 1024) and two passes (more blocks than 4)
    chunks = {op._config(shape[-1], b, 0)[1] for b in (512, 1024, 2048, 4096, 8192, 16384)}
    assert 0 in chunks and len(chunks) >= 3, chunks
    for block_n in (512, 1024, 2048, 4096, 8192, 16384):
        q2, s2 = op.gelu_quant(h, recipe, block_n=block_n, num_warps=4)
        assert op.last_path() == "triton"
        assert torch.equal(s1, s2) and torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)), block_n
    with pytest.raises(ValueError, match="power of 2"):
        op.gelu_quant(h, recipe, block_n=1000)


def test_the_default_block_leaves_no_lane_idle_where_it_can():
    """(BLOCK_N, CHUNKS, num_warps) by row length: Qwen-Image's 12288 is three blocks of 4096 in one
    pass; a row over 16384 values takes two passes; a block smaller than a quarter of the row too."""
    if op.triton is None:
        pytest.skip("no triton")
    assert op._config(12288, 0, 0) == (4096, 3, 16)
    assert op._config(3072, 0, 0) == (1024, 3, 8)
    assert op._config(4099, 0, 0) == (2048, 3, 8)    # 4099: the split with the fewest idle lanes
    assert op._config(64, 0, 0) == (64, 1, 8)
    assert op._config(20000, 0, 0) == (2048, 0, 8)    # over ONE_PASS_MAX: two passes
    assert op._config(12288, 2048, 0) == (2048, 0, 8)  # six blocks: two passes
    assert op._config(12288, 16384, 0) == (16384, 1, 16)
