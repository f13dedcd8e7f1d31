"""Fused LayerNorm (no affine) + adaLN modulation for Qwen-Image's blocks.

    norm_modulate(x, shift, scale, eps) -> layer_norm(x) * (1 + scale) + shift

    x: [B, S, D]; shift, scale: [B, 1, D] or [B, S, D] (broadcast over tokens by stride 0)

One read of x and one write of the output, where the unfused code runs a norm kernel, writes the
normalized [B, S, D] intermediate and reads it back in one or two elementwise kernels (eager), or
inductor's fused reduction (compiled; on the H200 at ~1.3 TB/s for Qwen-Image's 3072-wide rows,
benchmarks/results/h200-qwen-gelu-20261204/). Intermediates are rounded to the activation dtype
where the unfused code stores them (normalized x, 1 + scale, the product), so bf16 results track
the unfused path. Dispatch: Triton on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1;
else the torch reference (the exact ops of the unfused code).

The Triton path is the registered op optbot::qwen_norm_modulate (torch.library.custom_op with a
fake), which allocates its output: torch.compile keeps it whole (no graph break, inductor does not
look into it; lessons/user-triton-kernels-must-not-write-views-under-compile.md). The torch
reference stays plain torch ops that compile traces. No `from __future__ import annotations`:
custom_op reads the annotations as types.
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


def reference(x, shift, scale, eps):
    return F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale) + shift


if triton is not None:

    @triton.jit
    def _round_to(x, ty: tl.constexpr, BF16: tl.constexpr):
        # float32 -> the activation dtype's nearest value (ties to even), kept in float32. BF16 (set
        # under the interpreter only) with integer ops: Triton's interpreter truncates a float32 -> bf16
        # cast whatever rounding it is asked for (triton 3.9), which put a bf16 output 4 ulps off. On
        # the GPU the hardware's conversion rounds the same way in 2 instructions where the integer form
        # takes about 6 (lessons/a-row-kernel-can-be-bound-by-the-instructions-it-issues.md)
        if BF16:
            b = x.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            return b.to(tl.float32, bitcast=True)
        return x.to(ty).to(tl.float32)

    @triton.jit
    def _qwen_norm_modulate_kernel(X, SHIFT, SCALE, OUT, M, S, D, eps,
                                   sxb, sxs, smb, sms, sob, sos,
                                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, ROUND: tl.constexpr,
                                   BF16: tl.constexpr):
        # BLOCK_M (b, s) tokens per program, each 3072-wide row (6 KB in bf16) whole in the block
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        b = (rows // S)[:, None]
        s = (rows % S)[:, None]
        cols = tl.arange(0, BLOCK_D)[None, :]
        m = (rows < M)[:, None] & (cols < D)
        x = tl.load(X + b * sxb + s * sxs + cols, mask=m, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / D
        xc = tl.where(m, x - mean[:, None], 0.0)
        var = tl.sum(xc * xc, axis=1) / D
        n = xc / tl.sqrt(var + eps)[:, None]
        sc = 1.0 + tl.load(SCALE + b * smb + s * sms + cols, mask=m, other=0.0).to(tl.float32)
        if ROUND:
            n = _round_to(n, OUT.dtype.element_ty, BF16)
            sc = _round_to(sc, OUT.dtype.element_ty, BF16)
        p = n * sc
        if ROUND:
            p = _round_to(p, OUT.dtype.element_ty, BF16)
        sh = tl.load(SHIFT + b * smb + s * sms + cols, mask=m, other=0.0).to(tl.float32)
        y = p + sh
        if ROUND:
            y = _round_to(y, OUT.dtype.element_ty, BF16)  # exact in the store's cast below
        tl.store(OUT + b * sob + s * sos + cols, y.to(OUT.dtype.element_ty), mask=m)


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


def _bsd(t: torch.Tensor, B: int, S: int, D: int) -> torch.Tensor:
    """[B, 1, D] / [B, S, D] -> an expanded [B, S, D] view with a contiguous last dim."""
    t = t.expand(B, S, D)
    return t if t.stride(-1) == 1 else t.contiguous()


def _norm_modulate_op(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                      block_m: int, num_warps: int) -> torch.Tensor:
    B, S, D = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    shift, scale = _bsd(shift, B, S, D), _bsd(scale, B, S, D)
    if shift.stride() != scale.stride():
        shift, scale = shift.contiguous(), scale.contiguous()
    out = torch.empty((B, S, D), dtype=x.dtype, device=x.device)
    if B * S:
        _qwen_norm_modulate_kernel[(triton.cdiv(B * S, block_m),)](
            x, shift, scale, out, B * S, S, D, float(eps),
            x.stride(0), x.stride(1), scale.stride(0), scale.stride(1), out.stride(0), out.stride(1),
            BLOCK_M=block_m, BLOCK_D=triton.next_power_of_2(D), ROUND=x.dtype != torch.float32,
            BF16=x.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1", num_warps=num_warps,
            enable_fp_fusion=FP_FUSION)
    return out


def _register(name: str, fn, fake):
    """One registration per process: a second copy of this file (the store's and an engine
    worktree's are byte-identical, store check) reuses the op the first registered."""
    try:
        return getattr(torch.ops.optbot, name)
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op(f"optbot::{name}", mutates_args=())(fn)
    op.register_fake(fake)
    return op


_OP = _register("qwen_norm_modulate", _norm_modulate_op,
                lambda x, shift, scale, eps, block_m, num_warps: x.new_empty(x.shape))


# The config site (variant search rewrites these defaults): resolved here, outside the op, so the op
# takes its config as int arguments of its schema.
def _launch(x, shift, scale, eps, block_m: int | None = None, num_warps: int | None = None):
    if block_m is None:
        # one token per program on the GPU (a whole row per block already fills the warps); under
        # the interpreter, which makes one Python call per program, 32 (the same code, 32x fewer
        # calls). The interpreter, not the device, decides: an emulated CUDA-graph capture on the
        # CPU makes tensors say is_cuda
        block_m = 32 if os.environ.get("TRITON_INTERPRET") == "1" else 1
    if num_warps is None:  # spread a wide row over more warps (fewer spills)
        num_warps = min(16, max(4, triton.next_power_of_2(x.shape[-1]) // 512))
    # The registered op only under torch.compile (one graph node, no break); eager calls the
    # function itself: custom_op's Python dispatch costs tens of microseconds a call, more than
    # the kernel at small shapes (H200 micro, benchmarks/results/h200-modes-20261201/).
    return (_OP if torch.compiler.is_compiling() else _norm_modulate_op)(x, shift, scale, float(eps), int(block_m),
                                                                          int(num_warps))


def norm_modulate(x, shift, scale, eps):
    global _last_path
    if not _use_triton(x) or x.dim() != 3:
        _last_path = "torch"
        return reference(x, shift, scale, eps)
    _last_path = "triton"
    return _launch(x, shift, scale, eps)
