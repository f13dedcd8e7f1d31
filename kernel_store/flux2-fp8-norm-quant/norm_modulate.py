"""Fused LayerNorm (no affine) + adaLN modulation, with an optional gated residual add before it.

    norm_modulate(x, shift, scale, eps)                  -> (1 + scale) * layer_norm(x) + shift
    gate_residual_norm_modulate(h, gate, y, shift, scale, eps)
                                                          -> h' = h + gate * y,  (1 + scale) * layer_norm(h') + shift

    x, h, y: [B, S, D]; shift, scale, gate: [B, 1, D] or [B, S, D] (broadcast over tokens by stride 0)

One read of the activations and one write per output, instead of a norm kernel, its intermediate,
and two to four elementwise kernels. Intermediates are rounded to the activation dtype where the
unfused code stores them (normalized x, 1 + scale, gate * y), so bf16 results track the unfused path.
Dispatch: Triton on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1; else the torch
reference (the exact ops of the unfused code).

The Triton path is two registered ops, optbot::norm_modulate and optbot::gate_residual_norm_modulate
(torch.library.custom_op with a fake), that allocate their outputs: torch.compile keeps them whole
(no graph break, inductor does not look into them; lessons/user-triton-kernels-must-not-write-views-under-compile.md).
The torch reference stays plain torch ops that compile traces. No `from __future__ import annotations`:
custom_op reads the annotations as types.
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


def reference(x, shift, scale, eps):
    return (1 + scale) * F.layer_norm(x, (x.shape[-1],), eps=eps) + shift


def reference_residual(h, gate, y, shift, scale, eps):
    h = h + gate * y
    return h, reference(h, shift, scale, eps)


if triton is not None:

    @triton.jit
    def _norm_modulate_kernel(H, G, Y, SHIFT, SCALE, HOUT, OUT, S, D, eps,
                              shb, shs, syb, sys_, smb, sms, sgb, sgs, sob, sos,
                              BLOCK_D: tl.constexpr, RESIDUAL: tl.constexpr, ROUND: tl.constexpr):
        row = tl.program_id(0)  # one (b, s) token per program
        b = row // S
        s = row % S
        cols = tl.arange(0, BLOCK_D)
        m = cols < D
        x = tl.load(H + b * shb + s * shs + cols, mask=m, other=0.0).to(tl.float32)
        if RESIDUAL:
            g = tl.load(G + b * sgb + s * sgs + cols, mask=m, other=0.0).to(tl.float32)
            y = tl.load(Y + b * syb + s * sys_ + cols, mask=m, other=0.0).to(tl.float32)
            gy = g * y
            if ROUND:
                gy = gy.to(OUT.dtype.element_ty).to(tl.float32)
            x = x + gy
            if ROUND:
                x = x.to(OUT.dtype.element_ty).to(tl.float32)
            tl.store(HOUT + b * sob + s * sos + cols, x.to(OUT.dtype.element_ty), mask=m)
        mean = tl.sum(x, axis=0) / D
        xc = tl.where(m, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / D
        n = xc / tl.sqrt(var + eps)
        sc = 1.0 + tl.load(SCALE + b * smb + s * sms + cols, mask=m, other=0.0).to(tl.float32)
        if ROUND:
            n = n.to(OUT.dtype.element_ty).to(tl.float32)
            sc = sc.to(OUT.dtype.element_ty).to(tl.float32)
        sh = tl.load(SHIFT + b * smb + s * sms + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(OUT + b * sob + s * sos + cols, (sc * n + sh).to(OUT.dtype.element_ty), mask=m)


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


def _run(h: torch.Tensor, gate: Optional[torch.Tensor], y: Optional[torch.Tensor], shift: torch.Tensor,
         scale: torch.Tensor, eps: float, residual: bool, num_warps: int) -> tuple:
    B, S, D = h.shape
    h = h if h.stride(-1) == 1 else h.contiguous()
    shift, scale = _bsd(shift, B, S, D), _bsd(scale, B, S, D)
    if shift.stride() != scale.stride():
        shift, scale = shift.contiguous(), scale.contiguous()
    out = torch.empty((B, S, D), dtype=h.dtype, device=h.device)
    hout = torch.empty_like(out) if residual else out
    g = _bsd(gate, B, S, D) if residual else shift
    yy = _bsd(y, B, S, D) if residual else h
    if B * S:
        _norm_modulate_kernel[(B * S,)](
            h, g, yy, shift, scale, hout, out, S, D, float(eps),
            h.stride(0), h.stride(1), yy.stride(0), yy.stride(1), scale.stride(0), scale.stride(1),
            g.stride(0), g.stride(1), out.stride(0), out.stride(1),
            BLOCK_D=triton.next_power_of_2(D), RESIDUAL=residual, ROUND=h.dtype != torch.float32,
            num_warps=num_warps, enable_fp_fusion=FP_FUSION)
    return hout, out


def _norm_modulate_op(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                      num_warps: int) -> torch.Tensor:
    return _run(x, None, None, shift, scale, eps, False, num_warps)[1]


def _gate_residual_op(h: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, shift: torch.Tensor,
                      scale: torch.Tensor, eps: float, num_warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(h, gate, y, shift, scale, eps, True, num_warps)


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


_NORM_MODULATE = _register("norm_modulate", _norm_modulate_op,
                           lambda x, shift, scale, eps, num_warps: x.new_empty(x.shape))
_GATE_RESIDUAL = _register("gate_residual_norm_modulate", _gate_residual_op,
                           lambda h, gate, y, shift, scale, eps, num_warps: (h.new_empty(h.shape), h.new_empty(h.shape)))


# The config site (variant search rewrites this default): resolved here, outside the ops, so each op
# takes its config as an int argument of its schema.
def _launch(h, gate, y, shift, scale, eps, residual: bool, num_warps: int | None = None):
    if num_warps is None:  # one token per program: spread a wide row over more warps (fewer spills)
        num_warps = min(16, max(4, triton.next_power_of_2(h.shape[-1]) // 512))
    # The registered ops only under torch.compile (one graph node, no break); eager calls the
    # functions themselves: custom_op's Python dispatch costs tens of microseconds a call, more than
    # the kernel at small shapes (H200 micro, benchmarks/results/h200-modes-20261201/).
    compiling = torch.compiler.is_compiling()
    if residual:
        return (_GATE_RESIDUAL if compiling else _gate_residual_op)(h, gate, y, shift, scale, float(eps), int(num_warps))
    return None, (_NORM_MODULATE if compiling else _norm_modulate_op)(h, shift, scale, float(eps), int(num_warps))


def norm_modulate(x, shift, scale, eps):
    global _last_path
    if not _use_triton(x):
        _last_path = "torch"
        return reference(x, shift, scale, eps)
    _last_path = "triton"
    return _launch(x, None, None, shift, scale, eps, residual=False)[1]


def gate_residual_norm_modulate(h, gate, y, shift, scale, eps):
    global _last_path
    if not _use_triton(h):
        _last_path = "torch"
        return reference_residual(h, gate, y, shift, scale, eps)
    _last_path = "triton"
    return _launch(h, gate, y, shift, scale, eps, residual=True)
