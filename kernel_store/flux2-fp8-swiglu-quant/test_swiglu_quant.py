"""Kernel test for swiglu_quant.py (the kernel test contract, docs/store.md).

A shape is (*lead, P, W): x is [*lead, W] (W = 2I, the SwiGLU's two halves), a strided slice of a
wider projection output as the single-stream blocks pass it; P is the width of the attention output
concatenated before the SwiGLU (0: none, the double-stream FeedForward). `kernel` and `reference`
return the dequantized rows (e4m3 values x per-row scale) so the contract's one comparison covers
values and scales together; the tests below also compare the e4m3 bytes and the scales themselves.
Shapes: M=1, odd M, P and I, widths above one block, strided rows."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import swiglu_quant as op  # noqa: E402

SHAPES = [(1, 0, 64), (37, 24, 198), (2, 17, 40, 96), (5, 0, 4102), (3, 2051, 4100)]
# one e4m3 step is 6.25-12.5% relative: a value whose last bit moved (silu's exp: the kernel's and the
# library's differ by an ulp now and then, in float32 too) across a rounding boundary lands one step
# away; the byte-level tests below bound how often
CASES = [("float32", 1e-2, 0.13), ("bfloat16", 1e-2, 0.13)]
# FLUX.2 full, 1024x1024 and 512 text tokens: single-stream blocks (4608 tokens, attention 6144 +
# SwiGLU of 2 x 18432); double-stream FeedForward, image (4096) and text (512) tokens
BENCH_SHAPES = [(4608, 6144, 36864), (4096, 0, 36864), (512, 0, 36864)]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    *lead, p, w = shape
    wide = (2.0 * torch.randn(*lead, w + 24, generator=g)).to(device, dt)
    x = wide[..., 24:]  # strided rows: the MLP half of the fused projection's output
    prefix = (torch.randn(*lead, p, generator=g)).to(device, dt) if p else None
    return (x, prefix)


def _deq(q, s):
    return q.to(torch.float32) * s


def reference(*inputs):
    return _deq(*op.reference(*inputs))


def kernel(*inputs):
    return _deq(*op.swiglu_quant(*inputs))


def bench_kernel(*inputs):
    """What the microbenchmark times: the op as the engine calls it (kernel() adds a dequantization)."""
    return op.swiglu_quant(*inputs)


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
@pytest.mark.parametrize("p", [0, 700])
def test_bytes_and_scales_are_the_recipes(recipe, dtype, p):
    """The scales equal the recipe's (torchao: amax / 448 rounded in the input's dtype; the emulation:
    in float32, clamped); the e4m3 bytes equal the unfused ops' for all but a few values."""
    x, prefix = make_inputs((64, p, 3000), dtype, DEVICE, 3)
    q, s = op.swiglu_quant(x, prefix, recipe)
    rq, rs = op.reference(x, prefix, recipe)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (64, p + 1500) and s.shape == (64, 1)
    if recipe == "torchao" and dtype == "bfloat16":  # the scale went through a bf16 division
        assert torch.equal(s, s.to(torch.bfloat16).to(torch.float32))
    same = (q.view(torch.uint8) == rq.view(torch.uint8)).float().mean().item()
    if dtype == "float32":  # silu's exp may move the row's amax by an ulp
        torch.testing.assert_close(s, rs, atol=0, rtol=1e-6)
        assert same >= 0.9999, same
    else:  # silu's last bf16 bit may differ (exp); rarely crosses a rounding edge
        assert (s != rs).float().mean().item() <= 0.05 and same >= 0.999, (same, (s != rs).sum())


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's arithmetic (ARITHMETIC): torch's CUDA kernels")
@pytest.mark.parametrize("recipe", op.RECIPES)
def test_on_the_gpu_the_bytes_are_the_unfused_ops_exactly(recipe, monkeypatch):
    """With ARITHMETIC "exact" the kernel computes as torch's CUDA kernels do (expf, correctly rounded division,
    the reciprocal for a division by a number): the e4m3 bytes and the scales equal the unfused ops'
    at FLUX.2's single-block width, so the fused path is the FP8 baseline itself, not a neighbour of
    it (docs/fp8.md: a last-bit difference can cross an e4m3 edge and grow through the blocks)."""
    monkeypatch.setattr(op, "ARITHMETIC", "exact")
    x, prefix = make_inputs((256, 6144, 36864), "bfloat16", DEVICE, 9)
    q, s = op.swiglu_quant(x, prefix, recipe)
    rq, rs = op.reference(x, prefix, recipe)
    assert torch.equal(s, rs), (s != rs).sum()
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), (q.view(torch.uint8) != rq.view(torch.uint8)).sum()


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's arithmetic (ARITHMETIC)")
@pytest.mark.parametrize("recipe", op.RECIPES)
def test_on_the_gpu_fast_arithmetic_moves_almost_no_code(recipe, monkeypatch):
    """ARITHMETIC "fast" (Triton's exp and division): silu(a) and the product are rounded to bf16
    before the quantization, which should absorb the last bits as it did for the Qwen-Image GELU
    kernel (0 of 56.6M codes moved). Bound: at most 1 in 10^4 codes, each one e4m3 step at most, and
    at most 1% of the rows' scales. The gate for making "fast" this entry's default."""
    monkeypatch.setattr(op, "ARITHMETIC", "fast")
    x, prefix = make_inputs((1024, 6144, 36864), "bfloat16", DEVICE, 9)
    q, s = op.swiglu_quant(x, prefix, recipe)
    rq, rs = op.reference(x, prefix, recipe)
    rows = (s != rs).flatten()
    assert rows.float().mean().item() <= 0.01, rows.sum()
    same = ~rows
    codes = q.view(torch.uint8)[same] != rq.view(torch.uint8)[same]
    assert codes.float().mean().item() <= 1e-4, codes.sum()
    dq, drq = q[same].float()[codes], rq[same].float()[codes]
    assert bool(((dq - drq).abs() <= torch.maximum(drq.abs() / 8, torch.full_like(drq, 2.0 ** -9))).all())


