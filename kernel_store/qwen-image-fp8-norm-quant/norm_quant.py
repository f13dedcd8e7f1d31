"""Qwen-Image's LayerNorm + adaLN modulation fused with the FP8 quantization of its output (FP8 deployments).

In an FP8 deployment (docs/fp8.md) every consumer of a block's normalized and modulated stream is a
float8 linear (the merged QKV projection after norm1, the MLP's up projection after norm2) that
quantizes its input per token on every call. Unfused: the norm + modulation writes y in bf16, then
the recipe reads y back for the row's amax and again for the e4m3 values. This kernel reads x once,
computes the norm and the modulation with the unfused code's bf16 roundings, takes the row's amax and
writes the e4m3 values and float32 per-row scales the consumer's `_scaled_mm` takes (`Fp8Rows`).

    norm_modulate_quant(x [B, S, D], shift [B, D], scale [B, D], eps, recipe)
        -> (q [B*S, D] e4m3, scale [B*S, 1] float32)

Numerics: layer_norm without affine (mean, biased variance, * 1/sqrt(var + eps)), then
y = n * (1 + scale) + shift with n, 1 + scale, the product and y rounded to bf16 where the unfused
code stores them; then the recipe's per-row quantization of y, as kernel_store's gelu_quant does it:
"torchao" (amax / 448 divided in y's dtype, rounded, widened; no floor) or "optbot-emulation" (float32
amax clamped at 1e-12, / 448); values clamp(y / scale, -448, 448) rounded to e4m3 (RTNE).

Arithmetic on the GPU (`ARITHMETIC`, as in gelu_quant.py): "fast" (the default) divides with Triton's
own float32 division; "exact" with a correctly rounded one. Measured as a prototype on an H100
(2026-12-06, benchmarks/results/h100-fp8-micro-20261206/norm-quant-micro.txt, CUDA-graph replays, 240
calls of each Qwen-Image shape a step): 8.33 ms a step for the image calls at 8 warps (2.2x the byte
bound) against 13.30 for the store's norm + modulation kernel followed by inductor's quantization and
12.09 for inductor's own fusion; it moved 2317 of 12.6M e4m3 codes from the unfused ops' (the store
kernel + quantization moved 188,180; "exact" moved 9).

Under TRITON_INTERPRET=1 the kernel stores the clamped float32 values and torch casts them (the
interpreter's e4m3 cast is wrong near binade edges; gelu_quant.py's docstring). Dispatch: Triton on
CUDA tensors and under the interpreter; else the torch reference. Under torch.compile the Triton path
is the registered op optbot::norm_modulate_quant (custom_op with a fake). No
`from __future__ import annotations`: custom_op reads the annotations as types.
"""
import os
from typing import Tuple

import torch
import torch.nn.functional as F

try:  # the engine's package
    from . import gelu_quant as _gq
