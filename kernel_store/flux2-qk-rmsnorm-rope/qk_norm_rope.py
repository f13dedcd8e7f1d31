"""Fused QK RMSNorm + RoPE: one read and one write of q (or k) instead of four passes.

    out = rope(rms_norm(x) * weight)        x: [B, S, H, D] (any strides, D contiguous)
    rope pairs interleaved channels (2j, 2j+1), as diffusers' apply_rotary_emb(use_real=True,
    use_real_unbind_dim=-1): out[2j] = n[2j] cos[2j] - n[2j+1] sin[2j]; out[2j+1] = n[2j+1] cos[2j+1] + n[2j] sin[2j+1]

The normalized value is rounded to x's dtype before the rotation, where the unfused code rounds it,
so bf16 results match the unfused path up to the reduction order of the mean square.
Dispatch: Triton on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1 (the interpreter);
else the torch reference (the exact ops of the unfused code). Imports only torch (and triton if present).

The engine calls `qk_rmsnorm_rope_joint`: text and image q (or k) into one new [txt, img] tensor, a
registered op (torch.library.custom_op, with a fake) that allocates its own output. Inductor does not
look into it, so torch.compile keeps it whole with no graph break, and it composes with CUDA graphs:
a Triton kernel traced inline that writes into slices of a buffer made in the compiled graph is
functionalized by inductor (torch 2.11) into copies that read 6 MiB past a buffer, which faults in
the side-stream warm-up of a CUDA-graph capture (lessons/user-triton-kernels-must-not-write-views-under-compile.md).
No `from __future__ import annotations` here: custom_op reads the annotations as types.
"""
import os
from typing import Optional

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU machine without triton: the torch path only
    triton = None

_last_path = ""  # "triton" | "torch": which path the last call took (tests prove the kernel ran)


def last_path() -> str:
    return _last_path


