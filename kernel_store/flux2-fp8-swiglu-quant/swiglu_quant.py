"""FLUX.2's SwiGLU (and, in the single-stream blocks, the concatenation after it) fused with the FP8
quantization of the output projection's input (FP8 deployments).

In an FP8 deployment (docs/fp8.md) the projection after a SwiGLU is a float8 linear that quantizes
its input per token on every call. FLUX.2 has two such places:
- the double-stream blocks' Flux2FeedForward: linear_in -> SwiGLU -> linear_out;
- the single-stream blocks' Flux2ParallelSelfAttnProcessor: SwiGLU of the MLP half of the fused
  projection, concatenated after the attention output, -> to_out.
Unfused, SwiGLU writes silu(a) and then silu(a) * b, the concatenation copies both parts, and the
recipe's abs, amax, divide, float32 cast, divide, clamp and e4m3 cast read the row back. This kernel
reads the attention part (when there is one) and both SwiGLU halves, computes the product rounded
where the unfused code rounds it (silu(a) to the input's dtype, then the product), takes the row's
amax over the whole concatenated row, and writes the e4m3 values and the float32 per-row scale:
the output projection's `_scaled_mm` takes them as they are.

    x: [..., 2I] (rows may be strided: the MLP slice of the fused projection's output)
    prefix: None or [..., P] (the attention output, concatenated before the SwiGLU's product)
    returns (q [M, P + I] e4m3, scale [M, 1] float32), M = x.numel() // 2I

Two recipes, each one's numerics kept exactly (`recipe`):
- "torchao" (Float8DynamicActivationFloat8WeightConfig, PerRow): amax over the row in the input's
  dtype, scale = amax / 448 computed in that dtype (a bf16 division, rounded) and then widened;
- "optbot-emulation" (runner/quant.quantize_rows): amax in float32, clamped at 1e-12, / 448.
Values: clamp(v / scale, -448, 448) rounded to e4m3 (round to nearest even) in both.

The e4m3 store: on the GPU in the kernel. Triton's interpreter rounds float32 -> e4m3 wrongly near
binade edges (lessons/triton-interpreter-e4m3-cast.md), so under TRITON_INTERPRET=1 the kernel
stores the clamped float32 values and torch casts them (RTNE, the recipes' cast). The GPU kernel test
checks the in-kernel cast against torch's bit for bit.

Dispatch: Triton on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1; else the torch
reference (the unfused code's own ops). Under torch.compile the Triton path is the registered op
optbot::swiglu_quant (custom_op with a fake) so the graph keeps it whole. No
`from __future__ import annotations`: custom_op reads the annotations as types.

The FP8 linear helpers at the end (fp8_weight, fp8_linear) are the same contract as the Qwen-Image
entry's (kernel_store/qwen-image-fp8-gelu-quant): each store entry is self-contained, because two
entries' patches cannot both add one shared file.
"""
import os
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

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
RECIPES = ("torchao", "optbot-emulation")
_last_path = ""


def last_path() -> str:
    return _last_path