except ImportError:  # a kernel store folder, this file loaded by its path: the sibling file, once per process
    import importlib.util as _ilu
    import sys as _sys

    _name = "optbot_store_gelu_quant_" + str(abs(hash(os.path.dirname(os.path.abspath(__file__)))))
    if _name not in _sys.modules:
        _spec = _ilu.spec_from_file_location(_name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gelu_quant.py"))
        _sys.modules[_name] = _ilu.module_from_spec(_spec)
        _spec.loader.exec_module(_sys.modules[_name])
    _gq = _sys.modules[_name]
# the sibling's FP8 linear, and its bf16 rounding (a jit function; absent without triton)
RECIPES, fp8_linear, fp8_weight, _round_bf16 = _gq.RECIPES, _gq.fp8_linear, _gq.fp8_weight, getattr(_gq, "_round_bf16", None)

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
    """shift / scale as [B, D] ([B, D] or [B, 1, D] accepted)."""
    if t.dim() == 3 and t.shape[1] == 1:
        t = t[:, 0]
    if tuple(t.shape) != (B, D):
        raise ValueError(f"shift and scale must be [B, D] or [B, 1, D] with B={B}, D={D}, not {tuple(t.shape)}")
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
    """The unfused ops: layer_norm (no affine), * (1 + scale) + shift in x's dtype, then the recipe."""
    B, S, D = x.shape
    shift, scale = _bd(shift, B, D)[:, None], _bd(scale, B, D)[:, None]
    return quantize_rows(F.layer_norm(x, (D,), eps=eps) * (1 + scale) + shift, recipe)


if triton is not None:

    @triton.jit
    def _mod_vectors(SCALE, SHIFT, moff, cols, m, ROUND: tl.constexpr, EVEN: tl.constexpr):
        """(1 + scale, shift) at `cols` as float32, 1 + scale rounded where the unfused code stores it."""
        if EVEN:
            sc = 1.0 + tl.load(SCALE + moff + cols).to(tl.float32)
            sh = tl.load(SHIFT + moff + cols).to(tl.float32)
        else:
            sc = 1.0 + tl.load(SCALE + moff + cols, mask=m, other=0.0).to(tl.float32)
            sh = tl.load(SHIFT + moff + cols, mask=m, other=0.0).to(tl.float32)
        if ROUND:
            sc = _round_bf16(sc, ROUND)
        return sc, sh

    @triton.jit
    def _modulate(n, sc, sh, ROUND: tl.constexpr):
        """y = n * (1 + scale) + shift for the normalized values n (sc, sh: _mod_vectors)."""
        if ROUND:  # where the unfused code stores each value in bf16
            return _round_bf16(_round_bf16(_round_bf16(n, ROUND) * sc, ROUND) + sh, ROUND)
        return n * sc + sh

    @triton.jit
    def _row_scale(a, ROUND: tl.constexpr, TORCHAO: tl.constexpr, CUDA_MATH: tl.constexpr):
        """The recipe's per-row scale from the row's amax a."""
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
        return s

    @triton.jit
    def _store_e4m3(Q, row, sq, cols, m, y, s, F8_STORE: tl.constexpr, EXACT: tl.constexpr, EVEN: tl.constexpr):
        """clamp(y / s, -448, 448) at `cols` of the row, as e4m3 (RTNE), or as float32 under the interpreter."""
        if EXACT:
            v = libdevice.div_rn(y, s)
        else:
            v = y / s
        v = tl.minimum(tl.maximum(v, -448.0), 448.0)
        if F8_STORE:
            v = v.to(tl.float8e4nv, fp_downcast_rounding="rtne")
        if EVEN:
            tl.store(Q + row * sq + cols, v)
        else:
            tl.store(Q + row * sq + cols, v, mask=m)

    @triton.jit
    def _load_block(xrow, c, D, BLOCK: tl.constexpr, EVEN: tl.constexpr):
        """Block c of the row as float32, its columns and mask (EVEN: the row is whole blocks, no mask)."""
        cols = c * BLOCK + tl.arange(0, BLOCK)
        m = cols < D
        if EVEN:
            x = tl.load(xrow + cols).to(tl.float32)
        else:
            x = tl.load(xrow + cols, mask=m, other=0.0).to(tl.float32)
        return x, cols, m

    @triton.jit
    def _centered(x, mean, m, EVEN: tl.constexpr):
        if EVEN:
            return x - mean
        return tl.where(m, x - mean, 0.0)

    @triton.jit
    def _modulated(xc, rstd, SCALE, SHIFT, moff, cols, m, ROUND: tl.constexpr, EVEN: tl.constexpr):
        sc, sh = _mod_vectors(SCALE, SHIFT, moff, cols, m, ROUND, EVEN)
        return _modulate(xc * rstd, sc, sh, ROUND)

    @triton.jit
    def _abs(y, m, EVEN: tl.constexpr):
        if EVEN:
            return tl.abs(y)
        return tl.where(m, tl.abs(y), 0.0)

    @triton.jit
    def _norm_mod_quant_kernel(X, SHIFT, SCALE, Q, S_OUT, S, D, sxb, sxs, smb, sq, eps,
                               BLOCK: tl.constexpr, NB: tl.constexpr, EVEN: tl.constexpr, ROUND: tl.constexpr,
                               TORCHAO: tl.constexpr, F8_STORE: tl.constexpr, CUDA_MATH: tl.constexpr,
                               EXACT: tl.constexpr):
        """One program per token, its row whole in registers as NB (1-4) blocks of BLOCK values (Qwen-
        Image's 3072: three of 1024, no lane idle; Triton holds no list of tensors, hence x0..x3): mean,
        variance, the modulation, the row's amax, then the e4m3 values and the scale. The blocks' sums
        are added lane by lane before one reduction each, so a row has three reductions, as with one
        block."""
        row = tl.program_id(0).to(tl.int64)
        b = row // S
        t = row % S
        xrow = X + b * sxb + t * sxs
        moff = b * smb
        x0, c0, m0 = _load_block(xrow, 0, D, BLOCK, EVEN)
        acc = x0
        if NB > 1:
            x1, c1, m1 = _load_block(xrow, 1, D, BLOCK, EVEN)
            acc += x1
        if NB > 2:
            x2, c2, m2 = _load_block(xrow, 2, D, BLOCK, EVEN)
            acc += x2
        if NB > 3:
            x3, c3, m3 = _load_block(xrow, 3, D, BLOCK, EVEN)
            acc += x3
        mean = tl.sum(acc, axis=0) / D
        x0 = _centered(x0, mean, m0, EVEN)
        acc = x0 * x0
        if NB > 1:
            x1 = _centered(x1, mean, m1, EVEN)
            acc += x1 * x1
        if NB > 2:
            x2 = _centered(x2, mean, m2, EVEN)
            acc += x2 * x2
        if NB > 3:
            x3 = _centered(x3, mean, m3, EVEN)
            acc += x3 * x3
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)
        y0 = _modulated(x0, rstd, SCALE, SHIFT, moff, c0, m0, ROUND, EVEN)
        am = _abs(y0, m0, EVEN)
        if NB > 1:
            y1 = _modulated(x1, rstd, SCALE, SHIFT, moff, c1, m1, ROUND, EVEN)
            am = tl.maximum(am, _abs(y1, m1, EVEN))
        if NB > 2:
            y2 = _modulated(x2, rstd, SCALE, SHIFT, moff, c2, m2, ROUND, EVEN)
            am = tl.maximum(am, _abs(y2, m2, EVEN))
        if NB > 3:
            y3 = _modulated(x3, rstd, SCALE, SHIFT, moff, c3, m3, ROUND, EVEN)
            am = tl.maximum(am, _abs(y3, m3, EVEN))
        s = _row_scale(tl.max(am, axis=0), ROUND, TORCHAO, CUDA_MATH)
        tl.store(S_OUT + row, s)
        _store_e4m3(Q, row, sq, c0, m0, y0, s, F8_STORE, EXACT, EVEN)
        if NB > 1:
            _store_e4m3(Q, row, sq, c1, m1, y1, s, F8_STORE, EXACT, EVEN)
        if NB > 2:
            _store_e4m3(Q, row, sq, c2, m2, y2, s, F8_STORE, EXACT, EVEN)
        if NB > 3:
            _store_e4m3(Q, row, sq, c3, m3, y3, s, F8_STORE, EXACT, EVEN)


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

