"""FLUX.2's LayerNorm + adaLN modulation (with the double-stream blocks' gated residual add before norm2)
fused with the FP8 quantization of its output (FP8 deployments).

In an FP8 deployment (docs/fp8.md) every consumer of a FLUX.2 block's normalized and modulated stream
is a float8 linear that quantizes its input per token on every call: the merged QKV projections and
the feed-forward's `linear_in` in the double-stream blocks, `to_qkv_mlp_proj` in the single-stream
blocks. The store's norm + modulation kernel writes y in bf16 and the recipe reads it back. These
kernels read x once (or, before norm2, the residual, the gate and the attention output, writing the
new residual), compute the norm and the modulation with the unfused code's bf16 roundings, and write
the e4m3 values and float32 per-row scales the consumer's `_scaled_mm` takes (`Fp8Rows`).

    norm_modulate_quant(x [B, S, D], shift, scale [B, D] or [B, 1, D], eps, recipe)
        -> (q [B*S, D] e4m3, scale [B*S, 1] float32)
    gate_residual_norm_modulate_quant(h, gate, y [B, S, D] / [B, D], shift, scale, eps, recipe)
        -> (h + gate * y [B, S, D], q, scale)

Numerics: h + gate * y with the product and the sum rounded to bf16 (the unfused code's), layer_norm
without affine (mean, biased variance, * 1/sqrt(var + eps)), then (1 + scale) * n + shift with n,
1 + scale, the product and the sum rounded to bf16; then the recipe's per-row quantization, as
kernel_store's swiglu_quant does it: "torchao" (amax / 448 divided in y's dtype, rounded, widened; no
floor) or "optbot-emulation" (float32 amax clamped at 1e-12, / 448); values clamp(y / scale, -448, 448)
rounded to e4m3 (RTNE). `ARITHMETIC` "fast" (the default, Triton's division) or "exact" (a correctly
rounded one), as kernel_store/qwen-image-fp8-norm-quant's kernel, whose Qwen-Image form measured 9.80
ms a step on an H100 against 15.69 for a norm kernel followed by inductor's quantization.

Under TRITON_INTERPRET=1 the kernels store float32 values and torch casts them (the interpreter's
e4m3 cast is wrong near binade edges). Dispatch: Triton on CUDA tensors and under the interpreter;
else the torch reference. Under torch.compile the registered ops optbot::flux2_norm_quant and
optbot::flux2_gate_residual_norm_quant (custom_op with fakes). No `from __future__ import
annotations`: custom_op reads the annotations as types.
"""
import os
from typing import Tuple

import torch
import torch.nn.functional as F

try:  # the engine's package
    from .swiglu_quant import RECIPES, fp8_linear, fp8_weight
except ImportError:  # a kernel store folder, this file loaded by its path: the sibling file, once per process
    import importlib.util as _ilu
    import sys as _sys

    _name = "optbot_store_swiglu_quant_" + str(abs(hash(os.path.dirname(os.path.abspath(__file__)))))
    if _name not in _sys.modules:
        _spec = _ilu.spec_from_file_location(_name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "swiglu_quant.py"))
        _sys.modules[_name] = _ilu.module_from_spec(_spec)
        _spec.loader.exec_module(_sys.modules[_name])
    RECIPES, fp8_linear, fp8_weight = (getattr(_sys.modules[_name], n) for n in ("RECIPES", "fp8_linear", "fp8_weight"))

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
try:
    from triton.language.extra import libdevice
except ImportError:
    libdevice = None

E4M3_MAX = 448.0
_last_path = ""


def last_path() -> str:
    return _last_path


def _bd(t: torch.Tensor, B: int, D: int) -> torch.Tensor:
    """A per-batch modulation tensor (shift, scale, gate) as [B, D] ([B, D] or [B, 1, D] accepted)."""
    if t.dim() == 3 and t.shape[1] == 1:
        t = t[:, 0]
    if tuple(t.shape) != (B, D):
        raise ValueError(f"shift, scale and gate must be [B, D] or [B, 1, D] with B={B}, D={D}, not {tuple(t.shape)}")
    return t