def reference(x: torch.Tensor, prefix: Optional[torch.Tensor] = None,
              recipe: str = "torchao") -> Tuple[torch.Tensor, torch.Tensor]:
    """The unfused ops: Flux2SwiGLU in x's dtype, torch.cat after the prefix, then the recipe's
    per-row quantization (torchao's or the emulation's)."""
    half = x.shape[-1] // 2
    v = F.silu(x[..., :half]) * x[..., half:]
    if prefix is not None:
        v = torch.cat([prefix, v], dim=-1)
    v = v.reshape(-1, v.shape[-1])
    if recipe == "torchao":
        scale = (v.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).to(torch.float32)
    else:
        scale = v.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    q = (v.to(torch.float32) / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


if triton is not None:

    @triton.jit
    def _round_bf16(x, ROUND: tl.constexpr):
        # float32 -> nearest bfloat16 (ties to even), kept in float32. ROUND 2 (the GPU): the hardware's
        # conversion; 1: the same arithmetic with integer ops, for Triton's interpreter, which truncates a
        # float32 -> bf16 cast whatever rounding it is asked for (triton 3.9)
        if ROUND == 2:
            return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)

    # CUDA_MATH (the GPU): a tensor / Python number multiplies by the number's reciprocal, as torch's
    # CUDA kernels do (BinaryDivTrueKernel.cu): the per-row scale is the recipe's bit for bit.
    # EXACT (ARITHMETIC "exact", the GPU): per element too, the arithmetic of torch's CUDA kernels, so
    # that the fused path rounds where the unfused one does (in FP8 a last-bit difference can move a
    # value across an e4m3 rounding edge, a 6-12% step): a tensor / tensor is a correctly rounded
    # division (Triton's own float32 `/` is an approximate one there), silu calls CUDA's expf
    # (libdevice's). Off ("fast", and the interpreter): Triton's exp and division. The interpreter
    # runs numpy, whose division and exp are torch's CPU ones for these purposes (the CPU tests
    # compare bytes).
    @triton.jit
    def _div(x, y, EXACT: tl.constexpr):
        if EXACT:
            return libdevice.div_rn(x, y)
        return x / y

    @triton.jit
    def _div448(x, CUDA_MATH: tl.constexpr):
        if CUDA_MATH:
            return x * (1.0 / 448.0)
        return x / 448.0

    @triton.jit
    def _quant_store(Q, row, sq, cols, v, m, scale, F8_STORE: tl.constexpr, EXACT: tl.constexpr):
        v = tl.minimum(tl.maximum(_div(v, scale, EXACT), -448.0), 448.0)
        if F8_STORE:
            tl.store(Q + row * sq + cols, v.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=m)
        else:
            tl.store(Q + row * sq + cols, v, mask=m)

    @triton.jit
    def _ld2(X, row, sx, c, I, BLOCK_N: tl.constexpr):
        """Block c of the SwiGLU's two halves, as loaded (columns, mask)."""
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        m = cols < I
        a = tl.load(X + row * sx + cols, mask=m, other=0.0)
        b = tl.load(X + row * sx + I + cols, mask=m, other=0.0)
        return a, b, cols, m

    @triton.jit
    def _ld1(P, row, sp, c, PW, BLOCK_N: tl.constexpr):
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        m = cols < PW
        return tl.load(P + row * sp + cols, mask=m, other=0.0).to(tl.float32), cols, m

    @triton.jit
    def _act2(a, b, m, ROUND: tl.constexpr, EXACT: tl.constexpr):
        """The SwiGLU of loaded halves, F.silu's formula, rounded where the unfused code stores (silu(a) in
        x's dtype, then the product); 0 outside the row (the amax ignores it)."""
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        if EXACT:
            s = _div(a, 1.0 + libdevice.exp(-a), EXACT)
        else:
            s = a / (1.0 + tl.exp(-a))
        if ROUND:
            s = _round_bf16(s, ROUND)
            v = _round_bf16(s * b, ROUND)
        else:
            v = s * b
        return tl.where(m, v, 0.0)

    @triton.jit
    def _swiglu(X, row, sx, cols, m, I, ROUND: tl.constexpr, EXACT: tl.constexpr):
        """The two passes' form: the halves at `cols`, loaded and combined."""
        a = tl.load(X + row * sx + cols, mask=m, other=0.0)
        b = tl.load(X + row * sx + I + cols, mask=m, other=0.0)
        return _act2(a, b, m, ROUND, EXACT)

    @triton.jit
    def _swiglu_quant_kernel(X, P, Q, S, I, PW, sx, sp, sq, BLOCK_N: tl.constexpr, PC: tl.constexpr,
                                 IC: tl.constexpr, ROUND: tl.constexpr, TORCHAO: tl.constexpr,
                                 F8_STORE: tl.constexpr, CUDA_MATH: tl.constexpr, EXACT: tl.constexpr):
        """One pass, one program per row: the prefix's PC blocks (0-3) and the SwiGLU halves' IC blocks
        (1-9) all loaded before any arithmetic, the products held in registers for the row's amax (one
        reduction) and the e4m3 store: the row is read once from memory, where the two-pass kernel
        reads it again (FLUX.2's single-stream rows are 86 KB: a GPU's worth of them in flight is over
        its L2, so the second read goes to memory too)."""
        row = tl.program_id(0).to(tl.int64)
        if PC > 0:  # the blocks as separate values: Triton holds no list of tensors
            p0, pc0, pm0 = _ld1(P, row, sp, 0, PW, BLOCK_N)
        if PC > 1:
            p1, pc1, pm1 = _ld1(P, row, sp, 1, PW, BLOCK_N)
        if PC > 2:
            p2, pc2, pm2 = _ld1(P, row, sp, 2, PW, BLOCK_N)
        a0, b0, c0, m0 = _ld2(X, row, sx, 0, I, BLOCK_N)
        if IC > 1:
            a1, b1, c1, m1 = _ld2(X, row, sx, 1, I, BLOCK_N)
        if IC > 2:
            a2, b2, c2, m2 = _ld2(X, row, sx, 2, I, BLOCK_N)
        if IC > 3:
            a3, b3, c3, m3 = _ld2(X, row, sx, 3, I, BLOCK_N)
        if IC > 4:
            a4, b4, c4, m4 = _ld2(X, row, sx, 4, I, BLOCK_N)
        if IC > 5:
            a5, b5, c5, m5 = _ld2(X, row, sx, 5, I, BLOCK_N)
        if IC > 6:
            a6, b6, c6, m6 = _ld2(X, row, sx, 6, I, BLOCK_N)
        if IC > 7:
            a7, b7, c7, m7 = _ld2(X, row, sx, 7, I, BLOCK_N)
        if IC > 8:
            a8, b8, c8, m8 = _ld2(X, row, sx, 8, I, BLOCK_N)
        v0 = _act2(a0, b0, m0, ROUND, EXACT)
        am = tl.abs(v0)
        if PC > 0:
            am = tl.maximum(am, tl.abs(p0))
        if PC > 1:
            am = tl.maximum(am, tl.abs(p1))
        if PC > 2:
            am = tl.maximum(am, tl.abs(p2))
        if IC > 1:
            v1 = _act2(a1, b1, m1, ROUND, EXACT)
            am = tl.maximum(am, tl.abs(v1))
        if IC > 2:
            v2 = _act2(a2, b2, m2, ROUND, EXACT)
            am = tl.maximum(am, tl.abs(v2))
        if IC > 3:
            v3 = _act2(a3, b3, m3, ROUND, EXACT)
            am = tl.maximum(am, tl.abs(v3))
        if IC > 4:
            v4 = _act2(a4, b4, m4, ROUND, EXACT)
            am = tl.maximum(am, tl.abs(v4))
        if IC > 5:
            v5 = _act2(a5, b5, m5, ROUND, EXACT)
            am = tl.maximum(am, tl.abs(v5))
        if IC > 6:
            v6 = _act2(a6, b6, m6, ROUND, EXACT)
            am = tl.maximum(am, tl.abs(v6))
        if IC > 7:
            v7 = _act2(a7, b7, m7, ROUND, EXACT)
            am = tl.maximum(am, tl.abs(v7))
        if IC > 8:
            v8 = _act2(a8, b8, m8, ROUND, EXACT)
            am = tl.maximum(am, tl.abs(v8))
        a = tl.max(am, axis=0)
        if TORCHAO:  # amax / 448 divided in the input's dtype (bf16: rounded), then widened; no floor
            scale = _div448(a, CUDA_MATH)
            if ROUND:
                scale = _round_bf16(scale, ROUND)
        else:
            scale = _div448(tl.maximum(a, 1e-12), CUDA_MATH)
        tl.store(S + row, scale)
        if PC > 0:
            _quant_store(Q, row, sq, pc0, p0, pm0, scale, F8_STORE, EXACT)
        if PC > 1:
            _quant_store(Q, row, sq, pc1, p1, pm1, scale, F8_STORE, EXACT)
        if PC > 2:
            _quant_store(Q, row, sq, pc2, p2, pm2, scale, F8_STORE, EXACT)
        _quant_store(Q, row, sq, PW + c0, v0, m0, scale, F8_STORE, EXACT)
        if IC > 1:
            _quant_store(Q, row, sq, PW + c1, v1, m1, scale, F8_STORE, EXACT)
        if IC > 2:
            _quant_store(Q, row, sq, PW + c2, v2, m2, scale, F8_STORE, EXACT)
        if IC > 3:
            _quant_store(Q, row, sq, PW + c3, v3, m3, scale, F8_STORE, EXACT)
        if IC > 4:
            _quant_store(Q, row, sq, PW + c4, v4, m4, scale, F8_STORE, EXACT)
        if IC > 5:
            _quant_store(Q, row, sq, PW + c5, v5, m5, scale, F8_STORE, EXACT)
        if IC > 6:
            _quant_store(Q, row, sq, PW + c6, v6, m6, scale, F8_STORE, EXACT)
        if IC > 7:
            _quant_store(Q, row, sq, PW + c7, v7, m7, scale, F8_STORE, EXACT)
        if IC > 8:
            _quant_store(Q, row, sq, PW + c8, v8, m8, scale, F8_STORE, EXACT)

    @triton.jit
    def _swiglu_quant_kernel_two_pass(X, P, Q, S, I, PW, sx, sp, sq, BLOCK_N: tl.constexpr,
                                      ROUND: tl.constexpr, TORCHAO: tl.constexpr, F8_STORE: tl.constexpr,
                                      CUDA_MATH: tl.constexpr, EXACT: tl.constexpr):
        """One program per row. Pass 1: the prefix's |values| and the SwiGLU's, the row's amax.
        Pass 2 (the row is in L1/L2 by then): the same values divided by the scale, clamped, stored
        as e4m3 (float32 with F8_STORE off: the interpreter), the prefix at columns [0, PW), the
        SwiGLU at [PW, PW + I). PW = 0: no prefix."""
        row = tl.program_id(0).to(tl.int64)
        amax = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, PW, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            m = cols < PW
            p = tl.load(P + row * sp + cols, mask=m, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(p))
        for start in range(0, I, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            m = cols < I
            amax = tl.maximum(amax, tl.where(m, tl.abs(_swiglu(X, row, sx, cols, m, I, ROUND, EXACT)), 0.0))
        a = tl.max(amax, axis=0)
        if TORCHAO:  # amax / 448 divided in the input's dtype (bf16: rounded), then widened; no floor
            scale = _div448(a, CUDA_MATH)
            if ROUND:
                scale = _round_bf16(scale, ROUND)
        else:
            scale = _div448(tl.maximum(a, 1e-12), CUDA_MATH)
        tl.store(S + row, scale)
        for start in range(0, PW, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            m = cols < PW
            p = tl.load(P + row * sp + cols, mask=m, other=0.0).to(tl.float32)
            _quant_store(Q, row, sq, cols, p, m, scale, F8_STORE, EXACT)
        for start in range(0, I, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            m = cols < I
            _quant_store(Q, row, sq, PW + cols, _swiglu(X, row, sx, cols, m, I, ROUND, EXACT), m, scale, F8_STORE,
                         EXACT)


# "exact" or "fast" (the comment above _div): the GPU's per-element arithmetic. Fast since measured on an
# H100 (benchmarks/results/h100-fp8-micro-20261206/swiglu-micro.txt, CUDA-graph replays at FLUX.2's shapes):
# 16.87 ms a step against 20.10 exact and inductor's fusion 29.09, moving 1401 of 84.9M e4m3 codes at the
# largest shape (1.7e-5; the GPU test's bound is 1e-4). Exact stays, with its bit-for-bit GPU test.
ARITHMETIC = "fast"

# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself (docs/store.md).
UNDER_COMPILE = "op"

# One pass (_swiglu_quant_kernel) where the row fits: at most 3 prefix blocks and 9 SwiGLU blocks of
# block_n (FLUX.2 at 2048: 3 and 9), at 16 warps; else the two passes at 8 (_swiglu_quant_kernel_two_pass:
# its name holds the one entry.yaml declares, so the validator's engagement check sees either). The two
# are bit-identical (tests). Measured on an H100 (2026-12-06, benchmarks/results/h100-fp8-loads-first-20261206/,
# CUDA-graph replays at FLUX.2's three shapes, fast arithmetic): one pass 9.65 ms a step at 16 warps (11.71
# at 32) against the two passes' 16.52, whose second read of an 86 KB row misses the L2 once a GPU's worth
# of rows is in flight; 170 us a single-stream call, 509.6 MB at 3.0 TB/s. Unrolling the two passes' loops
# (2 or 4) changed nothing.
ONE_PASS = True
ONE_PASS_PREFIX_BLOCKS, ONE_PASS_BLOCKS = 3, 9
ONE_PASS_WARPS, TWO_PASS_WARPS = 16, 8


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])  # a view with strided rows when the leading dims allow it
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch(x: torch.Tensor, prefix: Optional[torch.Tensor], torchao: bool, block_n: int,
            num_warps: int) -> Tuple[torch.Tensor, torch.Tensor]:
    half = x.shape[-1] // 2
    x2 = _rows(x)
    M = x2.shape[0]
    p2 = _rows(prefix) if prefix is not None else x2  # PW = 0: P is never read
    pw = prefix.shape[-1] if prefix is not None else 0
    # the interpreter, not the device, decides: its e4m3 rounding is wrong (module docstring) and it has
    # no libdevice (an emulated CUDA-graph capture on the CPU makes tensors say is_cuda)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    f8_store = not interpreted
    q = torch.empty((M, pw + half), dtype=torch.float8_e4m3fn if f8_store else torch.float32, device=x.device)
    scale = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    pc, ic = -(-pw // block_n), -(-half // block_n)
    one_pass = ONE_PASS and pc <= ONE_PASS_PREFIX_BLOCKS and 1 <= ic <= ONE_PASS_BLOCKS
    num_warps = num_warps or (ONE_PASS_WARPS if one_pass else TWO_PASS_WARPS)
    if M and one_pass:
        _swiglu_quant_kernel[(M,)](x2, p2, q, scale, half, pw, x2.stride(0), p2.stride(0), q.stride(0),
                                       BLOCK_N=block_n, PC=pc, IC=ic, ROUND=(1 if interpreted else 2) if x.dtype == torch.bfloat16 else 0,
                                       TORCHAO=torchao, F8_STORE=f8_store,
                                       CUDA_MATH=not interpreted and libdevice is not None,
                                       EXACT=not interpreted and libdevice is not None and ARITHMETIC == "exact",
                                       num_warps=num_warps)
    elif M:
        _swiglu_quant_kernel_two_pass[(M,)](x2, p2, q, scale, half, pw, x2.stride(0), p2.stride(0), q.stride(0),
                                   BLOCK_N=block_n, ROUND=(1 if interpreted else 2) if x.dtype == torch.bfloat16 else 0, TORCHAO=torchao,
                                   F8_STORE=f8_store, CUDA_MATH=not interpreted and libdevice is not None,
                                   EXACT=not interpreted and libdevice is not None and ARITHMETIC == "exact",
                                   num_warps=num_warps)
    return (q if f8_store else q.to(torch.float8_e4m3fn)), scale


def _register():
    """One registration per process (the store's copy and an engine worktree's are byte-identical)."""
    try:
        return torch.ops.optbot.swiglu_quant
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op("optbot::swiglu_quant", mutates_args=())(_launch)

    @op.register_fake
    def _fake(x, prefix, torchao, block_n, num_warps):
        n = x.shape[-1]
        m = x.numel() // n if n else 0
        width = n // 2 + (prefix.shape[-1] if prefix is not None else 0)
        return x.new_empty((m, width), dtype=torch.float8_e4m3fn), x.new_empty((m, 1), dtype=torch.float32)

    return op


_OP = _register()


def swiglu_quant(x: torch.Tensor, prefix: Optional[torch.Tensor] = None, recipe: str = "torchao",
                 block_n: int = 2048, num_warps: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [M, P + I], float32 scales [M, 1]) of cat([prefix, swiglu(x)], -1) under `recipe`
    (module docstring). One pass where the row fits ONE_PASS's blocks of block_n, else two;
    num_warps 0: that form's measured default."""
    global _last_path
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, not {recipe!r}")
    if ARITHMETIC not in ("fast", "exact"):
        raise ValueError(f"ARITHMETIC must be 'fast' or 'exact', not {ARITHMETIC!r}")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (the SwiGLU's two halves), not {x.shape[-1]}")
    if prefix is not None and (prefix.shape[:-1] != x.shape[:-1] or prefix.dtype != x.dtype
                               or prefix.device != x.device):
        raise ValueError(f"prefix must match x's leading dims, dtype and device: {tuple(prefix.shape)} "
                         f"{prefix.dtype} {prefix.device} vs {tuple(x.shape)} {x.dtype} {x.device}")
    if not _use_triton(x) or x.dtype not in (torch.float32, torch.bfloat16):  # fp16: the reference
        _last_path = "torch"
        return reference(x, prefix, recipe)
    _last_path = "triton"
    if block_n <= 0 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of 2, not {block_n}")
    # the registered op under torch.compile (one node, no break); eager calls the function itself
    # (custom_op's Python dispatch costs tens of microseconds a call)
    return (_OP if torch.compiler.is_compiling() else _launch)(x, prefix, recipe == "torchao", int(block_n),
                                                               int(num_warps))


# ---- the FP8 linear this feeds --------------------------------------------------------------

class Fp8Weight:
    """What an output projection's FP8 GEMM needs from a quantized nn.Linear: e4m3 weight [N, K],
    per-output-channel scales [1, N], the recipe, whether the bias goes into `_scaled_mm`'s
    epilogue (torchao) or is added after it (optbot's emulation), and torchao's fast-accumulation
    setting."""

    def __init__(self, w8, w_scale, recipe, bias_in_gemm, fast_accum):
        self.w8, self.w_scale, self.recipe = w8, w_scale, recipe
        self.bias_in_gemm, self.fast_accum = bias_in_gemm, fast_accum


def fp8_weight(linear: torch.nn.Module):
    """The linear's FP8 weight when it is one of the two recipes with per-row activation scales
    (docs/fp8.md), else None (a plain, or otherwise quantized, linear keeps its own forward)."""
    w8 = getattr(linear, "w8", None)  # optbot's emulation (runner/quant.Fp8Linear)
    if isinstance(w8, torch.Tensor) and w8.dtype == torch.float8_e4m3fn and w8.dim() == 2:
        ws = getattr(linear, "w_scale", None)
        if isinstance(ws, torch.Tensor) and tuple(ws.shape) == (1, w8.shape[0]):
            return Fp8Weight(w8, ws, "optbot-emulation", False, False)
        return None
    w = getattr(linear, "weight", None)
    # torchao's Float8Tensor with per-row weight scales and per-row dynamic e4m3 activations
    if type(w).__name__ != "Float8Tensor" or not hasattr(w, "qdata") or not hasattr(w, "scale"):
        return None
    qd, sc = w.qdata, w.scale
    if qd.dtype != torch.float8_e4m3fn or qd.dim() != 2 or tuple(sc.shape) != (qd.shape[0], 1):
        return None
    act = getattr(w, "act_quant_kwargs", None)
    gran = getattr(act, "granularity", None) if act is not None else None
    if act is None or type(gran).__name__ != "PerRow" or getattr(act, "float8_dtype", None) != torch.float8_e4m3fn:
        return None
    if getattr(act, "hp_value_lb", None) is not None or getattr(act, "hp_value_ub", None) is not None:
        return None  # clamped amax: another scale than the kernel's
    mm = getattr(w, "mm_config", None)
    return Fp8Weight(qd, sc.t(), "torchao", True, bool(getattr(mm, "use_fast_accum", False)))


def fp8_linear(q: torch.Tensor, scale: torch.Tensor, w: Fp8Weight, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """The projection on pre-quantized rows, as the recipe computes it: [M, N_out]."""
    if w.bias_in_gemm:
        return torch._scaled_mm(q, w.w8.t(), scale_a=scale, scale_b=w.w_scale, bias=bias, out_dtype=out_dtype,
                                use_fast_accum=w.fast_accum)
    out = torch._scaled_mm(q, w.w8.t(), scale_a=scale, scale_b=w.w_scale, out_dtype=out_dtype)
    return out + bias if bias is not None else out
