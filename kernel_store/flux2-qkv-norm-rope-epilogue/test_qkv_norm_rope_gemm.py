"""Kernel test for qkv_norm_rope_gemm.py (the kernel test contract, docs/store.md):
reference(*inputs), kernel(*inputs), make_inputs(shape, dtype, device, seed), SHAPES, CASES.
Shapes are (B, S_txt, S_img, K, H, D): one text and one image token (M=1 per stream), odd sequence
lengths and an odd K (the masked K loop), two heads, batch 2. D is a power of two (a tile is one head).
Inputs are laid out as the FLUX.2 double-stream attention passes them: the modulated activations
[B, S, K] and the merged [W_q; W_k; W_v] of each stream (no bias in FLUX.2).
Run on CPU with TRITON_INTERPRET=1 to execute the Triton kernel in the interpreter.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qkv_norm_rope_gemm as op  # noqa: E402

TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

SHAPES = [(1, 1, 1, 32, 1, 32), (1, 5, 19, 48, 2, 32), (2, 3, 11, 64, 2, 64), (1, 7, 9, 40, 1, 128)]
# bf16: a different fp32 accumulation order can flip the rounding of a linear output; RoPE then mixes
# two normalized values of size up to ~4 (bf16 ulp 0.0156 there) and rounds again: a few ulps at that
# size (the interpreter's worst case is 3 ulps, 0.047), so 5 ulps; a wrong pairing or norm is O(1).
CASES = [("float32", 1e-4, 1e-4), ("bfloat16", 8e-2, 2e-2)]
# FLUX.2-dev: dim 6144, 48 heads x 128, 512 text tokens, 4096 image tokens (1024 x 1024 / 16^2).
BENCH_SHAPES = [(1, 512, 4096, 6144, 48, 128)]


def make_inputs(shape, dtype, device, seed):
    B, s_txt, s_img, K, H, D = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype

    def rnd(*size, scale=1.0):
        return (scale * torch.randn(*size, generator=g)).to(device, dt)

    x_txt, x_img = rnd(B, s_txt, K), rnd(B, s_img, K)
    w_txt, w_img = rnd(3 * H * D, K, scale=K ** -0.5), rnd(3 * H * D, K, scale=K ** -0.5)
    nq_txt, nk_txt, nq_img, nk_img = (1.0 + rnd(D, scale=0.1) for _ in range(4))
    # positions as FLUX.2 feeds them: text tokens then image tokens, interleaved cos/sin pairs, fp32
    pos = torch.arange(s_txt + s_img, dtype=torch.float64)[:, None]
    freqs = pos * (2000.0 ** (-torch.arange(D // 2, dtype=torch.float64) / (D // 2)))
    cos = freqs.cos().repeat_interleave(2, dim=1).float().to(device)
    sin = freqs.sin().repeat_interleave(2, dim=1).float().to(device)
    return x_txt, x_img, w_txt, w_img, None, None, nq_txt, nk_txt, nq_img, nk_img, cos, sin, 1e-6, H


def reference(*inputs):
    return op.reference(*inputs)


def kernel(*inputs, **config):
    return op.qkv_norm_rope(*inputs, **config)


def kernel_path() -> str:
    return op.last_path()


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gemm, epilogue", [("cublas", "per-head"), ("cublas", "row-block"), ("triton", "per-head")])
def test_kernel_matches_reference(shape, dtype, atol, rtol, gemm, epilogue):
    """Both ways to the tile's values, cuBLAS's output read back (the default) and the Triton GEMM, and
    both epilogue grids of the former."""
    for seed in (0, 1):
        inputs = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", seed)
        x_before = inputs[1].clone()
        torch.testing.assert_close(kernel(*inputs, gemm=gemm, epilogue=epilogue), reference(*inputs), atol=atol, rtol=rtol)
        assert torch.equal(inputs[1], x_before), "the kernel modified its input"
        assert op.last_path() == ("triton" if op.triton is not None and (inputs[1].is_cuda or TRITON_INTERPRET) else "torch")


@pytest.mark.parametrize("block_h", [1, 2, 4])
def test_row_block_heads_per_program(block_h):
    """The row-block epilogue's 3-D tile: block_h heads per program, three heads so that a program's
    last heads fall past H (masked) for block_h 2 and 4; the same values as the per-head grid."""
    inputs = make_inputs((2, 3, 13, 40, 3, 32), "float32", "cuda" if torch.cuda.is_available() else "cpu", 0)
    out = kernel(*inputs, gemm="cublas", epilogue="row-block", block_h=block_h, block_m=16)
    torch.testing.assert_close(out, reference(*inputs), atol=1e-4, rtol=1e-4)
    # not bit-equal on the GPU: the 3-D tile reduces each head over D in another order than the 2-D one
    torch.testing.assert_close(out, kernel(*inputs, gemm="cublas", epilogue="per-head", block_m=16), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("epilogue", ["row-block", "per-head"])
def test_one_stream_and_the_single_launch(epilogue):
    """Without a text stream (x_txt None) the kernel runs one segment; with both streams the row-block
    epilogue launches once for both: each matches the reference."""
    inputs = list(make_inputs((2, 3, 13, 40, 3, 32), "float32", "cuda" if torch.cuda.is_available() else "cpu", 0))
    inputs[0] = inputs[2] = inputs[4] = inputs[6] = inputs[7] = None  # x_txt, w_txt, b_txt, nq_txt, nk_txt
    s_txt = 3
    inputs[10], inputs[11] = inputs[10][s_txt:], inputs[11][s_txt:]  # the image positions' tables only
    out = kernel(*inputs, gemm="cublas", epilogue=epilogue, block_m=16)
    torch.testing.assert_close(out, reference(*inputs), atol=1e-4, rtol=1e-4)


def test_unknown_configs_are_refused():
    with pytest.raises(ValueError, match="gemm must be one of"):
        kernel(*make_inputs(SHAPES[0], "float32", "cpu", 0), gemm="cutlass")
    with pytest.raises(ValueError, match="block_h must be a power of 2"):
        kernel(*make_inputs(SHAPES[0], "float32", "cpu", 0), epilogue="row-block", block_h=3)
    with pytest.raises(ValueError, match="epilogue must be one of"):
        op.norm_rope(*make_inputs(SHAPES[0], "float32", "cpu", 0)[:2], *make_inputs(SHAPES[0], "float32", "cpu", 0)[6:],
                     epilogue="per-row")


def test_small_config_runs():
    """A non-default config (the variant search passes these as keywords) computes the same."""
    inputs = make_inputs((1, 3, 21, 40, 1, 32), "float32", "cuda" if torch.cuda.is_available() else "cpu", 0)
    out = kernel(*inputs, block_m=16, block_k=16, group_m=2, num_stages=2, num_warps=4)
    torch.testing.assert_close(out, reference(*inputs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("epilogue", op.EPILOGUES)
@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_norm_rope_on_the_engines_projections(shape, dtype, atol, rtol, epilogue):
    """norm_rope: the epilogue alone, on projection outputs the engine computed itself (a quantized
    linear's): matches the unfused ops on those outputs, and on plain linears' outputs it is what
    qkv_norm_rope computes."""
    inputs = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", 0)
    x_txt, x_img, w_txt, w_img, b_txt, b_img, *epi = inputs
    y_txt, y_img = torch.nn.functional.linear(x_txt, w_txt, b_txt), torch.nn.functional.linear(x_img, w_img, b_img)
    y_txt = y_txt + 0.25 * torch.randn_like(y_txt)  # any values: not the weights' product
    out = op.norm_rope(y_txt, y_img, *epi, epilogue=epilogue)
    assert op.last_path() == ("triton" if op.triton is not None and (y_img.is_cuda or TRITON_INTERPRET) else "torch")
    torch.testing.assert_close(out, op.reference_norm_rope(y_txt, y_img, *epi), atol=atol, rtol=rtol)
    y_txt = torch.nn.functional.linear(x_txt, w_txt, b_txt)
    torch.testing.assert_close(op.norm_rope(y_txt, y_img, *epi, epilogue=epilogue),
                               kernel(*inputs, gemm="cublas", epilogue=epilogue), atol=0, rtol=0)


def test_norm_rope_compiles_as_one_op():
    inputs = make_inputs(SHAPES[1], "float32", "cpu", 0)
    x_txt, x_img, w_txt, w_img, b_txt, b_img, *epilogue = inputs
    ys = torch.nn.functional.linear(x_txt, w_txt, b_txt), torch.nn.functional.linear(x_img, w_img, b_img)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    f = torch.compile(lambda a, b: op.norm_rope(a, b, *epilogue), backend=backend, fullgraph=True)
    torch.testing.assert_close(f(*ys), op.norm_rope(*ys, *epilogue), atol=0, rtol=0)
    assert any(f"optbot.{op._OP_NAME}_y.default" in g for g in graphs), graphs


def single_stream_inputs(shape, dtype, device, seed, mlp_cols=24):
    """FLUX.2's single-stream layout: one joint [txt, img] stream whose q|k|v are the first 3*H*D columns of
    the to_qkv_mlp_proj output (the MLP input follows), passed as that strided view."""
    B, s_txt, s_img, K, H, D = shape
    x_txt, x_img, w_txt, w_img, b_txt, b_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, eps, heads = make_inputs(
        shape, dtype, device, seed)
    x = torch.cat([x_txt, x_img], dim=1)
    g = torch.Generator(device="cpu").manual_seed(seed + 100)
    w_mlp = (K ** -0.5 * torch.randn(mlp_cols, K, generator=g)).to(device, w_img.dtype)
    proj = torch.nn.functional.linear(x, torch.cat([w_img, w_mlp]))
    return proj[..., :3 * H * D], (None, None, nq_img, nk_img, cos, sin, eps, heads)  # no text-stream norms


@pytest.mark.parametrize("epilogue", op.EPILOGUES)
@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_norm_rope_qk_only_on_the_single_stream_projection(shape, dtype, atol, rtol, epilogue):
    """qk_only on the q|k|v columns of a wider projection (rows strided by its full width): q and k as
    the unfused ops give them, [2, B, S, H, D], the same values as the three-output call's first two, and
    the input untouched."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    qkv, epi = single_stream_inputs(shape, dtype, device, 0)
    assert qkv.stride(1) > qkv.shape[-1], "the test must pass a strided view"
    before = qkv.clone()
    out = op.norm_rope(None, qkv, *epi, epilogue=epilogue, qk_only=True)
    assert op.last_path() == ("triton" if op.triton is not None and (qkv.is_cuda or TRITON_INTERPRET) else "torch")
    B, s_txt, s_img, K, H, D = shape
    assert out.shape == (2, B, s_txt + s_img, H, D)
    ref = op.reference_norm_rope(None, qkv, *epi, qk_only=True)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
    three = op.norm_rope(None, qkv.contiguous(), *epi, epilogue=epilogue)
    torch.testing.assert_close(out, three[:2], atol=0, rtol=0)
    assert torch.equal(qkv, before), "the kernel modified its input"


def test_norm_rope_qk_only_compiles_as_one_op():
    qkv, epi = single_stream_inputs(SHAPES[2], "float32", "cpu", 0)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    f = torch.compile(lambda y: op.norm_rope(None, y, *epi, qk_only=True), backend=backend, fullgraph=True)
    eager = op.norm_rope(None, qkv, *epi, qk_only=True)
    torch.testing.assert_close(f(qkv), eager, atol=0, rtol=0)
    assert eager.shape[0] == 2
    assert any(f"optbot.{op._OP_NAME}_y.default" in g for g in graphs), graphs
