"""The MLP's tanh GELU and the FP8 quantization of its output in one pass (FP8 deployments).

In an FP8 deployment (docs/fp8.md) the MLP's down projection is a float8 linear that quantizes its
input per token on every call: GELU writes g = gelu(h) in bf16, then abs, amax, divide, clamp and
a cast to e4m3 read g back (torchao's recipe: six kernels in eager; inductor fuses them under
compile). This kernel computes the GELU from h, rounds it to h's dtype where the unfused code
stores g, takes the row's amax, and writes the e4m3 values and the float32 per-row scale (a row of up
to 16384 values is read once and its GELU kept in registers, in up to four blocks; a longer one is
read twice, the second time from cache): the down projection's `_scaled_mm` takes them as they are.

    h: [M, N] (the up projection's output, bf16 on the GPU); returns (q [M, N] e4m3, scale [M, 1] f32)

Two recipes, the numerics of each kept exactly (`recipe`):
- "torchao" (Float8DynamicActivationFloat8WeightConfig, PerRow): amax over the row in the input's
  dtype, scale = amax / 448 computed in that dtype (a bf16 division, rounded) and then widened;
- "optbot-emulation" (runner/quant.quantize_rows): amax in float32, clamped at 1e-12, / 448.
Values: clamp(g / scale, -448, 448) rounded to e4m3 (round to nearest even) in both.

The e4m3 store: on the GPU in the kernel. Triton's interpreter rounds float32 -> e4m3 wrongly near
binade edges (measured with triton 3.9: 1.5-4% of random values off by one binade), so under
TRITON_INTERPRET=1 the kernel stores the clamped float32 values and torch casts them (RTNE, the
cast the recipes use). The GPU kernel test checks the in-kernel cast against torch's bit for bit.

Arithmetic on the GPU (`ARITHMETIC`): "fast" (the default) computes tanh through exp and divides
with Triton's own float32 division, as inductor's kernels divide; "exact" computes as torch's CUDA
kernels do (libdevice's tanhf, a correctly rounded division). Measured on an H100 (2026-12-06,
benchmarks/gelu_quant_micro.py): fast 98 us an image call against exact's 142 and inductor's fusion
154 (71 us since the row's loads come before its reduction: ONE_PASS_MAX's comment), and its e4m3 bytes and scales equal the unfused ops' at both of Qwen-Image's shapes (0 of 56.6M
codes differ: g is rounded to bf16 before it is quantized, which absorbs the last bits).

Dispatch: Triton on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1; else the torch
reference (the recipes' own ops). Under torch.compile the Triton path is the registered op
optbot::gelu_quant (custom_op with a fake) so the graph keeps it whole. No
`from __future__ import annotations`: custom_op reads the annotations as types.
"""
import os
from typing import Tuple

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


