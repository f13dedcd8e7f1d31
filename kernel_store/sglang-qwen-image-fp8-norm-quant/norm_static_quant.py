"""LayerNorm + modulation (+ the gated residual before it) + SGLang's static FP8 quantization, one pass.

SGLang's Qwen-Image block, in its ModelOpt FP8 path, normalizes and modulates each stream's input
(img_norm1/txt_norm1: LayerNorm(x) * (1 + scale) + shift; img_norm2/txt_norm2 first add the gated
attention output to the residual) and the next FP8 linear quantizes the result with its static
input_scale. SGLang fuses all of it on Blackwell only (`try_fused_norm_scale_shift_fp8`,
`try_fused_scale_residual_norm_scale_shift_fp8`: JIT kernels for capability >= 10); on Hopper a CuTe-DSL
kernel writes the modulated row in bf16 and `_static_quant_fp8` reads it back. This kernel computes the
row once and writes the e4m3 values (and, with a residual, the new residual), which SGLang's model code
then hands to the projections as their pre-quantized input, as it does on Blackwell.

    x: [B, S, D]; scale, shift (and gate): [B, D] or [B, 1, D] rows; input_scale: one float32 value
    returns (q [B, S, D] e4m3, residual_out [B, S, D] or None)

Arithmetic, as SGLang's CuTe kernel on the GPU computes (bf16 rounding after each op, its element
type): v = round(round(gate * x) + residual) (stored as the new residual); mean and the two-pass
variance of v in float32, rstd = rsqrt(var + eps); n = round((v - mean) * rstd); y = round(round(n *
round(1 + scale)) + shift); then SGLang's quantization: clamp(y * (1 / input_scale), +-448) -> e4m3. The
launch turns Triton's fp fusion off, so each bf16 rounding stays a rounding
(lessons/rounding-emulation-needs-fp-fusion-off.md). In float32 (the CPU's tiny runs) the roundings are
no-ops.

The e4m3 store: in the kernel on the GPU; under TRITON_INTERPRET=1 the kernel stores the clamped
float32 values and torch casts them (the interpreter rounds float32 -> e4m3 wrongly near binade edges).

Dispatch: Triton on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1; else the torch reference.
Under torch.compile the Triton path is the registered op optbot::norm_static_quant (custom_op with a
fake). No `from __future__ import annotations`: custom_op reads the annotations as types.
"""
import os
from typing import Optional, Tuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

E4M3_MAX = 448.0
_last_path = ""


def last_path() -> str:
    return _last_path


def _rows(t: torch.Tensor, B: int, D: int) -> torch.Tensor:
    """[B, D], [B, 1, D], [1, D] or [D] -> [B or 1, D] (a view)."""
    if t.shape[-1] != D:
        raise ValueError(f"a modulation row of width {t.shape[-1]}, not {D}")
    r = t.reshape(-1, D)
    if r.shape[0] not in (1, B):
        raise ValueError(f"modulation rows for {r.shape[0]} samples, not {B} (or 1)")
    return r


