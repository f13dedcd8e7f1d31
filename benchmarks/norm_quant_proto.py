"""Prototype, not a store entry: Qwen-Image's LayerNorm (no affine) + adaLN modulation fused with the FP8
per-row quantization of its output, one pass, emitting the e4m3 values and float32 scales the next FP8
linear's `_scaled_mm` takes (issue 16's "normalization (+ modulation) fused with the activation
quantization that follows").

Why a prototype first: an entry needs the patch to hand the FP8 values on past three other entries
that patch the same lines (norm-modulate, the QKV epilogue, the MLP's GELU), and whether it pays
depends on what inductor already does with the unfused ops under compile (the `:aside` stack hands
it the norm, the modulation and the quantization together). `benchmarks/gelu_quant_micro.py --kernel
norm-quant` times this kernel against that fusion and against what the stack runs today (the store's
norm + modulation kernel, then inductor's quantization of its output), at Qwen-Image's shapes.

    norm_modulate_quant(x [M, D], shift [D], scale [D], eps) -> (q [M, D] e4m3, s [M, 1] float32)

The numerics of the unfused bf16 ops and torchao's PerRow recipe: the normalized x, 1 + scale, the
product and the sum each rounded to bf16 where the unfused code stores them (as the store's
qwen_norm_modulate kernel does), then amax / 448 rounded to bf16, values clamped to +-448 and rounded
to e4m3. Arithmetic "fast" (Triton's division) or "exact" (a correctly rounded division), as in
kernel_store/qwen-image-fp8-gelu-quant. Under TRITON_INTERPRET=1 the kernel stores float32 values and
torch rounds them to e4m3 (the interpreter's e4m3 cast is wrong near binade edges).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # the reference still runs
    triton = None

E4M3_MAX = 448.0


def reference(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6):
    """The unfused ops: LayerNorm without affine, * (1 + scale) + shift in x's dtype, then torchao's
    per-row quantization (amax / 448 in x's dtype, widened)."""
    return quantize_rows(F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale) + shift)


def quantize_rows(y: torch.Tensor):
    """torchao's PerRow activation quantization of y: (e4m3 values, float32 scales [M, 1])."""
    s = (y.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).to(torch.float32)
    return (y.to(torch.float32) / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


if triton is not None:

    @triton.jit
    def _round_bf16(x):
        # float32 -> nearest bf16 (ties to even), kept in float32, with integer ops (the interpreter
        # truncates a float32 -> bf16 cast)
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)

    @triton.jit
    def _norm_mod_quant_kernel(X, SHIFT, SCALE, Q, S, D, sx, sq, eps, BLOCK_D: tl.constexpr,
                               ROUND: tl.constexpr, EXACT: tl.constexpr, F8_STORE: tl.constexpr):
        """One program per row, the row whole in registers: mean, variance, the modulation, the
        row's amax, then the e4m3 values and the scale."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        m = cols < D
        x = tl.load(X + row * sx + cols, mask=m, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / D
        xc = tl.where(m, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / D
        n = xc * (1.0 / tl.sqrt(var + eps))
        sc = 1.0 + tl.load(SCALE + cols, mask=m, other=0.0).to(tl.float32)
        sh = tl.load(SHIFT + cols, mask=m, other=0.0).to(tl.float32)
        if ROUND:
            n = _round_bf16(n)
            sc = _round_bf16(sc)
            y = _round_bf16(_round_bf16(n * sc) + sh)
        else:
            y = n * sc + sh
        a = tl.max(tl.where(m, tl.abs(y), 0.0), axis=0)
        s = a * (1.0 / 448.0)
        if ROUND:
            s = _round_bf16(s)
        tl.store(S + row, s)
        if EXACT:
            v = libdevice.div_rn(y, s)
        else:
            v = y / s
        v = tl.minimum(tl.maximum(v, -448.0), 448.0)
        if F8_STORE:
            tl.store(Q + row * sq + cols, v.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=m)
        else:
            tl.store(Q + row * sq + cols, v, mask=m)


def norm_modulate_quant(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6,
                        exact: bool = False, num_warps: int = 0):
    """(e4m3 [M, D], float32 [M, 1]); x [M, D] with unit column stride, shift and scale [D]."""
    if (triton is None or x.dim() != 2 or x.stride(-1) != 1 or tuple(shift.shape) != (x.shape[-1],)
            or tuple(scale.shape) != (x.shape[-1],)):
        raise ValueError("norm_modulate_quant takes x [M, D] (unit column stride), shift and scale [D], and Triton")
    M, D = x.shape
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    q = torch.empty((M, D), dtype=torch.float32 if interpreted else torch.float8_e4m3fn, device=x.device)
    s = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(D)
    if M:
        _norm_mod_quant_kernel[(M,)](x, shift.contiguous(), scale.contiguous(), q, s, D, x.stride(0), q.stride(0),
                                     float(eps), BLOCK_D=block, ROUND=x.dtype == torch.bfloat16,
                                     EXACT=exact and not interpreted, F8_STORE=not interpreted,
                                     num_warps=num_warps or min(16, max(4, block // 256)))
    return (q.to(torch.float8_e4m3fn) if interpreted else q), s