def reference(h: torch.Tensor, recipe: str = "torchao") -> Tuple[torch.Tensor, torch.Tensor]:
    """The unfused ops: F.gelu(tanh) in h's dtype, then the recipe's per-row quantization."""
    g = F.gelu(h, approximate="tanh").reshape(-1, h.shape[-1])
    if recipe == "torchao":
        scale = (g.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).to(torch.float32)
    else:
        scale = g.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    q = (g.to(torch.float32) / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


if triton is not None:

    # CUDA_MATH (the GPU): a tensor / Python number as torch's CUDA kernels compute it, a multiplication
    # by the number's reciprocal (BinaryDivTrueKernel.cu), so the per-row scale is the recipe's bit for
    # bit. EXACT (ARITHMETIC "exact", the GPU): per element too, the arithmetic of torch's CUDA kernels,
    # so that the fused path rounds where the unfused one does (in FP8 a last-bit difference can move a
    # value across an e4m3 rounding edge, a 6-12% step): GELU's operations in its kernel's order with
    # CUDA's tanhf (libdevice's), a tensor / tensor as a correctly rounded division (Triton's own
    # float32 `/` is an approximate one there). The interpreter runs numpy, whose division is torch's
    # CPU one.
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
    def _gelu_tanh(x, EXACT: tl.constexpr):
        # 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
        u = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
        if EXACT:
            t = libdevice.tanh(u)
        else:  # tanh through exp, stable for large |u| (fast; and the interpreter has no libdevice)
            t = 1.0 - 2.0 / (tl.exp(2.0 * tl.abs(u)) + 1.0)
            t = tl.where(u < 0, -t, t)
        return 0.5 * x * (1.0 + t)

    @triton.jit
    def _round_bf16(x, ROUND: tl.constexpr):
        # float32 -> nearest bfloat16 (ties to even), kept in float32. ROUND 2 (the GPU): the hardware's
        # conversion; 1: the same arithmetic with integer ops, for Triton's interpreter, which truncates a
        # float32 -> bf16 cast whatever rounding it is asked for (triton 3.9). On the GPU the integer form
        # cost about 5 of the kernel's ~37 instructions an element (benchmarks/kernel_sass.py).
        if ROUND == 2:
            return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)

    @triton.jit
    def _load_chunk(H, row, sh, c, N, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
        """Block c of the row as float32 (columns, mask); EVEN: the row is whole blocks, no mask."""
        cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
        m = cols < N
        if EVEN:
            x = tl.load(H + row * sh + cols).to(tl.float32)
        else:
            x = tl.load(H + row * sh + cols, mask=m, other=0.0).to(tl.float32)
        return x, cols, m

    @triton.jit
    def _act(x, ROUND: tl.constexpr, EXACT: tl.constexpr):
        """The GELU, rounded where the unfused code stores it in h's dtype (bf16)."""
        g = _gelu_tanh(x, EXACT)
        if ROUND:
            g = _round_bf16(g, ROUND)
        return g

    @triton.jit
    def _gelu_chunk(H, row, sh, c, N, BLOCK_N: tl.constexpr, ROUND: tl.constexpr, EXACT: tl.constexpr):
        """Block c of the row: (gelu values, rounded where the unfused code stores them, columns, mask)."""
        x, cols, m = _load_chunk(H, row, sh, c, N, BLOCK_N, False)
        return _act(x, ROUND, EXACT), cols, m

    @triton.jit
    def _store_chunk(Q, row, sq, g, cols, m, scale, F8_STORE: tl.constexpr, EXACT: tl.constexpr,
                     EVEN: tl.constexpr = False):
        v = tl.minimum(tl.maximum(_div(g, scale, EXACT), -448.0), 448.0)
        if F8_STORE:
            v = v.to(tl.float8e4nv, fp_downcast_rounding="rtne")
        if EVEN:
            tl.store(Q + row * sq + cols, v)
        else:
            tl.store(Q + row * sq + cols, v, mask=m)

    @triton.jit
    def _amax(g, m):
        return tl.max(tl.where(m, tl.abs(g), 0.0), axis=0)

    @triton.jit
    def _gelu_quant_kernel(H, Q, S, N, sh, sq, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, ROUND: tl.constexpr,
                           TORCHAO: tl.constexpr, F8_STORE: tl.constexpr, CUDA_MATH: tl.constexpr,
                           EXACT: tl.constexpr, EVEN: tl.constexpr):
        """One program per row. CHUNKS 1-4 (the row fits that many blocks): one pass, the row's loads
        all issued before any arithmetic (each block's load waits on no reduction of the one before),
        its GELU computed once and held in registers, one reduction for the amax, then the
        quantization. CHUNKS 0: two passes over blocks, the GELU and the row's amax, then the GELU
        again (the row is in L1/L2 by then), divided by the scale, clamped, stored as e4m3 (or float32,
        F8_STORE off: the interpreter). EVEN: N is whole blocks (one pass only), no masks."""
        row = tl.program_id(0).to(tl.int64)
        if CHUNKS > 0:  # the blocks as separate values: Triton holds no list of tensors
            x0, c0, m0 = _load_chunk(H, row, sh, 0, N, BLOCK_N, EVEN)
            if CHUNKS > 1:
                x1, c1, m1 = _load_chunk(H, row, sh, 1, N, BLOCK_N, EVEN)
            if CHUNKS > 2:
                x2, c2, m2 = _load_chunk(H, row, sh, 2, N, BLOCK_N, EVEN)
            if CHUNKS > 3:
                x3, c3, m3 = _load_chunk(H, row, sh, 3, N, BLOCK_N, EVEN)
            g0 = _act(x0, ROUND, EXACT)
            am = tl.abs(g0) if EVEN else tl.where(m0, tl.abs(g0), 0.0)
            if CHUNKS > 1:
                g1 = _act(x1, ROUND, EXACT)
                am = tl.maximum(am, tl.abs(g1) if EVEN else tl.where(m1, tl.abs(g1), 0.0))
            if CHUNKS > 2:
                g2 = _act(x2, ROUND, EXACT)
                am = tl.maximum(am, tl.abs(g2) if EVEN else tl.where(m2, tl.abs(g2), 0.0))
            if CHUNKS > 3:
                g3 = _act(x3, ROUND, EXACT)
                am = tl.maximum(am, tl.abs(g3) if EVEN else tl.where(m3, tl.abs(g3), 0.0))
            a = tl.max(am, axis=0)
        else:
            amax = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                g, cols, m = _gelu_chunk(H, row, sh, start // BLOCK_N, N, BLOCK_N, ROUND, EXACT)
                amax = tl.maximum(amax, tl.where(m, tl.abs(g), 0.0))
            a = tl.max(amax, axis=0)
        if TORCHAO:  # amax / 448 divided in the input's dtype (bf16: rounded), then widened; no floor
            scale = _div448(a, CUDA_MATH)
            if ROUND:
                scale = _round_bf16(scale, ROUND)
        else:
            scale = _div448(tl.maximum(a, 1e-12), CUDA_MATH)
        tl.store(S + row, scale)
        if CHUNKS > 0:
            _store_chunk(Q, row, sq, g0, c0, m0, scale, F8_STORE, EXACT, EVEN)
            if CHUNKS > 1:
                _store_chunk(Q, row, sq, g1, c1, m1, scale, F8_STORE, EXACT, EVEN)
            if CHUNKS > 2:
                _store_chunk(Q, row, sq, g2, c2, m2, scale, F8_STORE, EXACT, EVEN)
            if CHUNKS > 3:
                _store_chunk(Q, row, sq, g3, c3, m3, scale, F8_STORE, EXACT, EVEN)
        else:
            for start in range(0, N, BLOCK_N):
                g, cols, m = _gelu_chunk(H, row, sh, start // BLOCK_N, N, BLOCK_N, ROUND, EXACT)
                _store_chunk(Q, row, sq, g, cols, m, scale, F8_STORE, EXACT)


# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself (docs/store.md).
UNDER_COMPILE = "op"


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(h: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (h.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


# "fast" or "exact" (module docstring): the GPU's arithmetic; the interpreter always computes as numpy
ARITHMETIC = "fast"

# One pass holds the row in registers, in at most MAX_CHUNKS blocks of at most ONE_PASS_MAX values in
# all (Qwen-Image's MLP hidden, 12288: three blocks of 4096, no lane idle; 24 float32 values a thread at
# 16 warps). Measured on an H100 (2026-12-06, compile + graph, 240 calls a step): two passes, block
# 2048, 8 warps, 24.97 ms, slower than inductor's own fusion of the unfused ops (21.80 ms); each pass
# computes the GELU with CUDA's tanhf and a correctly rounded division, so the kernel is bound by
# arithmetic, not by its bytes (0.05 ms an image call at 3 TB/s). One pass (same GPU, micro, 120 calls
# of each shape a step): 19.20 ms exact, 13.31 ms fast; inductor's fusion 21.05. With the row's three
# loads issued before any reduction (each block's load had waited on the barrier of the last block's
# amax; now one reduction a row): 9.77 ms fast, 70.9 us an image call, 1.15x the byte bound at the copy
# rate measured beside it (benchmarks/results/h100-fp8-loads-first-20261206/gelu-micro.txt), the same
# e4m3 bytes; in the Qwen-Image FP8 stack compiled with a CUDA graph, 11.29 ms of the step against 14.79.
ONE_PASS_MAX = 16384
MAX_CHUNKS = 4


def _config(n: int, block_n: int, num_warps: int) -> Tuple[int, int, int]:
    """(BLOCK_N, CHUNKS, num_warps); 0 picks the default. CHUNKS: the blocks a one-pass row takes (1 to
    MAX_CHUNKS), or 0 (two passes) where the row needs more. The default block: the fewest blocks with
    the fewest idle lanes, where the row fits ONE_PASS_MAX; else 2048, two passes."""
    if block_n == 0:
        fits = [(c * triton.next_power_of_2(-(-n // c)) - n, c) for c in range(1, MAX_CHUNKS + 1)
                if c * triton.next_power_of_2(-(-n // c)) <= ONE_PASS_MAX]
        block_n = triton.next_power_of_2(-(-n // min(fits)[1])) if n and fits else 2048
    chunks = -(-n // block_n)
    chunks = chunks if chunks <= MAX_CHUNKS else 0
    if num_warps == 0:
        num_warps = 16 if chunks and chunks * block_n >= 8192 else 8
    return block_n, chunks, num_warps


def _launch(h: torch.Tensor, torchao: bool, block_n: int, num_warps: int) -> Tuple[torch.Tensor, torch.Tensor]:
    h2 = h.reshape(-1, h.shape[-1])
    if h2.stride(-1) != 1:
        h2 = h2.contiguous()
    M, N = h2.shape
    # the interpreter, not the device, decides: its e4m3 rounding is wrong (module docstring) and it has
    # no libdevice (an emulated CUDA-graph capture on the CPU makes tensors say is_cuda)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    f8_store = not interpreted
    q = torch.empty((M, N), dtype=torch.float8_e4m3fn if f8_store else torch.float32, device=h.device)
    scale = torch.empty((M, 1), dtype=torch.float32, device=h.device)
    block_n, chunks, num_warps = _config(N, block_n, num_warps)
    if M:
        _gelu_quant_kernel[(M,)](h2, q, scale, N, h2.stride(0), q.stride(0), BLOCK_N=block_n,
                                 CHUNKS=chunks, EVEN=bool(chunks) and N % block_n == 0,
                                 ROUND=(1 if interpreted else 2) if h.dtype == torch.bfloat16 else 0, TORCHAO=torchao,
                                 F8_STORE=f8_store,
                                 CUDA_MATH=not interpreted and libdevice is not None,
                                 EXACT=not interpreted and libdevice is not None and ARITHMETIC == "exact",
                                 num_warps=num_warps)
    return (q if f8_store else q.to(torch.float8_e4m3fn)), scale


def _register():
    """One registration per process (the store's copy and an engine worktree's are byte-identical)."""
    try:
        return torch.ops.optbot.gelu_quant
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op("optbot::gelu_quant", mutates_args=())(_launch)

    @op.register_fake
    def _fake(h, torchao, block_n, num_warps):
        n = h.shape[-1]
        m = h.numel() // n if n else 0
        return h.new_empty((m, n), dtype=torch.float8_e4m3fn), h.new_empty((m, 1), dtype=torch.float32)

    return op


_OP = _register()


def gelu_quant(h: torch.Tensor, recipe: str = "torchao", block_n: int = 0,
               num_warps: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values [M, N], float32 scales [M, 1]) of gelu_tanh(h) under `recipe` (module docstring).
    block_n, num_warps: 0 the default (`_config`); a row of at most four blocks is one pass."""
    global _last_path
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, not {recipe!r}")
    if ARITHMETIC not in ("fast", "exact"):
        raise ValueError(f"ARITHMETIC must be 'fast' or 'exact', not {ARITHMETIC!r}")
    if not _use_triton(h) or h.dtype not in (torch.float32, torch.bfloat16):  # fp16: the reference
        _last_path = "torch"
        return reference(h, recipe)
    _last_path = "triton"
    if block_n < 0 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be 0 (the default) or a power of 2, not {block_n}")
    # the registered op under torch.compile (one node, no break); eager calls the function itself
    # (custom_op's Python dispatch costs tens of microseconds a call)
    return (_OP if torch.compiler.is_compiling() else _launch)(h, recipe == "torchao", int(block_n), int(num_warps))


# ---- the FP8 linear this feeds --------------------------------------------------------------

class Fp8Weight:
    """What a down projection's FP8 GEMM needs from a quantized nn.Linear: e4m3 weight [N, K],
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
    """The down projection on pre-quantized rows, as the recipe computes it: [M, N_out]."""
    if w.bias_in_gemm:
        return torch._scaled_mm(q, w.w8.t(), scale_a=scale, scale_b=w.w_scale, bias=bias, out_dtype=out_dtype,
                                use_fast_accum=w.fast_accum)
    out = torch._scaled_mm(q, w.w8.t(), scale_a=scale, scale_b=w.w_scale, out_dtype=out_dtype)
    return out + bias if bias is not None else out