def reference(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over D, then interleaved RoPE over S; the same ops as the unfused engine code."""
    n = F.rms_norm(x, (x.shape[-1],), weight, eps)  # [B, S, H, D], x.dtype
    c, s = cos[None, :, None, :], sin[None, :, None, :]  # [1, S, 1, D]
    re, im = n.reshape(*n.shape[:-1], -1, 2).unbind(-1)  # [B, S, H, D/2] each
    rot = torch.stack([-im, re], dim=-1).flatten(3)
    return (n.float() * c + rot.float() * s).to(x.dtype)


if triton is not None:

    @triton.jit
    def _qk_rmsnorm_rope_kernel(X, W, COS, SIN, OUT, n_rows, S, H,
                                sxb, sxs, sxh, sob, sos, soh, scs, eps,
                                HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_M: tl.constexpr,
                                HAS_W: tl.constexpr, ROUND: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)  # flattened (b, s, h)
        rmask = rows < n_rows
        h = rows % H
        s = (rows // H) % S
        b = rows // (H * S)
        j = tl.arange(0, BLOCK_HALF)  # pair index: channels 2j (even) and 2j+1 (odd)
        cmask = j < HALF
        m2 = rmask[:, None] & cmask[None, :]
        xp = X + (b * sxb + s * sxs + h * sxh)[:, None] + 2 * j[None, :]
        xe = tl.load(xp, mask=m2, other=0.0).to(tl.float32)
        xo = tl.load(xp + 1, mask=m2, other=0.0).to(tl.float32)
        ms = (tl.sum(xe * xe, axis=1) + tl.sum(xo * xo, axis=1)) / (2 * HALF)
        r = 1.0 / tl.sqrt(ms + eps)
        ne = xe * r[:, None]
        no = xo * r[:, None]
        if HAS_W:
            ne = ne * tl.load(W + 2 * j, mask=cmask, other=0.0).to(tl.float32)[None, :]
            no = no * tl.load(W + 2 * j + 1, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if ROUND:  # the unfused code stores the normalized tensor in x's dtype before RoPE
            ne = ne.to(OUT.dtype.element_ty).to(tl.float32)
            no = no.to(OUT.dtype.element_ty).to(tl.float32)
        cp = (s * scs)[:, None] + 2 * j[None, :]
        ce = tl.load(COS + cp, mask=m2, other=0.0)
        co = tl.load(COS + cp + 1, mask=m2, other=0.0)
        se = tl.load(SIN + cp, mask=m2, other=0.0)
        so = tl.load(SIN + cp + 1, mask=m2, other=0.0)
        op = OUT + (b * sob + s * sos + h * soh)[:, None] + 2 * j[None, :]
        tl.store(op, (ne * ce - no * se).to(OUT.dtype.element_ty), mask=m2)
        tl.store(op + 1, (no * co + ne * so).to(OUT.dtype.element_ty), mask=m2)


# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself. optbot's replay writes "reference" where the
# entry's recorded microbenchmark loses to the reference compiled by inductor (docs/store.md).
UNDER_COMPILE = "op"


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def qk_rmsnorm_rope(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                    out: torch.Tensor | None = None, block_m: int = 16, num_warps: int = 4) -> torch.Tensor:
    """x: [B, S, H, D]; cos, sin: [S, D] (fp32); out: [B, S, H, D] or None (may be a strided view)."""
    global _last_path
    B, S, H, D = x.shape
    if out is None:
        out = torch.empty((B, S, H, D), dtype=x.dtype, device=x.device)
    if not _use_triton(x) or D % 2:
        _last_path = "torch"
        out.copy_(reference(x, weight, cos, sin, eps))
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos = cos.to(device=x.device, dtype=torch.float32).contiguous()
    sin = sin.to(device=x.device, dtype=torch.float32).contiguous()
    assert out.stride(-1) == 1 and cos.shape == (S, D), "out must have a contiguous last dim; cos/sin [S, D]"
    n_rows = B * S * H
    half = D // 2
    grid = (triton.cdiv(n_rows, block_m),)
    _qk_rmsnorm_rope_kernel[grid](
        x, weight if weight is not None else x, cos, sin, out, n_rows, S, H,
        x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1), out.stride(2), cos.stride(0), float(eps),
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_M=block_m,
        HAS_W=weight is not None, ROUND=x.dtype != torch.float32, num_warps=num_warps)
    _last_path = "triton"
    return out


def _joint_shape(x: torch.Tensor, ex: Optional[torch.Tensor]) -> tuple:
    return (x.shape[0], (0 if ex is None else ex.shape[1]) + x.shape[1], x.shape[2], x.shape[3])


def _joint(x: torch.Tensor, weight: Optional[torch.Tensor], ex: Optional[torch.Tensor],
           eweight: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, eps: float,
           eeps: float) -> torch.Tensor:
    """RMSNorm + RoPE of ex (text, first; None: none) and x (image) into one new [B, S_txt + S_img, H, D]."""
    s_txt = 0 if ex is None else ex.shape[1]
    out = x.new_empty(_joint_shape(x, ex))
    if ex is not None:
        qk_rmsnorm_rope(ex, eweight, cos[:s_txt], sin[:s_txt], eeps, out=out[:, :s_txt])
    qk_rmsnorm_rope(x, weight, cos[s_txt:], sin[s_txt:], eps, out=out[:, s_txt:])
    return out


def _register():
    """The registered op; one per process, whichever copy of this file (the store's, an engine
    worktree's) is imported first registers it (the copies are byte-identical: store check)."""
    try:
        return torch.ops.optbot.qk_rmsnorm_rope_joint
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op("optbot::qk_rmsnorm_rope_joint", mutates_args=())(_joint)

    @op.register_fake
    def _fake(x, weight, ex, eweight, cos, sin, eps, eeps):
        return x.new_empty(_joint_shape(x, ex))

    return op


_JOINT = _register()


def qk_rmsnorm_rope_joint(x: torch.Tensor, weight: Optional[torch.Tensor], ex: Optional[torch.Tensor],
                          eweight: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, eps: float,
                          eeps: Optional[float] = None) -> torch.Tensor:
    """x: [B, S_img, H, D] (image q or k), ex: [B, S_txt, H, D] or None (text); cos, sin:
    [S_txt + S_img, D]. Returns [B, S_txt + S_img, H, D]: [norm+rope(ex); norm+rope(x)]."""
    global _last_path
    if _aside():
        _last_path = "torch"
        s_txt = 0 if ex is None else ex.shape[1]
        img = reference(x, weight, cos[s_txt:], sin[s_txt:], eps)
        return img if ex is None else torch.cat(
            [reference(ex, eweight, cos[:s_txt], sin[:s_txt], eps if eeps is None else eeps), img], dim=1)
    # The registered op only under torch.compile (one graph node, no break); eager calls the
    # function itself: custom_op's Python dispatch costs tens of microseconds a call, more than
    # the kernel at small shapes (H200 micro, benchmarks/results/h200-modes-20261201/).
    return (_JOINT if torch.compiler.is_compiling() else _joint)(x, weight, ex, eweight, cos, sin, float(eps), float(eps if eeps is None else eeps))
