"""The MLP's tanh GELU and the static FP8 quantization of its output in one pass (SGLang, ModelOpt FP8).

In SGLang's ModelOpt FP8 path every linear quantizes its input with one static scale, calibrated
ahead (`layer.input_scale`), through the Triton kernel `_static_quant_fp8`. In Qwen-Image's MLP the
down projection's input is the GELU of the up projection's output: torch's GELU kernel reads h and
writes g = gelu_tanh(h) in bf16, then `_static_quant_fp8` reads g back and writes e4m3 (an image
call, h 4096 x 12288: 201 MB, then 151 MB). This kernel reads h once and writes the e4m3 values
(151 MB in all), and the down projection takes them as SGLang's FP8 linear takes any pre-quantized
input (`apply_fp8_linear`: no re-quantization, the same input scale).

    h: [..., N] (bf16 on the GPU), scale: the down projection's input_scale (one float32 value, on
    h's device); returns q [..., N] e4m3 = clamp(gelu(h) rounded to h's dtype * (1 / scale), +-448)

The arithmetic is the unfused ops' where it can be: the GELU in float32 in torch's order, rounded to
bf16 where torch's kernel stores it, then SGLang's own quantization expression (`y * (1.0 / y_s)`,
clamped, cast to e4m3 by Triton's conversion). tanh goes through exp ("fast", as the diffusers entry
qwen-image-fp8-gelu-quant measured: rounding to bf16 absorbs the last float32 bits; the GPU test
counts how many codes move).

The e4m3 store: on the GPU in the kernel. Triton's interpreter rounds float32 -> e4m3 wrongly near
binade edges, so under TRITON_INTERPRET=1 the kernel stores the clamped float32 values and torch
casts them (round to nearest even, as the GPU's `cvt.rn.satfinite` does).

Dispatch: Triton on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1; else the torch
reference. Under torch.compile the Triton path is the registered op optbot::gelu_static_quant
(custom_op with a fake), one graph node. No `from __future__ import annotations`: custom_op reads
the annotations as types.
"""
import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

E4M3_MAX = 448.0
_last_path = ""


def last_path() -> str:
    return _last_path


def reference(h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The unfused ops: F.gelu(tanh) in h's dtype, then SGLang's static quantization expression."""
    g = F.gelu(h, approximate="tanh").to(torch.float32)
    inv = 1.0 / scale.to(torch.float32).reshape(())
    return (g * inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


if triton is not None:

    @triton.jit
    def _gelu_tanh(x):
        # 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3): torch's order; tanh through exp,
        # stable for large |u| (the interpreter has no libdevice)
        u = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
        t = 1.0 - 2.0 / (tl.exp(2.0 * tl.abs(u)) + 1.0)
        t = tl.where(u < 0, -t, t)
        return 0.5 * x * (1.0 + t)

    @triton.jit
    def _round_bf16(x, ROUND: tl.constexpr):
        # float32 -> nearest bfloat16 (ties to even), kept in float32. ROUND 2 (the GPU): the hardware's
        # conversion; 1: the same with integer ops, for the interpreter, which truncates this cast.
        if ROUND == 2:
            return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)

    @triton.jit
    def _gelu_static_quant_kernel(H, Q, S, numel, BLOCK: tl.constexpr, ROUND: tl.constexpr,
                                  F8_STORE: tl.constexpr, EVEN: tl.constexpr):
        """One program per BLOCK elements of the flattened (contiguous) input. EVEN: numel is whole
        blocks, no mask. F8_STORE off (the interpreter): the clamped float32 values."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        if EVEN:
            x = tl.load(H + offs).to(tl.float32)
        else:
            x = tl.load(H + offs, mask=offs < numel, other=0.0).to(tl.float32)
        g = _gelu_tanh(x)
        if ROUND:
            g = _round_bf16(g, ROUND)
        inv = 1.0 / tl.load(S).to(tl.float32)  # SGLang's _static_quant_fp8: y_s_inv = 1.0 / y_s
        v = tl.clamp(g * inv, -448.0, 448.0)
        if F8_STORE:
            v = v.to(tl.float8e4nv)
        if EVEN:
            tl.store(Q + offs, v)
        else:
            tl.store(Q + offs, v, mask=offs < numel)


# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself (docs/store.md).
UNDER_COMPILE = "op"


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(h: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (h.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


# Elements a program: 4096 at 8 warps is 16 a thread (two 16-byte bf16 loads). An image call of
# Qwen-Image (4096 x 12288) is 12,288 programs; a text call (512 rows) 1,536.
BLOCK = 4096
NUM_WARPS = 8


def _launch(h: torch.Tensor, scale: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    h1 = h.contiguous()
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    f8_store = not interpreted
    q = torch.empty(h.shape, dtype=torch.float8_e4m3fn if f8_store else torch.float32, device=h.device)
    n = h1.numel()
    block = block or BLOCK
    if n:
        _gelu_static_quant_kernel[(triton.cdiv(n, block),)](
            h1, q, scale, n, BLOCK=block, EVEN=n % block == 0,
            ROUND=(1 if interpreted else 2) if h.dtype == torch.bfloat16 else 0, F8_STORE=f8_store,
            num_warps=num_warps or NUM_WARPS)
    return q if f8_store else q.to(torch.float8_e4m3fn)


def _register():
    """One registration per process (the store's copy and an engine worktree's are byte-identical)."""
    try:
        return torch.ops.optbot.gelu_static_quant
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op("optbot::gelu_static_quant", mutates_args=())(_launch)

    @op.register_fake
    def _fake(h, scale, block, num_warps):
        return h.new_empty(h.shape, dtype=torch.float8_e4m3fn)

    return op


_OP = _register()


def gelu_static_quant(h: torch.Tensor, scale: torch.Tensor, block: int = 0, num_warps: int = 0) -> torch.Tensor:
    """e4m3 values of gelu_tanh(h) quantized with the static `scale` (module docstring).
    block (a power of 2), num_warps: 0 the defaults."""
    global _last_path
    if scale.numel() != 1:
        raise ValueError(f"scale must be one value (a static per-tensor scale), not shape {tuple(scale.shape)}")
    if not _use_triton(h) or h.dtype not in (torch.float32, torch.bfloat16):  # fp16: the reference
        _last_path = "torch"
        return reference(h, scale)
    if block < 0 or block & (block - 1):
        raise ValueError(f"block must be 0 (the default) or a power of 2, not {block}")
    _last_path = "triton"
    # the registered op under torch.compile (one node, no break); eager calls the function itself
    # (custom_op's Python dispatch costs tens of microseconds a call)
    return (_OP if torch.compiler.is_compiling() else _launch)(h, scale.reshape(()), int(block), int(num_warps))
