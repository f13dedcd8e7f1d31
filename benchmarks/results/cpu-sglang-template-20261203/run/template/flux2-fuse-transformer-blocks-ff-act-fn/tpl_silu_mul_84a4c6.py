"""Template-generated (optbot, bot/generate/template): silu -> mul in one row kernel.

    tpl_silu_mul_84a4c6(a0, a1) -> [..., N], N = 384 where captured
    a0: row [1, 256, 384] (f32), graph value 228
    a1: row [1, 256, 384] (f32), graph value 230

Replaces graph ops [189, 191] (sglang/multimodal_gen/runtime/models/dits/flux_2.py:520); [413, 415] (sglang/multimodal_gen/runtime/models/dits/flux_2.py:520); [205, 207] (sglang/multimodal_gen/runtime/models/dits/flux_2.py:520). Dispatch: Triton on CUDA tensors and on
CPU under TRITON_INTERPRET=1, else the torch reference; under torch.compile the reference (UNDER_COMPILE),
or the registered op optbot::tpl_silu_mul_84a4c6 with UNDER_COMPILE = "op". No `from __future__ import annotations`: custom_op reads the
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


def reference(a0, a1):
    # the captured ops, in their order (graph ops 189, 191)
    t0 = F.silu(a0)
    t1 = t0 * a1
    return t1


if triton is not None:

    @triton.jit
    def _tpl_silu_mul_84a4c6_kernel(A0, A1, OUT, L1, L2, N, s0_0, s0_1, s0_2, s0_3, s1_0, s1_1, s1_2, s1_3,
                       BLOCK_N: tl.constexpr, ROUND: tl.constexpr):
        row = tl.program_id(0)  # one row of the output per program; rows index up to 3 leading dims
        i2 = row % L2
        i1 = (row // L2) % L1
        i0 = row // (L1 * L2)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            m = cols < N
            a0 = tl.load(A0 + i0 * s0_0 + i1 * s0_1 + i2 * s0_2 + cols * s0_3, mask=m, other=0.0).to(tl.float32)
            a1 = tl.load(A1 + i0 * s1_0 + i1 * s1_1 + i2 * s1_2 + cols * s1_3, mask=m, other=0.0).to(tl.float32)
            t0 = a0 * tl.sigmoid(a0)
            if ROUND:  # the unfused op stores t0 in the activation dtype
                t0 = t0.to(OUT.dtype.element_ty).to(tl.float32)
            t1 = t0 * a1
            if ROUND:  # the unfused op stores t1 in the activation dtype
                t1 = t1.to(OUT.dtype.element_ty).to(tl.float32)
            tl.store(OUT + row * N + cols, t1.to(OUT.dtype.element_ty), mask=m)


# Under torch.compile the kernel steps aside and the reference's ops run, which inductor fuses into
# one kernel of its own: these are the pointwise / row chains inductor generates best, and as a
# registered op the kernel also keeps inductor from fusing it with its neighbours (FLUX.2's SwiGLU
# on the H200, 2026-12-02: eager 1.034x, compile 0.989x with the op). "op" calls the registered op.
UNDER_COMPILE = "reference"


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _out_dtype(a0, a1) -> torch.dtype:
    return a0.dtype


def _strides4(t: torch.Tensor, shape) -> list:
    """t broadcast to shape (stride 0 over broadcast dims), strides padded to rank 4."""
    s = list(t.expand(shape).stride())
    return [0] * (4 - len(s)) + s


def _run(a0: torch.Tensor, a1: torch.Tensor, block_n: int, num_warps: int) -> torch.Tensor:
    shape = torch.broadcast_shapes(a0.shape, a1.shape,)
    out = torch.empty(shape, dtype=_out_dtype(a0, a1), device=a0.device)
    lead = [1] * (4 - len(shape)) + list(shape)
    N = lead[3]
    if out.numel():
        _tpl_silu_mul_84a4c6_kernel[(lead[0] * lead[1] * lead[2],)](
            a0, a1, out, lead[1], lead[2], N,
            *_strides4(a0, shape), *_strides4(a1, shape),
            BLOCK_N=min(int(block_n), triton.next_power_of_2(N)), ROUND=out.dtype != torch.float32, num_warps=int(num_warps))
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


def _fake(a0, a1, block_n, num_warps):
    shape = torch.broadcast_shapes(a0.shape, a1.shape,)
    return a0.new_empty(shape, dtype=_out_dtype(a0, a1))


_OP = _register("tpl_silu_mul_84a4c6", _run, _fake)


# The config site (variant search rewrites these defaults).
def _launch(a0, a1, block_n: int = 1024, num_warps: int = 4):
    fn = _OP if torch.compiler.is_compiling() else _run
    return fn(a0, a1, int(block_n), int(num_warps))


def tpl_silu_mul_84a4c6(a0, a1):
    global _last_path
    if not _use_triton(a0):
        _last_path = "torch"
        return reference(a0, a1)
    _last_path = "triton"
    return _launch(a0, a1)
