"""Gated residual update with the projection's bias absorbed: one pass instead of three.

    gate_bias_residual(residual, gate, y, bias)  -> residual + gate * (y + bias)

    residual, y: [B, S, D] (rows may be strided; last dim contiguous)
    gate:        [B, 1, D] (a strided chunk of the modulation vector, broadcast over tokens)
                 or [B, S, D] (per-token gate, Qwen-Image's modulate_index path)
    bias:        [D] or None

y is the output projection computed WITHOUT its bias (linear_deferring_bias): the unfused code runs
a biased GEMM, then gate * y (a full [B, S, D] intermediate), then residual + that. Here the bias
add, the gate and the residual add are one read of y and residual and one write. Intermediates are
rounded to the activation dtype where the unfused code stores them (y + bias, gate * y), so bf16
results track the unfused path. Dispatch: Triton on CUDA tensors, and on CPU tensors under
TRITON_INTERPRET=1; else the torch reference. The engine only defers a bias when the Triton path will
run (fuses()), so on a plain CPU the patched engine runs the exact ops of the base.

The fused path is a registered op, optbot::gate_bias_residual (torch.library.custom_op with a fake)
that allocates its output: torch.compile keeps it whole (no graph break, inductor does not look into
it; lessons/user-triton-kernels-must-not-write-views-under-compile.md). The torch reference stays
plain torch ops that compile traces. No `from __future__ import annotations`: custom_op reads the
annotations as types.
"""
import os
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_last_path = ""
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def last_path() -> str:
    return _last_path


def reference(residual, gate, y, bias=None):
    if bias is not None:
        y = y + bias
    return residual + gate * y