def quantize_rows(y: torch.Tensor, recipe: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """The recipe's per-row quantization of y [..., D]: (e4m3 [M, D], float32 [M, 1])."""
    y = y.reshape(-1, y.shape[-1])
    if recipe == "torchao":
        s = (y.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).to(torch.float32)
    else:
        s = y.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    return (y.to(torch.float32) / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


def reference(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
              recipe: str = "torchao") -> Tuple[torch.Tensor, torch.Tensor]:
    """The unfused ops: (1 + scale) * layer_norm(x) + shift in x's dtype (FLUX.2's order), then the recipe."""
    B, S, D = x.shape
    shift, scale = _bd(shift, B, D)[:, None], _bd(scale, B, D)[:, None]
    return quantize_rows((1 + scale) * F.layer_norm(x, (D,), eps=eps) + shift, recipe)


def reference_residual(h, gate, y, shift, scale, eps, recipe: str = "torchao"):
    """h + gate * y, then reference() of it: (the new residual, e4m3 values, scales)."""
    B, S, D = h.shape
    h = h + _bd(gate, B, D)[:, None] * y
    return (h, *reference(h, shift, scale, eps, recipe))


if triton is not None:

    @triton.jit
    def _round_bf16(x, ROUND: tl.constexpr):
        # float32 -> nearest bf16 (ties to even), kept in float32. ROUND 2 (the GPU): the hardware's
        # conversion; 1: the same arithmetic with integer ops, for the interpreter, which truncates a
        # float32 -> bf16 cast (about 6 instructions an element each time: lessons/a-row-kernel-can-be-
        # bound-by-the-instructions-it-issues.md)
        if ROUND == 2:
            return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)

    @triton.jit
    def _flux2_norm_quant_kernel(X, G, Y, SHIFT, SCALE, HOUT, Q, S_OUT, S, D, sxb, sxs, syb, sys_, smb, shob, shos,
                                 sq, eps, BLOCK_D: tl.constexpr, RESIDUAL: tl.constexpr, ROUND: tl.constexpr,
                                 TORCHAO: tl.constexpr, F8_STORE: tl.constexpr, CUDA_MATH: tl.constexpr,
                                 EXACT: tl.constexpr):
        """One program per token, its row whole in registers: (the gated residual add,) mean, variance,
        the modulation, the row's amax, then the e4m3 values and the scale."""
        row = tl.program_id(0).to(tl.int64)
        b = row // S
        t = row % S
        cols = tl.arange(0, BLOCK_D)
        m = cols < D
        x = tl.load(X + b * sxb + t * sxs + cols, mask=m, other=0.0).to(tl.float32)
        if RESIDUAL:  # h + gate * y, each rounded where the unfused code stores it; the new residual kept
            g = tl.load(G + b * smb + cols, mask=m, other=0.0).to(tl.float32)
            yy = tl.load(Y + b * syb + t * sys_ + cols, mask=m, other=0.0).to(tl.float32)
            gy = g * yy
            if ROUND:
                gy = _round_bf16(gy, ROUND)
            x = x + gy
            if ROUND:
                x = _round_bf16(x, ROUND)
            tl.store(HOUT + b * shob + t * shos + cols, x.to(HOUT.dtype.element_ty), mask=m)
        mean = tl.sum(x, axis=0) / D
        xc = tl.where(m, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / D
        n = xc * (1.0 / tl.sqrt(var + eps))
        sc = 1.0 + tl.load(SCALE + b * smb + cols, mask=m, other=0.0).to(tl.float32)
        sh = tl.load(SHIFT + b * smb + cols, mask=m, other=0.0).to(tl.float32)
        if ROUND:  # (1 + scale) * n + shift, each value rounded to bf16 where the unfused code stores it
            y = _round_bf16(_round_bf16(_round_bf16(sc, ROUND) * _round_bf16(n, ROUND), ROUND) + sh, ROUND)
        else:
            y = sc * n + sh
        a = tl.max(tl.where(m, tl.abs(y), 0.0), axis=0)
        if TORCHAO:  # amax / 448 in y's dtype (bf16: rounded), widened; no floor
            if CUDA_MATH:  # a tensor / Python number: torch's CUDA kernels multiply by the reciprocal
                s = a * (1.0 / 448.0)
            else:
                s = a / 448.0
            if ROUND:
                s = _round_bf16(s, ROUND)
        else:
            if CUDA_MATH:
                s = tl.maximum(a, 1e-12) * (1.0 / 448.0)
            else:
                s = tl.maximum(a, 1e-12) / 448.0
        tl.store(S_OUT + row, s)
        if EXACT:
            v = libdevice.div_rn(y, s)
        else:
            v = y / s
        v = tl.minimum(tl.maximum(v, -448.0), 448.0)
        if F8_STORE:
            tl.store(Q + row * sq + cols, v.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=m)
        else:
            tl.store(Q + row * sq + cols, v, mask=m)


# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself (docs/store.md).
UNDER_COMPILE = "op"

# Triton's fp fusion, off for this file's kernel: where the kernel rounds to bf16 as the unfused code stores
# (x.to(bf16).to(fp32)), LLVM narrows the multiply and the add between two roundings to bf16 and fusion
# contracts them into one bf16 FMA: one rounding where the unfused code rounds twice (on an H100 4% of
# qwen-image-fp8-norm-quant's e4m3 codes then differed from eager's, 0.02% without;
# lessons/rounding-emulation-needs-fp-fusion-off.md). benchmarks/kernel_sass.py counts such FMAs.
FP_FUSION = False

# "fast" or "exact" (module docstring): the GPU's arithmetic; the interpreter always computes as numpy
ARITHMETIC = "fast"

# 8 warps, as measured for Qwen-Image's 3072-wide rows on an H100 (kernel_store/qwen-image-fp8-norm-quant);
# FLUX.2's rows are 6144 wide (8192 lanes), unmeasured: variant search's num_warps
NUM_WARPS = 8


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _run(x, gate, y, shift, scale, eps: float, torchao: bool, num_warps: int, residual: bool):
    B, S, D = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    mods = [t if t.stride(-1) == 1 else t.contiguous() for t in (shift, scale, gate if residual else shift)]
    if len({t.stride(0) for t in mods}) != 1:
        mods = [t.contiguous() for t in mods]
    shift, scale, g = mods
    yy = (y if y.stride(-1) == 1 else y.contiguous()) if residual else x
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # (module docstring: the interpreter decides)
    f8_store = not interpreted
    q = torch.empty((B * S, D), dtype=torch.float8_e4m3fn if f8_store else torch.float32, device=x.device)
    s = torch.empty((B * S, 1), dtype=torch.float32, device=x.device)
    hout = torch.empty((B, S, D), dtype=x.dtype, device=x.device) if residual else q
    if B * S:
        _flux2_norm_quant_kernel[(B * S,)](
            x, g, yy, shift, scale, hout, q, s, S, D, x.stride(0), x.stride(1), yy.stride(0), yy.stride(1),
            scale.stride(0), hout.stride(0) if residual else 0, hout.stride(1) if residual else 0, q.stride(0),
            float(eps), BLOCK_D=triton.next_power_of_2(D), RESIDUAL=residual,
            ROUND=(1 if interpreted else 2) if x.dtype == torch.bfloat16 else 0,
            TORCHAO=torchao, F8_STORE=f8_store, CUDA_MATH=not interpreted and libdevice is not None,
            EXACT=not interpreted and libdevice is not None and ARITHMETIC == "exact", num_warps=num_warps,
            enable_fp_fusion=FP_FUSION)
    q = q if f8_store else q.to(torch.float8_e4m3fn)
    return (hout, q, s) if residual else (q, s)


def _norm_quant_op(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float, torchao: bool,
                   num_warps: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _run(x, None, None, shift, scale, eps, torchao, num_warps, False)


def _gate_residual_op(h: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor,
                      eps: float, torchao: bool, num_warps: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run(h, gate, y, shift, scale, eps, torchao, num_warps, True)


def _register(name: str, fn, fake):
    """One registration per process (the store's copy and an engine worktree's are byte-identical)."""
    try:
        return getattr(torch.ops.optbot, name)
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op(f"optbot::{name}", mutates_args=())(fn)
    op.register_fake(fake)
    return op


def _fake_rows(x):
    m = x.shape[0] * x.shape[1]
    return x.new_empty((m, x.shape[2]), dtype=torch.float8_e4m3fn), x.new_empty((m, 1), dtype=torch.float32)


_NORM_QUANT = _register("flux2_norm_quant", _norm_quant_op,
                        lambda x, shift, scale, eps, torchao, num_warps: _fake_rows(x))
_GATE_RESIDUAL = _register("flux2_gate_residual_norm_quant", _gate_residual_op,
                           lambda h, gate, y, shift, scale, eps, torchao, num_warps: (h.new_empty(h.shape), *_fake_rows(h)))


def _check(recipe: str, x: torch.Tensor, *mods: torch.Tensor):
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, not {recipe!r}")
    if ARITHMETIC not in ("fast", "exact"):
        raise ValueError(f"ARITHMETIC must be 'fast' or 'exact', not {ARITHMETIC!r}")
    if x.dim() != 3:
        raise ValueError(f"x must be [B, S, D], not {tuple(x.shape)}")
    return [_bd(t, x.shape[0], x.shape[2]) for t in mods]


def norm_modulate_quant(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                        recipe: str = "torchao", num_warps: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [B*S, D], float32 [B*S, 1]): the recipe's quantization of (1 + scale) * layer_norm(x) + shift
    (module docstring). x [B, S, D]; shift, scale [B, D] or [B, 1, D]."""
    global _last_path
    shift, scale = _check(recipe, x, shift, scale)
    if not _use_triton(x) or x.dtype not in (torch.float32, torch.bfloat16):  # fp16: the reference
        _last_path = "torch"
        return reference(x, shift, scale, eps, recipe)
    _last_path = "triton"
    # the registered op under torch.compile (one node, no break); eager calls the function itself
    return (_NORM_QUANT if torch.compiler.is_compiling() else _norm_quant_op)(
        x, shift, scale, float(eps), recipe == "torchao", int(num_warps or NUM_WARPS))


def gate_residual_norm_modulate_quant(h: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, shift: torch.Tensor,
                                      scale: torch.Tensor, eps: float, recipe: str = "torchao", num_warps: int = 0):
    """(h + gate * y [B, S, D], e4m3 [B*S, D], float32 [B*S, 1]): the new residual, and the recipe's
    quantization of (1 + scale) * layer_norm(it) + shift. gate, shift, scale [B, D] or [B, 1, D]."""
    global _last_path
    gate, shift, scale = _check(recipe, h, gate, shift, scale)
    if tuple(y.shape) != tuple(h.shape):
        raise ValueError(f"y must be h's shape {tuple(h.shape)}, not {tuple(y.shape)}")
    if not _use_triton(h) or h.dtype not in (torch.float32, torch.bfloat16):
        _last_path = "torch"
        return reference_residual(h, gate, y, shift, scale, eps, recipe)
    _last_path = "triton"
    return (_GATE_RESIDUAL if torch.compiler.is_compiling() else _gate_residual_op)(
        h, gate, y, shift, scale, float(eps), recipe == "torchao", int(num_warps or NUM_WARPS))


class Fp8Rows:
    """A stream's normalized, modulated tokens as its consumers' FP8 GEMMs take them: e4m3 values
    [B*S, D] and float32 per-token scales [B*S, 1], under one recipe; shape, dtype and device are the
    bf16 tensor's it stands for. Only `linear` reads the values: the block hands Fp8Rows only to
    consumers that call it (transformer_flux2._optbot_fp8_rows)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, shape: torch.Size, dtype: torch.dtype, recipe: str):
        self.q, self.scale, self.shape, self.dtype, self.recipe = q, scale, shape, dtype, recipe
        self.device = q.device

    def linear(self, module: torch.nn.Module) -> torch.Tensor:
        """module(x) for the FP8 linear `module` of this recipe: its `_scaled_mm` on the rows, [..., N]."""
        w = fp8_weight(module)
        if w is None or w.recipe != self.recipe:
            raise TypeError(f"Fp8Rows ({self.recipe}) handed to {type(module).__name__}, not an FP8 linear of that recipe")
        out = fp8_linear(self.q, self.scale, w, module.bias, self.dtype)
        return out.reshape(*self.shape[:-1], out.shape[-1])


def rows_linear(module: torch.nn.Module, x) -> torch.Tensor:
    """module(x), where x may be Fp8Rows (its consumer's GEMM on the quantized rows)."""
    return x.linear(module) if isinstance(x, Fp8Rows) else module(x)
