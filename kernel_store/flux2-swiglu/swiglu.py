"""Fused SwiGLU: out = silu(x[..., :I]) * x[..., I:] in one pass (one read of x, one write of out)
instead of a slice-silu kernel, its intermediate write and a multiply kernel.

    x: [..., 2I] (rows may be strided, e.g. the MLP half of a fused projection output); out: [..., I]

With a prefix (FLUX.2's single-stream blocks concatenate the attention output before the SwiGLU and
project both with to_out): out = cat([prefix, silu(a) * b], -1), [..., P + I], written by the same
kernel, so the product is never written and read back by a separate concatenation (at the workload's
shape that copy moves 0.45 GB per block).

silu(a) is rounded to x's dtype before the product, where the unfused code rounds it, so bf16
results match the unfused path closely. Dispatch: Triton on CUDA tensors, and on CPU tensors under
TRITON_INTERPRET=1; else the torch reference (the exact ops of the unfused code).

The Triton path is a registered op, optbot::swiglu (torch.library.custom_op with a fake) that
allocates its output: torch.compile keeps it whole (no graph break, inductor does not look into it;
lessons/user-triton-kernels-must-not-write-views-under-compile.md). The torch reference stays plain
torch ops that compile traces. No `from __future__ import annotations`: custom_op reads the
annotations as types.
"""
import os
from typing import Optional

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


def reference(x: torch.Tensor, prefix: Optional[torch.Tensor] = None) -> torch.Tensor:
    half = x.shape[-1] // 2
    out = F.silu(x[..., :half]) * x[..., half:]
    return out if prefix is None else torch.cat([prefix, out], dim=-1)


if triton is not None:

    @triton.jit
    def _swiglu_kernel(X, P, OUT, n_cols, n_prefix, sx, sp, so, BLOCK_N: tl.constexpr, ROUND: tl.constexpr):
        """Output columns [0, n_prefix) copy the prefix row, [n_prefix, n_prefix + n_cols) the SwiGLU's;
        one program per row x BLOCK_N output columns (a block may straddle the boundary)."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        in_p = cols < n_prefix
        c = cols - n_prefix
        m = (c >= 0) & (c < n_cols)
        a = tl.load(X + row * sx + c, mask=m, other=0.0).to(tl.float32)
        b = tl.load(X + row * sx + n_cols + c, mask=m, other=0.0).to(tl.float32)
        act = a / (1.0 + tl.exp(-a))
        if ROUND:
            act = act.to(OUT.dtype.element_ty).to(tl.float32)
        v = act * b
        if n_prefix > 0:
            v = tl.where(in_p, tl.load(P + row * sp + cols, mask=in_p, other=0.0).to(tl.float32), v)
        tl.store(OUT + row * so + cols, v.to(OUT.dtype.element_ty), mask=in_p | m)


# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself. optbot's replay writes "reference" where the
# entry's recorded microbenchmark loses to the reference compiled by inductor (docs/store.md).
UNDER_COMPILE = "op"


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])  # [M, N]; a view (strided rows) when the leading dims allow it
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch(x: torch.Tensor, prefix: Optional[torch.Tensor], block_n: int, num_warps: int) -> torch.Tensor:
    half = x.shape[-1] // 2
    pw = 0 if prefix is None else prefix.shape[-1]
    x2 = _rows(x)
    p2 = x2 if prefix is None else _rows(prefix)  # n_prefix 0: P is never read
    out = torch.empty((x2.shape[0], pw + half), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        grid = (x2.shape[0], triton.cdiv(pw + half, block_n))
        _swiglu_kernel[grid](x2, p2, out, half, pw, x2.stride(0), p2.stride(0), out.stride(0), BLOCK_N=block_n,
                             ROUND=x.dtype != torch.float32, num_warps=num_warps)
    return out.reshape(*x.shape[:-1], pw + half)


def _register():
    """One registration per process: a second copy of this file (the store's and an engine
    worktree's are byte-identical, store check) reuses the op the first registered."""
    try:
        return torch.ops.optbot.swiglu
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op("optbot::swiglu", mutates_args=())(_launch)

    @op.register_fake
    def _fake(x, prefix, block_n, num_warps):
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2 + (0 if prefix is None else prefix.shape[-1])))

    return op


_OP = _register()


def swiglu(x: torch.Tensor, prefix: Optional[torch.Tensor] = None, block_n: int = 1024,
           num_warps: int = 4) -> torch.Tensor:
    """silu(x[..., :I]) * x[..., I:], or cat([prefix, that], -1) with a prefix of x's leading dims."""
    global _last_path
    if prefix is not None and (prefix.shape[:-1] != x.shape[:-1] or prefix.dtype != x.dtype
                               or prefix.device != x.device):
        raise ValueError(f"prefix must match x's leading dims, dtype and device: {tuple(prefix.shape)} "
                         f"{prefix.dtype} {prefix.device} vs {tuple(x.shape)} {x.dtype} {x.device}")
    if not _use_triton(x) or x.shape[-1] % 2:
        _last_path = "torch"
        return reference(x, prefix)
    _last_path = "triton"
    # The registered op only under torch.compile (one graph node, no break); eager calls the
    # function itself: custom_op's Python dispatch costs tens of microseconds a call, more than
    # the kernel at small shapes (H200 micro, benchmarks/results/h200-modes-20261201/).
    return (_OP if torch.compiler.is_compiling() else _launch)(x, prefix, int(block_n), int(num_warps))