# 4 warps for a 3072-wide row. With three 1024-wide blocks (the default since 2026-12-07), on an H100:
# 5.03 ms a step (both shapes) against 5.33 at 8 and 4.86 at 2, which won the image shape (16.2 against
# 17.1 us) and lost the text one (4.1 against 3.9), inside the run's spread: 4 stays
# (benchmarks/results/h100-fp8-s12-20261207/micro-norm/, with the bf16 FMA contraction FP_FUSION now
# removes). With the row as one 4096-lane block (BLOCKS 1): 9.49 ms a step against 10.54 at 8
# and 12.07 at 16 (benchmarks/results/h100-fp8-loads-first-20261206/norm-quant-micro.txt, 2026-12-06;
# the prototype's microbenchmark had measured 8 against 16 only). Issuing the shift and scale loads
# before the row's reductions changed nothing there (36.8 against 37.4 us an image call): not kept.
NUM_WARPS = 4

# The row in registers as at most MAX_BLOCKS blocks (BLOCKS: 0 the fewest blocks with no lane idle, as
# _blocks picks; n: n blocks, the last one padded). Why: the kernel is bound by the instructions it
# issues, not its bytes (2026-12-07, SASS of the sm_90 build on the CPU, benchmarks/kernel_sass.py):
# at 4 warps the one-block form held 56 registers (9 programs an SM, so not register-bound, and the
# chunked form measured slower: 42.7 against 33.3 us an image call, h100-fp8-norm-micro-20261207/) and
# issued 1392 instructions a thread for 32 lanes of a 4096-lane block: 43 an element, about 20 of them
# the integer bf16 rounding, and a quarter of the lanes idle for a 3072-wide row. 4096 rows x 128
# threads x 1392 instructions / (132 SMs x 4 warp instructions a cycle) is about 25 us at 1.75 GHz,
# most of the 33.3 measured. Three 1024-wide blocks (no idle lane, no masks) and the hardware's bf16
# conversion (ROUND 2) cut that to about 12 us, under the 15.5 us byte bound. Predicted on an H100:
# 33 -> 18-21 us an image call, 9.5 -> 5.5-6.5 ms a Qwen-Image step in its microbenchmark; measured
# 33.1 -> 17.1 us, 9.40 -> 5.03 ms (h100-fp8-s12-20261207/micro-norm/, before FP_FUSION: 584 -> 616
# instructions a thread since).
BLOCKS = 0
MAX_BLOCKS = 4