def test_the_prefix_is_quantized_as_it_is_and_shares_the_rows_scale():
    """The prefix columns are the prefix itself quantized with the whole row's scale: a prefix
    holding each row's largest value sets the scale, and maps to +-448 exactly."""
    x, prefix = make_inputs((4, 33, 80), "float32", DEVICE, 4)
    prefix[:, 5] = 1000.0
    q, s = op.swiglu_quant(x, prefix, "optbot-emulation")
    assert torch.equal(s.flatten(), torch.full((4,), 1000.0 / 448.0, device=DEVICE))
    assert torch.equal(q[:, 5].float(), torch.full((4,), 448.0, device=DEVICE))
    rq, _ = op.reference(x, prefix, "optbot-emulation")
    assert torch.equal(q[:, :33].view(torch.uint8), rq[:, :33].view(torch.uint8))


def test_a_zero_row_gets_the_emulations_floor():
    """A zero row gets the emulation's 1e-12 floor (torchao divides 0 by 0 there, as its own code
    does: not tested)."""
    x, prefix = make_inputs((3, 9, 258), "float32", DEVICE, 6)
    x[2], prefix[2] = 0, 0
    q, s = op.swiglu_quant(x, prefix, "optbot-emulation")
    assert s[2].item() == pytest.approx(1e-12 / 448.0) and q[2].float().abs().max().item() == 0.0


def _emulated(k, n, device, seed):
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from runner.quant import Fp8Linear

    torch.manual_seed(seed)
    return torch.nn.Linear(k, n, bias=False).to(device), Fp8Linear.from_linear(torch.nn.Linear(k, n, bias=False).to(device))


@pytest.mark.parametrize("p", [0, 32])
def test_engine_path_gives_the_fp8_linears_output(p):
    """swiglu_quant + fp8_linear with the emulation's weight: the FP8 output projection of the
    unfused SwiGLU (and concatenation), as runner/quant.Fp8Linear computes it."""
    plain, fp8 = _emulated(p + 48, 64, DEVICE, 5)
    x, prefix = make_inputs((2, 17, p, 96), "float32", DEVICE, 5)
    w = op.fp8_weight(fp8)
    assert w is not None and w.recipe == "optbot-emulation" and op.fp8_weight(plain) is None
    q, s = op.swiglu_quant(x, prefix, w.recipe)
    out = op.fp8_linear(q, s, w, fp8.bias, x.dtype).reshape(2, 17, 64)
    v = torch.nn.functional.silu(x[..., :48]) * x[..., 48:]
    want = fp8(torch.cat([prefix, v], dim=-1) if p else v)
    torch.testing.assert_close(out, want, atol=0, rtol=0)


def test_refusals():
    with pytest.raises(ValueError, match="recipe must be one of"):
        op.swiglu_quant(torch.randn(2, 8), None, "nvfp4")
    with pytest.raises(ValueError, match="must be even"):
        op.swiglu_quant(torch.randn(2, 9))
    with pytest.raises(ValueError, match="prefix must match"):
        op.swiglu_quant(torch.randn(2, 8), torch.randn(3, 4))
    if op.triton is not None and (DEVICE == "cuda" or op.os.environ.get("TRITON_INTERPRET") == "1"):
        with pytest.raises(ValueError, match="block_n must be a power of 2"):
            op.swiglu_quant(*make_inputs((2, 0, 8), "float32", DEVICE, 0), block_n=100)