def reference(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, input_scale: torch.Tensor, eps: float,
              residual: Optional[torch.Tensor] = None,
              gate: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The unfused arithmetic (module docstring) as torch ops in x's dtype."""
    B, S, D = x.shape
    sc, sh = _rows(scale, B, D).unsqueeze(1), _rows(shift, B, D).unsqueeze(1)
    v = x
    if residual is not None:
        v = x * _rows(gate, B, D).unsqueeze(1) if gate is not None else x
        v = v + residual
    vf = v.float()
    mean = vf.mean(dim=-1, keepdim=True)
    var = ((vf - mean) * (vf - mean)).mean(dim=-1, keepdim=True)
    n = ((vf - mean) * torch.rsqrt(var + eps)).to(x.dtype)
    y = n * (1 + sc.to(x.dtype)) + sh.to(x.dtype)
    inv = 1.0 / input_scale.to(torch.float32).reshape(())
    q = (y.float() * inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, (v if residual is not None else None)


if triton is not None:

    @triton.jit
    def _round_bf16(x, ROUND: tl.constexpr):
        # float32 -> nearest bfloat16 (ties to even), kept in float32. ROUND 2 (the GPU): the hardware's
        # conversion; 1: the same with integer ops, for the interpreter, which truncates this cast; 0: none.
        if ROUND == 2:
            return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        if ROUND == 1:
            b = x.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            return b.to(tl.float32, bitcast=True)
        return x

    @triton.jit
    def _load_v(X, R, G, row, b, c, D, sx, sr, sgb, ROUT, sro, BLOCK: tl.constexpr, EVEN: tl.constexpr,
                RESIDUAL: tl.constexpr, GATED: tl.constexpr, ROUND: tl.constexpr):
        """Block c of the row as float32 (values, columns, mask); with RESIDUAL the gated residual sum,
        stored as the new residual."""
        cols = c * BLOCK + tl.arange(0, BLOCK)
        m = cols < D
        if EVEN:
            v = tl.load(X + row * sx + cols).to(tl.float32)
        else:
            v = tl.load(X + row * sx + cols, mask=m, other=0.0).to(tl.float32)
        if RESIDUAL:
            if GATED:
                g = tl.load(G + b * sgb + cols, mask=m, other=0.0).to(tl.float32)
                v = _round_bf16(g * v, ROUND)
            r = tl.load(R + row * sr + cols, mask=m, other=0.0).to(tl.float32)
            v = _round_bf16(v + r, ROUND)
            tl.store(ROUT + row * sro + cols, v.to(ROUT.dtype.element_ty), mask=m)
        return v, cols, m

    @triton.jit
    def _store_q(Q, row, sq, v, cols, m, mean, rstd, SCALE, SHIFT, b, smb, inv, ROUND: tl.constexpr,
                 F8_STORE: tl.constexpr):
        n = _round_bf16((v - mean) * rstd, ROUND)
        sc = tl.load(SCALE + b * smb + cols, mask=m, other=0.0).to(tl.float32)
        sh = tl.load(SHIFT + b * smb + cols, mask=m, other=0.0).to(tl.float32)
        y = _round_bf16(n * _round_bf16(1.0 + sc, ROUND), ROUND)
        y = _round_bf16(y + sh, ROUND)
        y = tl.clamp(y * inv, -448.0, 448.0)
        if F8_STORE:
            y = y.to(tl.float8e4nv)
        tl.store(Q + row * sq + cols, y, mask=m)

    @triton.jit
    def _norm_static_quant_kernel(X, R, G, SCALE, SHIFT, S_IN, Q, ROUT, S, D, sx, sr, sgb, smb, sq, sro, eps,
                                  BLOCK: tl.constexpr, NB: tl.constexpr, EVEN: tl.constexpr,
                                  RESIDUAL: tl.constexpr, GATED: tl.constexpr, ROUND: tl.constexpr,
                                  F8_STORE: tl.constexpr):
        """One program per row; the row in NB (1-4) blocks of BLOCK held in registers: loads first, then
        the mean, the two-pass variance, and the quantized store. EVEN: D is NB whole blocks."""
        row = tl.program_id(0).to(tl.int64)
        b = row // S
        v0, c0, m0 = _load_v(X, R, G, row, b, 0, D, sx, sr, sgb, ROUT, sro, BLOCK, EVEN, RESIDUAL, GATED, ROUND)
        acc = tl.where(m0, v0, 0.0)
        if NB > 1:
            v1, c1, m1 = _load_v(X, R, G, row, b, 1, D, sx, sr, sgb, ROUT, sro, BLOCK, EVEN, RESIDUAL, GATED, ROUND)
            acc += tl.where(m1, v1, 0.0)
        if NB > 2:
            v2, c2, m2 = _load_v(X, R, G, row, b, 2, D, sx, sr, sgb, ROUT, sro, BLOCK, EVEN, RESIDUAL, GATED, ROUND)
            acc += tl.where(m2, v2, 0.0)
        if NB > 3:
            v3, c3, m3 = _load_v(X, R, G, row, b, 3, D, sx, sr, sgb, ROUT, sro, BLOCK, EVEN, RESIDUAL, GATED, ROUND)
            acc += tl.where(m3, v3, 0.0)
        mean = tl.sum(acc, axis=0) / D
        d0 = tl.where(m0, v0 - mean, 0.0)
        sq_acc = d0 * d0
        if NB > 1:
            d1 = tl.where(m1, v1 - mean, 0.0)
            sq_acc += d1 * d1
        if NB > 2:
            d2 = tl.where(m2, v2 - mean, 0.0)
            sq_acc += d2 * d2
        if NB > 3:
            d3 = tl.where(m3, v3 - mean, 0.0)
            sq_acc += d3 * d3
        rstd = tl.math.rsqrt(tl.sum(sq_acc, axis=0) / D + eps)
        inv = 1.0 / tl.load(S_IN).to(tl.float32)  # SGLang's _static_quant_fp8: y_s_inv = 1.0 / y_s
        _store_q(Q, row, sq, v0, c0, m0, mean, rstd, SCALE, SHIFT, b, smb, inv, ROUND, F8_STORE)
        if NB > 1:
            _store_q(Q, row, sq, v1, c1, m1, mean, rstd, SCALE, SHIFT, b, smb, inv, ROUND, F8_STORE)
        if NB > 2:
            _store_q(Q, row, sq, v2, c2, m2, mean, rstd, SCALE, SHIFT, b, smb, inv, ROUND, F8_STORE)
        if NB > 3:
            _store_q(Q, row, sq, v3, c3, m3, mean, rstd, SCALE, SHIFT, b, smb, inv, ROUND, F8_STORE)


# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself (docs/store.md).
UNDER_COMPILE = "op"
# Each bf16 rounding stays a rounding: with fp fusion on, a multiply and an add between two roundings
# contract into one bf16 FMA (lessons/rounding-emulation-needs-fp-fusion-off.md)
FP_FUSION = False
NUM_WARPS = 4
MAX_BLOCKS = 4


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _config(D: int) -> Tuple[int, int]:
    """(BLOCK, NB): D in NB exact power-of-2 blocks where it splits so (Qwen-Image's 3072: 3 of 1024, no
    lane idle); else one masked block of the next power of 2."""
    for nb in range(1, MAX_BLOCKS + 1):
        if D % nb == 0 and (D // nb) & (D // nb - 1) == 0:
            return D // nb, nb
    return triton.next_power_of_2(D), 1


def _launch(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, input_scale: torch.Tensor, eps: float,
            residual: Optional[torch.Tensor], gate: Optional[torch.Tensor],
            num_warps: int) -> Tuple[torch.Tensor, torch.Tensor]:
    B, S, D = x.shape
    x2 = x.reshape(B * S, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    sc, sh = _rows(scale, B, D), _rows(shift, B, D)
    if sc.stride(-1) != 1 or sh.stride(-1) != 1 or sc.stride(0) != sh.stride(0) or sc.shape != sh.shape:
        sc, sh = sc.contiguous(), sh.contiguous()
        if sc.shape != sh.shape:
            raise ValueError("scale and shift must have the same rows")
    smb = sc.stride(0) if sc.shape[0] > 1 else 0
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    f8_store = not interpreted
    q = torch.empty((B * S, D), dtype=torch.float8_e4m3fn if f8_store else torch.float32, device=x.device)
    rout = torch.empty_like(x2) if residual is not None else x2
    r2 = residual.reshape(B * S, D) if residual is not None else x2
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    g = _rows(gate, B, D).contiguous() if gate is not None else sc
    sgb = g.stride(0) if g.shape[0] > 1 else 0
    block, nb = _config(D)
    if B * S:
        _norm_static_quant_kernel[(B * S,)](
            x2, r2, g, sc, sh, input_scale.reshape(()), q, rout, S, D, x2.stride(0), r2.stride(0), sgb, smb,
            q.stride(0), rout.stride(0), float(eps), BLOCK=block, NB=nb, EVEN=nb * block == D,
            RESIDUAL=residual is not None, GATED=gate is not None,
            ROUND=(1 if interpreted else 2) if x.dtype == torch.bfloat16 else 0, F8_STORE=f8_store,
            num_warps=num_warps or NUM_WARPS, enable_fp_fusion=FP_FUSION)
    q = (q if f8_store else q.to(torch.float8_e4m3fn)).reshape(B, S, D)
    # a custom op may not return its input: no residual, an empty tensor in its place
    return q, (rout.reshape(B, S, D) if residual is not None else x.new_empty(0))


def _register():
    """One registration per process (the store's copy and an engine worktree's are byte-identical)."""
    try:
        return torch.ops.optbot.norm_static_quant
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op("optbot::norm_static_quant", mutates_args=())(_launch)

    @op.register_fake
    def _fake(x, scale, shift, input_scale, eps, residual, gate, num_warps):
        return (x.new_empty(x.shape, dtype=torch.float8_e4m3fn),
                x.new_empty(x.shape if residual is not None else (0,)))

    return op


_OP = _register()


def norm_static_quant(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, input_scale: torch.Tensor,
                      eps: float, residual: Optional[torch.Tensor] = None, gate: Optional[torch.Tensor] = None,
                      num_warps: int = 0) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(e4m3 values [B, S, D], the new residual or None) of LayerNorm(residual + gate * x, or x) * (1 +
    scale) + shift quantized with the static `input_scale` (module docstring)."""
    global _last_path
    if x.dim() != 3:
        raise ValueError(f"x must be [batch, tokens, hidden], not shape {tuple(x.shape)}")
    if input_scale.numel() != 1:
        raise ValueError(f"input_scale must be one value (a static per-tensor scale), not shape "
                         f"{tuple(input_scale.shape)}")
    if gate is not None and residual is None:
        raise ValueError("a gate without a residual: the gate scales x before the residual add")
    if not _use_triton(x) or x.dtype not in (torch.float32, torch.bfloat16):
        _last_path = "torch"
        return reference(x, scale, shift, input_scale, eps, residual, gate)
    _last_path = "triton"
    # the registered op under torch.compile (one node, no break); eager calls the function itself
    q, r = (_OP if torch.compiler.is_compiling() else _launch)(x, scale, shift, input_scale, float(eps), residual,
                                                                 gate, int(num_warps))
    return q, (r if residual is not None else None)