def _blocks(d: int, blocks: int) -> Tuple[int, int]:
    """(BLOCK, NB) for a d-wide row: the fewest blocks (1 to MAX_BLOCKS) with the fewest idle lanes, or
    `blocks` blocks."""
    if blocks:
        return triton.next_power_of_2(-(-d // blocks)), blocks
    fits = [(c * triton.next_power_of_2(-(-d // c)) - d, c) for c in range(1, MAX_BLOCKS + 1)]
    nb = min(fits)[1]
    return triton.next_power_of_2(-(-d // nb)), nb


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _launch(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float, torchao: bool,
            num_warps: int, blocks: int) -> Tuple[torch.Tensor, torch.Tensor]:
    B, S, D = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if shift.stride(-1) != 1 or scale.stride(-1) != 1 or shift.stride(0) != scale.stride(0):
        shift, scale = shift.contiguous(), scale.contiguous()
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # (module docstring: the interpreter decides)
    f8_store = not interpreted
    q = torch.empty((B * S, D), dtype=torch.float8_e4m3fn if f8_store else torch.float32, device=x.device)
    s = torch.empty((B * S, 1), dtype=torch.float32, device=x.device)
    # ROUND 0: float32, nothing rounded; 1 the interpreter's integer rounding; 2 the GPU's own (_round_bf16)
    flags = dict(ROUND=(1 if interpreted else 2) if x.dtype == torch.bfloat16 else 0, TORCHAO=torchao, F8_STORE=f8_store,
                 CUDA_MATH=not interpreted and libdevice is not None,
                 EXACT=not interpreted and libdevice is not None and ARITHMETIC == "exact", num_warps=num_warps,
                 enable_fp_fusion=FP_FUSION)
    args = (x, shift, scale, q, s, S, D, x.stride(0), x.stride(1), scale.stride(0), q.stride(0), float(eps))
    if B * S:
        block, nb = _blocks(D, blocks)
        _norm_mod_quant_kernel[(B * S,)](*args, BLOCK=block, NB=nb, EVEN=block * nb == D, **flags)
    return (q if f8_store else q.to(torch.float8_e4m3fn)), s


def _register():
    """One registration per process (the store's copy and an engine worktree's are byte-identical)."""
    try:
        return torch.ops.optbot.norm_modulate_quant
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op("optbot::norm_modulate_quant", mutates_args=())(_launch)

    @op.register_fake
    def _fake(x, shift, scale, eps, torchao, num_warps, blocks):
        m = x.shape[0] * x.shape[1]
        return (x.new_empty((m, x.shape[2]), dtype=torch.float8_e4m3fn),
                x.new_empty((m, 1), dtype=torch.float32))

    return op


_OP = _register()


def norm_modulate_quant(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                        recipe: str = "torchao", num_warps: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [B*S, D], float32 [B*S, 1]): the recipe's quantization of layer_norm(x) * (1 + scale) + shift
    (module docstring). x [B, S, D]; shift, scale [B, D] or [B, 1, D]."""
    global _last_path
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, not {recipe!r}")
    if ARITHMETIC not in ("fast", "exact"):
        raise ValueError(f"ARITHMETIC must be 'fast' or 'exact', not {ARITHMETIC!r}")
    if type(BLOCKS) is not int or not 0 <= BLOCKS <= MAX_BLOCKS:
        raise ValueError(f"BLOCKS must be 0 (the fewest with no idle lane) to {MAX_BLOCKS}, not {BLOCKS!r}")
    if x.dim() != 3:
        raise ValueError(f"x must be [B, S, D], not {tuple(x.shape)}")
    B, S, D = x.shape
    shift, scale = _bd(shift, B, D), _bd(scale, B, D)
    if not _use_triton(x) or x.dtype not in (torch.float32, torch.bfloat16):  # fp16: the reference
        _last_path = "torch"
        return reference(x, shift, scale, eps, recipe)
    _last_path = "triton"
    # the registered op under torch.compile (one node, no break); eager calls the function itself
    return (_OP if torch.compiler.is_compiling() else _launch)(x, shift, scale, float(eps), recipe == "torchao",
                                                               int(num_warps or NUM_WARPS), int(BLOCKS))


class Fp8Rows:
    """A stream's normalized, modulated tokens as its consumers' FP8 GEMMs take them: e4m3 values
    [B*S, D] and float32 per-token scales [B*S, 1], under one recipe; shape, dtype and device are the
    bf16 tensor's it stands for. Only `linear` reads the values: the block hands Fp8Rows only to
    consumers that call it (transformer_qwenimage._optbot_fp8_rows)."""

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