@pytest.mark.parametrize("p", [0, 20])
def test_compiles_whole(p):
    """Under torch.compile(fullgraph=True) the Triton path is one registered op: no graph break,
    with and without the prefix."""
    x, prefix = make_inputs((9, p, 130), "float32", DEVICE, 7)
    f = torch.compile(lambda a, b: op.swiglu_quant(a, b, "optbot-emulation"), fullgraph=True, backend="aot_eager")
    q, s = f(x, prefix)
    rq, rs = op.swiglu_quant(x, prefix, "optbot-emulation")
    assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8))


@pytest.mark.parametrize("p", [0, 64])
def test_torchao_path_is_torchaos_own_linear_bit_for_bit(p, monkeypatch):
    """An output projection quantized the way torchao's Float8DynamicActivationFloat8WeightConfig
    (PerRow) quantizes it, built with torchao's own constructors (its quantize_ refuses float8 on
    the CPU, its Float8Tensor and linear run there): swiglu_quant + fp8_linear give exactly what
    torchao's linear gives on the unfused SwiGLU and concatenation (its bf16 scale division).
    On the GPU under ARITHMETIC "exact": "fast" moves a few codes (its own test bounds them), as the
    Qwen-Image GELU kernel's fast form failed the same test there."""
    monkeypatch.setattr(op, "ARITHMETIC", "exact")
    ao = pytest.importorskip("torchao.quantization")
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import (Float8Tensor,
                                                                              QuantizeTensorToFloat8Kwargs)

    cfg = ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow())
    act_g, w_g = cfg.granularity
    g = torch.Generator(device="cpu").manual_seed(11)
    lin = torch.nn.Linear(p + 48, 64, bias=False).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(64, p + 48, generator=g).to(lin.weight))
    act = QuantizeTensorToFloat8Kwargs(cfg.activation_dtype, act_g, hp_value_lb=cfg.activation_value_lb,
                                       hp_value_ub=cfg.activation_value_ub, kernel_preference=cfg.kernel_preference)
    lin.weight = torch.nn.Parameter(Float8Tensor.from_hp(lin.weight.detach(), float8_dtype=cfg.weight_dtype,
                                                         granularity=w_g, mm_config=cfg.mm_config,
                                                         kernel_preference=cfg.kernel_preference,
                                                         act_quant_kwargs=act), requires_grad=False)
    w = op.fp8_weight(lin)
    assert w is not None and w.recipe == "torchao" and w.bias_in_gemm and w.fast_accum == cfg.mm_config.use_fast_accum
    x, prefix = make_inputs((333, p, 96), "bfloat16", DEVICE, 12)
    with torch.no_grad():
        v = torch.nn.functional.silu(x[..., :48]) * x[..., 48:]
        want = lin(torch.cat([prefix, v], dim=-1) if p else v)
        q, s = op.swiglu_quant(x, prefix, w.recipe)
        got = op.fp8_linear(q, s, w, lin.bias, x.dtype)
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("recipe", op.RECIPES)
@pytest.mark.parametrize("shape, block_n", [((3, 0, 36), 2), ((5, 24, 198), 16), ((2, 2051, 4100), 256),
                                            ((1, 64, 4096), 2048), ((4, 0, 4102), 256)])
def test_one_pass_and_two_passes_give_the_same_bytes(recipe, shape, block_n, monkeypatch):
    """ONE_PASS holds the row (at most 3 prefix blocks, 9 SwiGLU blocks) in registers and reads it once;
    the two-pass kernel computes the same values twice. Same arithmetic: the same e4m3 bytes and
    scales, with a prefix or none, a last block part-filled or whole, one block or nine. A row over
    the one-pass limits takes the two passes whatever ONE_PASS says."""
    if op.triton is None or not (DEVICE == "cuda" or op.os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("the Triton path runs on CUDA or under TRITON_INTERPRET=1")
    x, prefix = make_inputs(shape, "bfloat16", DEVICE, 5)
    monkeypatch.setattr(op, "ONE_PASS", False)
    q2, s2 = op.swiglu_quant(x, prefix, recipe, block_n=block_n, num_warps=4)
    monkeypatch.setattr(op, "ONE_PASS", True)
    q1, s1 = op.swiglu_quant(x, prefix, recipe, block_n=block_n, num_warps=4)
    assert op.last_path() == "triton"
    assert torch.equal(s1, s2) and torch.equal(q1.view(torch.uint8), q2.view(torch.uint8))
    fits = -(-shape[-2] // block_n) <= op.ONE_PASS_PREFIX_BLOCKS and -(-shape[-1] // 2 // block_n) <= op.ONE_PASS_BLOCKS
    assert fits == ((shape, block_n) != ((2, 2051, 4100), 256)), "the cases cover both sides of the limit"
