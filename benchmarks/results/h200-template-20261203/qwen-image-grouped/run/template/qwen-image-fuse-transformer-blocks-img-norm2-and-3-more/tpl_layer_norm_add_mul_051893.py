"""Template-generated (optbot, bot/generate/template): layer_norm -> add -> mul -> add in one row kernel.

    tpl_layer_norm_add_mul_051893(a0, a1, a2) -> [..., N], N = 3072 where captured
    a0: row [1, 4096, 3072] (bf16), graph value 206
    a1: bcast [1, 1, 3072] (bf16), graph value 214
    a2: bcast [1, 1, 3072] (bf16), graph value 213

Replaces graph ops [162, 167, 168, 169] (diffusers/models/transformers/transformer_qwenimage.py:674, diffusers/models/transformers/transformer_qwenimage.py:728); [47, 52, 53, 54] (diffusers/models/transformers/transformer_qwenimage.py:674, diffusers/models/transformers/transformer_qwenimage.py:698); [176, 181, 182, 183] (diffusers/models/transformers/transformer_qwenimage.py:674, diffusers/models/transformers/transformer_qwenimage.py:734); [204, 209, 210, 211] (diffusers/models/transformers/transformer_qwenimage.py:674, diffusers/models/transformers/transformer_qwenimage.py:702). Dispatch: Triton on CUDA tensors and on
CPU under TRITON_INTERPRET=1, else the torch reference; under torch.compile the reference (UNDER_COMPILE),
or the registered op optbot::tpl_layer_norm_add_mul_051893 with UNDER_COMPILE = "op". No `from __future__ import annotations`: custom_op reads the
annotations as types.
"""
import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_last_path = ""


def last_path() -> str:
    return _last_path


def reference(a0, a1, a2):
    # the captured ops, in their order (graph ops 162, 167, 168, 169)
    t0 = F.layer_norm(a0, (a0.shape[-1],), None, None, 1e-06)
    t1 = a1 + 1.0
    t2 = t0 * t1
    t3 = t2 + a2
    return t3


if triton is not None:

    @triton.jit
    def _tpl_layer_norm_add_mul_051893_kernel(A0, A1, A2, OUT, L1, L2, N, s0_0, s0_1, s0_2, s0_3, s1_0, s1_1, s1_2, s1_3, s2_0, s2_1, s2_2, s2_3,
                       BLOCK_N: tl.constexpr, ROUND: tl.constexpr):
        row = tl.program_id(0)  # one row of the output per program; rows index up to 3 leading dims
        i2 = row % L2
        i1 = (row // L2) % L1
        i0 = row // (L1 * L2)
        cols = tl.arange(0, BLOCK_N)
        m = cols < N
        a0 = tl.load(A0 + i0 * s0_0 + i1 * s0_1 + i2 * s0_2 + cols * s0_3, mask=m, other=0.0).to(tl.float32)
        a1 = tl.load(A1 + i0 * s1_0 + i1 * s1_1 + i2 * s1_2 + cols * s1_3, mask=m, other=0.0).to(tl.float32)
        a2 = tl.load(A2 + i0 * s2_0 + i1 * s2_1 + i2 * s2_2 + cols * s2_3, mask=m, other=0.0).to(tl.float32)
        t0_mu = tl.sum(tl.where(m, a0, 0.0), axis=0) / N
        t0_xc = tl.where(m, a0 - t0_mu, 0.0)
        t0 = t0_xc * tl.rsqrt(tl.sum(t0_xc * t0_xc, axis=0) / N + 1e-06)
        if ROUND:  # the unfused op stores t0 in the activation dtype
            t0 = t0.to(OUT.dtype.element_ty).to(tl.float32)
        t1 = a1 + 1.0
        if ROUND:  # the unfused op stores t1 in the activation dtype
            t1 = t1.to(OUT.dtype.element_ty).to(tl.float32)
        t2 = t0 * t1
        if ROUND:  # the unfused op stores t2 in the activation dtype
            t2 = t2.to(OUT.dtype.element_ty).to(tl.float32)
        t3 = t2 + a2
        if ROUND:  # the unfused op stores t3 in the activation dtype
            t3 = t3.to(OUT.dtype.element_ty).to(tl.float32)
        tl.store(OUT + row * N + cols, t3.to(OUT.dtype.element_ty), mask=m)


# Under torch.compile the kernel steps aside and the reference's ops run, which inductor fuses into
# one kernel of its own: these are the pointwise / row chains inductor generates best, and as a
# registered op the kernel also keeps inductor from fusing it with its neighbours (FLUX.2's SwiGLU
# on the H200, 2026-12-02: eager 1.034x, compile 0.989x with the op). "op" calls the registered op.
UNDER_COMPILE = "reference"


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _out_dtype(a0, a1, a2) -> torch.dtype:
    return a0.dtype


def _strides4(t: torch.Tensor, shape) -> list:
    """t broadcast to shape (stride 0 over broadcast dims), strides padded to rank 4."""
    s = list(t.expand(shape).stride())
    return [0] * (4 - len(s)) + s


def _run(a0: torch.Tensor, a1: torch.Tensor, a2: torch.Tensor, num_warps: int) -> torch.Tensor:
    shape = torch.broadcast_shapes(a0.shape, a1.shape, a2.shape,)
    out = torch.empty(shape, dtype=_out_dtype(a0, a1, a2), device=a0.device)
    lead = [1] * (4 - len(shape)) + list(shape)
    N = lead[3]
    if out.numel():
        _tpl_layer_norm_add_mul_051893_kernel[(lead[0] * lead[1] * lead[2],)](
            a0, a1, a2, out, lead[1], lead[2], N,
            *_strides4(a0, shape), *_strides4(a1, shape), *_strides4(a2, shape),
            BLOCK_N=triton.next_power_of_2(N), ROUND=out.dtype != torch.float32, num_warps=int(num_warps))
    return out


def _register(name: str, fn, fake):
    """One registration per process: a second copy of this file (store and engine worktree) reuses it."""
    try:
        return getattr(torch.ops.optbot, name)
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op(f"optbot::{name}", mutates_args=())(fn)
    op.register_fake(fake)
    return op


def _fake(a0, a1, a2, num_warps):
    shape = torch.broadcast_shapes(a0.shape, a1.shape, a2.shape,)
    return a0.new_empty(shape, dtype=_out_dtype(a0, a1, a2))


_OP = _register("tpl_layer_norm_add_mul_051893", _run, _fake)


# The config site (variant search rewrites these defaults).
def _launch(a0, a1, a2, num_warps: int = 4):
    fn = _OP if torch.compiler.is_compiling() else _run
    return fn(a0, a1, a2, int(num_warps))


def tpl_layer_norm_add_mul_051893(a0, a1, a2):
    global _last_path
    if not _use_triton(a0):
        _last_path = "torch"
        return reference(a0, a1, a2)
    _last_path = "triton"
    return _launch(a0, a1, a2)