if triton is not None:

    @triton.jit
    def _gate_bias_residual_kernel(R, G, Y, BIAS, OUT, M, S, D, srb, srs, sgb, sgs, syb, sys_,
                                   HAS_BIAS: tl.constexpr, ROUND: tl.constexpr,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        # a BLOCK_M x BLOCK_N tile of the [B*S, D] rows: several tokens per program (fewer programs
        # for the interpreter, enough bytes in flight per program on the GPU)
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        cm = cols < D
        m = (rows < M)[:, None] & cm[None, :]
        b = rows // S
        s = rows - b * S
        c = cols[None, :]
        y = tl.load(Y + (b * syb + s * sys_)[:, None] + c, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(BIAS + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
            if ROUND:
                y = y.to(OUT.dtype.element_ty).to(tl.float32)
        # gate stride over tokens is 0 when it is broadcast: the same [D] row, served from cache
        g = tl.load(G + (b * sgb + s * sgs)[:, None] + c, mask=m, other=0.0).to(tl.float32)
        gy = g * y
        if ROUND:
            gy = gy.to(OUT.dtype.element_ty).to(tl.float32)
        r = tl.load(R + (b * srb + s * srs)[:, None] + c, mask=m, other=0.0).to(tl.float32)
        tl.store(OUT + rows[:, None] * D + c, (r + gy).to(OUT.dtype.element_ty), mask=m)


# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself. optbot's replay writes "reference" where the
# entry's recorded microbenchmark loses to the reference compiled by inductor (docs/store.md).
UNDER_COMPILE = "op"

# Triton's fp fusion, off for this file's kernel: where the kernel rounds to bf16 as the unfused code stores
# (x.to(bf16).to(fp32)), LLVM narrows the multiply and the add between two roundings to bf16 and fusion
# contracts them into one bf16 FMA: one rounding where the unfused code rounds twice (on an H100 4% of
# qwen-image-fp8-norm-quant's e4m3 codes then differed from eager's, 0.02% without;
# lessons/rounding-emulation-needs-fp-fusion-off.md). benchmarks/kernel_sass.py counts such FMAs.
FP_FUSION = False


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def fuses(x: torch.Tensor) -> bool:
    """Will a gated residual update on tensors like x take the fused path? (Then a bias is worth
    deferring to it.) No under autograd: the kernel has no backward."""
    return (_use_triton(x) and x.dtype in _DTYPES
            and not (torch.is_grad_enabled() and x.requires_grad))


def _fusable(residual, gate, y, bias) -> bool:
    ts = (residual, gate, y) if bias is None else (residual, gate, y, bias)
    if not fuses(residual) or residual.dim() != 3 or y.shape != residual.shape or gate.dim() != 3:
        return False
    if any(t.dtype != residual.dtype or t.device != residual.device for t in ts):
        return False  # mixed dtypes promote in torch: leave that to the reference
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return False
    if bias is not None and tuple(bias.shape) != (residual.shape[-1],):
        return False
    try:
        return torch.broadcast_shapes(gate.shape, residual.shape) == residual.shape
    except RuntimeError:
        return False


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(residual: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, bias: Optional[torch.Tensor],
            block_m: int, block_n: int, num_warps: int) -> torch.Tensor:
    B, S, D = residual.shape
    residual, y = _rows(residual), _rows(y)
    gate = _rows(gate.expand(B, S, D))
    out = torch.empty((B, S, D), dtype=residual.dtype, device=residual.device)
    M = B * S
    if M:
        grid = (triton.cdiv(M, block_m), triton.cdiv(D, block_n))
        _gate_bias_residual_kernel[grid](
            residual, gate, y, bias if bias is not None else y, out, M, S, D,
            residual.stride(0), residual.stride(1), gate.stride(0), gate.stride(1), y.stride(0), y.stride(1),
            HAS_BIAS=bias is not None, ROUND=residual.dtype != torch.float32,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, enable_fp_fusion=FP_FUSION)
    return out


def _register():
    """One registration per process: a second copy of this file (the store's and an engine
    worktree's are byte-identical, store check) reuses the op the first registered."""
    try:
        return torch.ops.optbot.gate_bias_residual
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op("optbot::gate_bias_residual", mutates_args=())(_launch)

    @op.register_fake
    def _fake(residual, gate, y, bias, block_m, block_n, num_warps):
        return residual.new_empty(residual.shape)

    return op


_OP = _register()


def gate_bias_residual(residual, gate, y, bias=None, *, block_m: int | None = None,
                       block_n: int | None = None, num_warps: int | None = None):
    """residual + gate * (y + bias) (bias None: residual + gate * y) in one pass; see the module doc."""
    global _last_path
    if not _fusable(residual, gate, y, bias):
        _last_path = "torch"
        return reference(residual, gate, y, bias)
    D = residual.shape[-1]
    if block_n is None:
        # GPU: 1024 divides Qwen-Image's 3072 (no masked lanes); interpreter: one tile across the row
        block_n = min(triton.next_power_of_2(D), 1024 if residual.is_cuda else 4096)
    if block_m is None:
        block_m = 4 if residual.is_cuda else max(1, 8192 // block_n)
    _last_path = "triton"
    # The registered op only under torch.compile (one graph node, no break); eager calls the
    # function itself: custom_op's Python dispatch costs tens of microseconds a call, more than
    # the kernel at small shapes (H200 micro, benchmarks/results/h200-modes-20261201/).
    return (_OP if torch.compiler.is_compiling() else _launch)(residual, gate, y, bias, int(block_m), int(block_n), int(num_warps or 4))


def linear_deferring_bias(linear: nn.Module, x: torch.Tensor):
    """(linear(x) without its bias, the bias) when the fused update will add it; else (linear(x), None).

    Only a plain nn.Linear whose forward is not replaced at instance level (diffusers / accelerate
    hooks, e.g. offloading, do that) and not under autocast (its output dtype would differ from the
    bias's). The module is not called, so torch forward hooks on it do not fire: the GEMM is
    attributed to the caller's module in a profile. Parameters and state-dict keys are unchanged."""
    if (type(linear) is nn.Linear and linear.bias is not None and "forward" not in vars(linear)
            and fuses(x) and not torch.is_autocast_enabled(x.device.type)
            and not (torch.is_grad_enabled() and linear.weight.requires_grad)):
        # one 2-D GEMM, as the biased path's addmm: a 3-D input whose batch stride is not dense (a
        # token slice of the joint attention output, B = 1) would go to bmm instead
        y = F.linear(x.reshape(-1, x.shape[-1]), linear.weight)
        return y.view(*x.shape[:-1], y.shape[-1]), linear.bias
    return linear(x), None


def run_deferring_bias(modules, x: torch.Tensor):
    """x through `modules` in order (what nn.Sequential and diffusers' FeedForward.forward do), the
    last one through linear_deferring_bias."""
    *head, last = modules
    for m in head:
        x = m(x)
    return linear_deferring_bias(last, x)
