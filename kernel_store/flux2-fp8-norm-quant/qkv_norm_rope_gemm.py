"""Merged Q/K/V projection with QK RMSNorm and interleaved RoPE in the GEMM's epilogue.

Per stream (text, image) of a joint-attention block:

    [q | k | v] = x @ W_qkv^T (+ b_qkv)             W_qkv: [3*H*D, K], the three projections stacked
    q, k       <- rope(rms_norm(q or k per head) * norm_weight)
    out[:, :, seq_offset + s]  = q, k, v             out: [3, B, S_joint, H, D], the joint [txt, img] layout

RoPE pairs interleaved channels (2j, 2j+1) (diffusers' apply_rotary_emb(use_real=True,
use_real_unbind_dim=-1), and the complex form of Qwen-Image's apply_rotary_emb_qwen):
    out[2j]   = n[2j] cos[2j]     - n[2j+1] sin[2j]
    out[2j+1] = n[2j+1] cos[2j+1] + n[2j]   sin[2j+1]

One program computes a BLOCK_M x D tile: one whole head of q, k or v, so the per-head RMSNorm is a
row reduction inside the tile and the rotation pairs are neighbours in it. The separate norm, RoPE and
concatenation passes (and their reads and writes of q, k, v) disappear. Intermediates are rounded to
the activation dtype where the unfused code stores them (linear output, normalized tensor).

Two ways to get the tile's [q | k | v] values (config "gemm"):
  "cublas"  F.linear (cuBLAS, bias in its epilogue) writes x @ W^T + b once, and the same kernel
            without its K loop reads it back and runs the epilogue (FROM_Y). Measured on the H200
            (benchmarks/results/h200-qwen-modes-20261204/qkv-gemm-configs.txt): the fused Triton GEMM
            ran at 330-516 TFLOP/s at the workloads' shapes where cuBLAS ran the same FLOPs at 699-758,
            so the extra write and read of [M, 3*H*D] (0.17 GB per Qwen-Image block, ~0.04 ms at
            4.2 TB/s) cost less than the slower GEMM (0.25 ms there). The default on every device.
  "triton"  the GEMM in the kernel itself (tl.dot over K), no [M, 3*H*D] intermediate.

Engine conventions (the reference replays each exactly; the kernel's math is the same up to rounding):
  norm_style "torch"     torch.nn.RMSNorm (FLUX.2)
             "diffusers" diffusers' RMSNorm: x * rsqrt(mean(x^2) + eps), rounded to the weight's half
                         dtype before the weight multiply (Qwen-Image)
  rope_style "real"      apply_rotary_emb(use_real=True, use_real_unbind_dim=-1) with cos/sin (FLUX.2)
             "complex"   apply_rotary_emb_qwen(use_real=False): x as complex pairs times
                         complex(cos[2j], sin[2j]) (Qwen-Image)

Dispatch: Triton on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1 (the interpreter);
else the torch reference, the exact ops of the unfused engine code (bit-identical on CPU).
Imports only torch (and triton if present).

A projection the engine has replaced (an FP8 linear: torchao's float8 weight, optbot's emulation)
no longer holds a plain weight to multiply: then the engine runs the projection module itself and
calls `norm_rope` on its outputs [B, S, 3*H*D], the epilogue alone (the kernel with FROM_Y, as for
gemm "cublas"): the FP8 GEMM stays the quantized module's, the norm, RoPE and joint layout are fused.

FLUX.2's single-stream blocks compute q|k|v and the MLP input in one projection (to_qkv_mlp_proj), so
there is no GEMM to take over: the engine passes the q|k|v columns of that output (a strided view, rows
of the full projection width) to `norm_rope` with `qk_only=True`, and the kernel writes the normalized,
rotated q and k only, [2, B, S, H, D]; v stays the engine's view of the projection output, as in the
unfused code (writing it would be a copy the base does not make).

The engine calls `qkv_norm_rope` (and `norm_rope`): a registered op (torch.library.custom_op with a fake) that
allocates the joint [3, B, S_txt + S_img, H, D] output itself and writes both streams into it.
Inductor does not look into it, so torch.compile keeps it whole with no graph break, and no Triton
kernel writes into a slice of a buffer made in the compiled graph (inductor functionalizes those
writes into an over-read: lessons/user-triton-kernels-must-not-write-views-under-compile.md).
The op's name is this entry's own (_OP_NAME): the FLUX.2 and Qwen-Image entries ship the same
kernel, and each registers its op once per process. No `from __future__ import annotations`:
custom_op reads the annotations as types.
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
_OP_NAME = "flux2_qkv_norm_rope_gemm"  # optbot::<name>, one per store entry

# Hopper (H200, bf16 in, fp32 accumulate). The default epilogue config is the one of 24 with the least
# device time at Qwen-Image's shape (CUDA-graph replays, benchmarks/results/h200-qwen-epilogue-20261204/
# qkv-gemm-configs.txt): row-block, block_m 16, block_h 2, 8 warps, 0.076 ms for both streams (2.3 TB/s)
# against 0.089 for the per-head 64 x 4 warps default before; FLUX.2's shape 0.146 against 0.166. block_k,
# group_m and num_stages only matter for gemm "triton" (its best on the H200: block_m 128, block_k 128,
# num_stages 3, num_warps 8: benchmarks/results/h200-qwen-modes-20261204/qkv-gemm-configs.txt).
DEFAULT_CONFIG = {"gemm": "cublas", "epilogue": "row-block", "block_m": 16, "block_h": 2, "block_k": 128, "group_m": 8,
                  "num_stages": 3, "num_warps": 8}
GEMMS = ("cublas", "triton")
# gemm "cublas" and norm_rope only: one program per row block x head of q, k or v ("per-head"), or
# per row block x block_h heads ("row-block", a 3-D tile: cos/sin read once per block_h heads, rows
# of block_h * D contiguous values; one launch for both streams, where per-head launches once per stream:
# the compiled Qwen-Image step is host-bound, benchmarks/results/h200-qwen-gelu-20261204/); block_h: a
# power of 2, row-block only
EPILOGUES = ("per-head", "row-block")


def last_path() -> str:
    return _last_path


def _rope(n: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_emb(use_real=True, use_real_unbind_dim=-1, sequence_dim=1), op for op."""
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    re, im = n.reshape(*n.shape[:-1], -1, 2).unbind(-1)
    rot = torch.stack([-im, re], dim=-1).flatten(3)
    return (n.float() * c + rot.float() * s).to(n.dtype)


def _rope_complex(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_emb_qwen(use_real=False) with freqs_cis = complex(cos[:, 0::2], sin[:, 0::2]) (exact)."""
    freqs = torch.complex(cos[:, 0::2].float(), sin[:, 0::2].float()).unsqueeze(1)
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


def _rms_norm_diffusers(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """diffusers.models.normalization.RMSNorm.forward (non-NPU path), op for op."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x_n = x * torch.rsqrt(variance + eps)
    if weight is None:
        return x_n.to(x.dtype)
    if weight.dtype in (torch.float16, torch.bfloat16):
        x_n = x_n.to(weight.dtype)
    return x_n * weight


def reference_stream(x, w, bias, norm_q, norm_k, eps_q, eps_k, cos, sin, heads, norm_style="torch", rope_style="real"):
    """One stream, the unfused engine ops: three linears (on the row blocks of the merged weight, the
    same data as to_q/to_k/to_v), unflatten heads, RMSNorm q and k, RoPE. Returns q, k, v [B, S, H, D]."""
    n = w.shape[0] // 3
    outs = [F.linear(x, w[i * n:(i + 1) * n], None if bias is None else bias[i * n:(i + 1) * n]) for i in range(3)]
    return reference_epilogue(*outs, norm_q, norm_k, eps_q, eps_k, cos, sin, heads, norm_style, rope_style)


def reference_epilogue(q, k, v, norm_q, norm_k, eps_q, eps_k, cos, sin, heads, norm_style="torch", rope_style="real"):
    """The engine ops after the projections: q, k, v [B, S, H*D] -> heads, RMSNorm q and k, RoPE."""
    q, k, v = (t.unflatten(-1, (heads, -1)) for t in (q, k, v))
    if norm_style == "diffusers":
        q, k = _rms_norm_diffusers(q, norm_q, eps_q), _rms_norm_diffusers(k, norm_k, eps_k)
    else:
        q = F.rms_norm(q, (q.shape[-1],), norm_q, eps_q)
        k = F.rms_norm(k, (k.shape[-1],), norm_k, eps_k)
    if cos is not None:
        rope = _rope_complex if rope_style == "complex" else _rope
        q, k = rope(q, cos, sin), rope(k, cos, sin)
    return q, k, v


if triton is not None:

    @triton.jit
    def _rms_rows(acc, which, eps_q, eps_k, NQ, NK, rn, D: tl.constexpr, HAS_NW: tl.constexpr, ROUND: tl.constexpr,
                  ROUND_BEFORE_W: tl.constexpr, DT: tl.constexpr):
        """q (which 0) or k (1) rows of one head [BLOCK_M, D] fp32: RMSNorm, the norm's weight, rounded to
        DT where the unfused code stores."""
        ms = tl.sum(acc * acc, axis=1) / D
        if which == 0:
            r = 1.0 / tl.sqrt(ms + eps_q)
        else:
            r = 1.0 / tl.sqrt(ms + eps_k)
        acc = acc * r[:, None]
        if ROUND_BEFORE_W:  # diffusers' RMSNorm casts to the weight's half dtype before the multiply
            acc = acc.to(DT).to(tl.float32)
        if HAS_NW:
            if which == 0:
                nw = tl.load(NQ + rn).to(tl.float32)
            else:
                nw = tl.load(NK + rn).to(tl.float32)
            acc = acc * nw[None, :]
        if ROUND:  # the unfused RMSNorm stores the normalized tensor in the activation dtype
            acc = acc.to(DT).to(tl.float32)
        return acc

    @triton.jit
    def _rotate_pairs(acc, c, sn, BLOCK_M: tl.constexpr, D: tl.constexpr):
        """RoPE on interleaved pairs: the partner of every channel, (2j, 2j+1) -> (-x[2j+1], x[2j])."""
        ev, od = tl.split(tl.reshape(acc, (BLOCK_M, D // 2, 2)))
        rot = tl.reshape(tl.join(-od, ev), (BLOCK_M, D))
        return acc * c + rot * sn

    # The segment's scalars are chosen by a runtime branch, so both branches must give one type: an int
    # argument equal to 1 would otherwise be specialized into a constant on the GPU (one text token, a
    # one-stream launch's placeholder S0) and differ from the other branch's runtime value.
    @triton.jit(do_not_specialize=["M0", "M1", "S0", "S1", "OFF0", "OFF1", "COFF0", "COFF1"])
    def _norm_rope_rows_kernel(Y0, Y1, NQ0, NK0, NQ1, NK1, COS, SIN, OUT, M0, M1, S0, S1, OFF0, OFF1, COFF0, COFF1, H,
                               eps_q0, eps_k0, eps_q1, eps_k1, sy0, sy1, so3, sob, sos, soh, scs,
                               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, HAS_NW: tl.constexpr,
                               HAS_ROPE: tl.constexpr, ROUND: tl.constexpr, ROUND_BEFORE_W: tl.constexpr):
        """The epilogue "row-block", two streams in one launch: program_id 0 runs over segment 0's row
        blocks (Y0: M0 = B*S0 rows, stored at joint positions OFF0 + s, cos/sin rows COFF0 + s) and then
        segment 1's (Y1, M1 = B*S1, OFF1, COFF1); M0 = 0 for one stream. A program takes BLOCK_M rows x
        BLOCK_H heads of q, k or v (a 3-D tile, program_id 1), so the rows' cos and sin (fp32: together
        four times the bytes of a bf16 head) are read once per BLOCK_H heads, and a row's loads and stores
        are BLOCK_H * D contiguous values. The grid's second axis decides what is written: 3 * heads blocks
        for q, k and v, 2 * heads blocks for q and k only (qk_only)."""
        pid = tl.program_id(0)
        pid_n = tl.program_id(1)  # = which * cdiv(H, BLOCK_H) + head block
        n0 = tl.cdiv(M0, BLOCK_M)
        if pid < n0:  # a text row block
            Y, NQ, NK, M, S, seq_off, cos_off, sy = Y0, NQ0, NK0, M0, S0, OFF0, COFF0, sy0
            eps_q, eps_k, pid_m = eps_q0, eps_k0, pid
        else:
            Y, NQ, NK, M, S, seq_off, cos_off, sy = Y1, NQ1, NK1, M1, S1, OFF1, COFF1, sy1
            eps_q, eps_k, pid_m = eps_q1, eps_k1, pid - n0
        n_hb = tl.cdiv(H, BLOCK_H)
        which = pid_n // n_hb  # 0 q, 1 k, 2 v
        hs = (pid_n % n_hb) * BLOCK_H + tl.arange(0, BLOCK_H)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rm_ld = rm % M  # rows past M load a valid row; they are never stored
        rn = tl.arange(0, D)
        hmask = hs < H
        hs_ld = tl.where(hmask, hs, 0)
        b_idx = rm // S
        s_idx = rm % S
        acc = tl.load(Y + rm_ld[:, None, None] * sy + ((which * H + hs_ld) * D)[None, :, None]
                      + rn[None, None, :]).to(tl.float32)
        if which < 2:
            DT = OUT.dtype.element_ty
            ms = tl.sum(acc * acc, axis=2) / D
            if which == 0:
                r = 1.0 / tl.sqrt(ms + eps_q)
            else:
                r = 1.0 / tl.sqrt(ms + eps_k)
            acc = acc * r[:, :, None]
            if ROUND_BEFORE_W:  # diffusers' RMSNorm casts to the weight's half dtype before the multiply
                acc = acc.to(DT).to(tl.float32)
            if HAS_NW:
                if which == 0:
                    nw = tl.load(NQ + rn).to(tl.float32)
                else:
                    nw = tl.load(NK + rn).to(tl.float32)
                acc = acc * nw[None, None, :]
            if ROUND:  # the unfused RMSNorm stores the normalized tensor in the activation dtype
                acc = acc.to(DT).to(tl.float32)
            if HAS_ROPE:
                pos = cos_off + s_idx
                c = tl.load(COS + (pos * scs)[:, None] + rn[None, :], mask=(rm < M)[:, None], other=0.0)
                sn = tl.load(SIN + (pos * scs)[:, None] + rn[None, :], mask=(rm < M)[:, None], other=0.0)
                ev, od = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_H, D // 2, 2)))
                rot = tl.reshape(tl.join(-od, ev), (BLOCK_M, BLOCK_H, D))
                acc = acc * c[:, None, :] + rot * sn[:, None, :]
        op = (OUT + which * so3 + (b_idx * sob + (seq_off + s_idx) * sos)[:, None, None] + (hs * soh)[None, :, None]
              + rn[None, None, :])
        tl.store(op, acc.to(OUT.dtype.element_ty), mask=(rm < M)[:, None, None] & hmask[None, :, None])

    @triton.jit
    def _qkv_norm_rope_gemm_kernel(X, W, Y, BIAS, NQ, NK, COS, SIN, OUT,
                                   M, K, S, H, seq_off, eps_q, eps_k,
                                   sxm, swn, sym, so3, sob, sos, soh, scs,
                                   FROM_Y: tl.constexpr, N_OUT: tl.constexpr,
                                   D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                                   HAS_NW: tl.constexpr, HAS_ROPE: tl.constexpr, ROUND: tl.constexpr,
                                   ROUND_BEFORE_W: tl.constexpr,
                                   DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
        pid = tl.program_id(0)
        # Grouped tile order: GROUP_M row tiles sweep all 3*H head tiles together, so the x rows stay
        # in L2 while W streams (W is the large operand at these shapes: 3*H*D x K).
        n_m = tl.cdiv(M, BLOCK_M)
        n_n = N_OUT * H  # q, k, v tiles (N_OUT 3), or q and k only (2)
        per_group = GROUP_M * n_n
        first_m = (pid // per_group) * GROUP_M
        gsize = tl.minimum(n_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % gsize
        pid_n = (pid % per_group) // gsize  # = which * H + h: rows pid_n*D .. of W_qkv
        which = pid_n // H  # 0 q, 1 k, 2 v
        h = pid_n % H

        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rm_ld = rm % M  # rows past M load a valid row; they are never stored
        rn = tl.arange(0, D)
        if FROM_Y:  # gemm "cublas": the linear's output, bias included, already in the activation dtype
            acc = tl.load(Y + rm_ld[:, None] * sym + (pid_n * D + rn)[None, :]).to(tl.float32)
        else:
            rk = tl.arange(0, BLOCK_K)
            xp = X + rm_ld[:, None] * sxm + rk[None, :]
            wp = W + (pid_n * D + rn)[None, :] * swn + rk[:, None]  # [BLOCK_K, D]: W^T tile
            acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
            for k0 in range(0, tl.cdiv(K, BLOCK_K)):
                if EVEN_K:
                    a = tl.load(xp)
                    b = tl.load(wp)
                else:
                    kin = rk < K - k0 * BLOCK_K
                    a = tl.load(xp, mask=kin[None, :], other=0.0)
                    b = tl.load(wp, mask=kin[:, None], other=0.0)
                if UPCAST_DOT:  # the CPU interpreter multiplies bf16 tiles as raw uint16 (triton 3.9); fp32 is exact
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
                xp += BLOCK_K
                wp += BLOCK_K

        if HAS_BIAS:  # nn.Linear adds the bias before rounding its output
            acc += tl.load(BIAS + pid_n * D + rn).to(tl.float32)[None, :]
        if ROUND:  # the unfused linear stores its output in the activation dtype
            acc = acc.to(OUT.dtype.element_ty).to(tl.float32)
        b_idx = rm // S
        s_idx = rm % S
        if which < 2:
            acc = _rms_rows(acc, which, eps_q, eps_k, NQ, NK, rn, D, HAS_NW, ROUND, ROUND_BEFORE_W, OUT.dtype.element_ty)
            if HAS_ROPE:
                cp = COS + (s_idx * scs)[:, None] + rn[None, :]
                c = tl.load(cp, mask=(rm < M)[:, None], other=0.0)
                sn = tl.load(SIN + (s_idx * scs)[:, None] + rn[None, :], mask=(rm < M)[:, None], other=0.0)
                acc = _rotate_pairs(acc, c, sn, BLOCK_M, D)
        op = OUT + which * so3 + (b_idx * sob + (seq_off + s_idx) * sos + h * soh)[:, None] + rn[None, :]
        tl.store(op, acc.to(OUT.dtype.element_ty), mask=(rm < M)[:, None])


# Under torch.compile: "op", this file's registered op (one graph node); "reference", the torch
# reference ops, which inductor then fuses itself. optbot's replay writes "reference" where the
# entry's recorded microbenchmark loses to the reference compiled by inductor (docs/store.md).
UNDER_COMPILE = "op"


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _stream_takes_triton(x: torch.Tensor, D: int, norm_q: Optional[torch.Tensor], norm_k: Optional[torch.Tensor]) -> bool:
    pow2 = D >= 32 and (D & (D - 1)) == 0  # the tile is one head: tl.arange and the pair split need a power of 2
    return _use_triton(x) and pow2 and (norm_q is None) == (norm_k is None)


def _stream_into(x, w, bias, norm_q, norm_k, eps_q, eps_k, cos, sin, heads, out, seq_offset, norm_style, rope_style, cfg,
                 y=None):
    """One stream into rows seq_offset .. seq_offset + S of `out` [3, B, S_joint, H, D], the op's own
    buffer (only _joint calls this). x: [B, S, K]; w: [3*H*D, K] (q, k, v rows stacked); bias:
    [3*H*D] or None; norm_q, norm_k: [D] or None; cos, sin: [S, D] for this stream's tokens, or None.
    y: the projection's output [B, S, 3*H*D] when the engine ran it (norm_rope; x, w and bias unused)."""
    if y is not None:
        x, w, bias = y, None, None
    B, S = x.shape[:2]
    D = out.shape[-1]
    if not _stream_takes_triton(x, D, norm_q, norm_k):
        stream = (reference_epilogue(*y.chunk(3, dim=-1), norm_q, norm_k, eps_q, eps_k, cos, sin, heads, norm_style, rope_style)
                  if y is not None else
                  reference_stream(x, w, bias, norm_q, norm_k, eps_q, eps_k, cos, sin, heads, norm_style, rope_style))
        for i, t in enumerate(stream[:out.shape[0]]):  # out[0:2] only: q and k (qk_only)
            out[i, :, seq_offset:seq_offset + S] = t
        return
    x2 = x.reshape(B * S, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if w is not None and w.stride(-1) != 1:
        w = w.contiguous()
    K = x2.shape[1]
    assert out.stride(-1) == 1 and out.shape[-1] == D and out.shape[-2] == heads, "out: [3, B, S_joint, H, D]"
    has_rope = cos is not None
    if has_rope:
        cos = cos.to(device=x.device, dtype=torch.float32).contiguous()
        sin = sin.to(device=x.device, dtype=torch.float32).contiguous()
        assert cos.shape == (S, D) and sin.shape == (S, D), "cos/sin: [S, D] for this stream"
    M = B * S
    from_y = y is not None or cfg["gemm"] == "cublas"
    # gemm "cublas": the engine's own linear (bias in cuBLAS's epilogue, output in x's dtype, as the
    # unfused nn.Linear stores it), then the kernel without its K loop; with y given, the same on it
    if y is not None:
        y, x2, w = x2, x2, x2  # the kernel reads only Y (its X, W and bias arguments are placeholders)
    elif from_y:
        y = F.linear(x2, w, bias)
    else:
        y = x2
    rounds = dict(ROUND=x.dtype != torch.float32, ROUND_BEFORE_W=norm_style == "diffusers" and norm_q is not None
                  and norm_q.dtype in (torch.float16, torch.bfloat16))
    if from_y and cfg["epilogue"] == "row-block":
        _rows([(y.view(B, S, -1), norm_q, norm_k, eps_q, eps_k, seq_offset, 0)], cos, sin, heads, out, norm_style, cfg)
        return
    grid = (triton.cdiv(M, cfg["block_m"]) * out.shape[0] * heads,)
    _qkv_norm_rope_gemm_kernel[grid](
        x2, w, y, bias if bias is not None else w, norm_q if norm_q is not None else w,
        norm_k if norm_k is not None else w, cos if has_rope else w, sin if has_rope else w, out,
        M, K, S, heads, seq_offset, float(eps_q), float(eps_k),
        x2.stride(0), w.stride(0), y.stride(0), out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        cos.stride(0) if has_rope else 0, FROM_Y=from_y, N_OUT=out.shape[0],
        D=D, BLOCK_M=cfg["block_m"], BLOCK_K=cfg["block_k"], GROUP_M=cfg["group_m"],
        EVEN_K=K % cfg["block_k"] == 0, HAS_BIAS=bias is not None and not from_y, HAS_NW=norm_q is not None,
        HAS_ROPE=has_rope, **rounds,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST_DOT=not x.is_cuda and x.dtype != torch.float32,
        num_stages=cfg["num_stages"], num_warps=cfg["num_warps"])


def _rows(segments, cos, sin, heads, out, norm_style, cfg) -> None:
    """The row-block epilogue kernel, one launch for one or two streams. segments: [(y, nq, nk, eps_q, eps_k,
    out_offset, table_offset)]: y the projection's output [B, S, 3*H*D], out_offset its first joint position
    in `out` [3, B, S_joint, H, D] ([2, ...]: q and k only), table_offset its first row in cos, sin ([rows, D], or None: no RoPE)."""
    segs = [None] + list(segments) if len(segments) == 1 else list(segments)  # segment 0 may be empty (M0 = 0)
    B = segs[1][0].shape[0]
    flat = []
    for sg in segs:
        if sg is not None:
            y, *rest = sg
            y2 = y.reshape(B * y.shape[1], y.shape[-1])
            flat.append((y2 if y2.stride(-1) == 1 else y2.contiguous(), y.shape[1], *rest))
        else:
            flat.append(None)
    f0, f1 = flat
    y1, S1, nq1, nk1, eq1, ek1, off1, toff1 = f1
    y0, S0, nq0, nk0, eq0, ek0, off0, toff0 = f0 if f0 is not None else (y1, 0, nq1, nk1, 0.0, 0.0, 0, 0)
    has_rope = cos is not None
    if has_rope:  # no copy when the engine hands fp32 contiguous tables (it converts them once per forward)
        cos = cos.to(device=y1.device, dtype=torch.float32).contiguous()
        sin = sin.to(device=y1.device, dtype=torch.float32).contiguous()
    ref = nq1 if nq1 is not None else y1  # a pointer for the arguments a config does not read
    grid = (triton.cdiv(B * S0, cfg["block_m"]) + triton.cdiv(B * S1, cfg["block_m"]),
            out.shape[0] * triton.cdiv(heads, cfg["block_h"]))  # q, k, v blocks, or q and k only
    _norm_rope_rows_kernel[grid](
        y0, y1, ref if nq0 is None else nq0, ref if nk0 is None else nk0, ref if nq1 is None else nq1,
        ref if nk1 is None else nk1, cos if has_rope else ref, sin if has_rope else ref, out,
        B * S0, B * S1, max(S0, 1), S1, off0, off1, toff0, toff1, heads, float(eq0), float(ek0), float(eq1), float(ek1),
        y0.stride(0), y1.stride(0), out.stride(0), out.stride(1), out.stride(2), out.stride(3),
        cos.stride(0) if has_rope else 0,
        D=out.shape[-1], BLOCK_M=cfg["block_m"], BLOCK_H=cfg["block_h"], HAS_NW=nq1 is not None, HAS_ROPE=has_rope,
        ROUND=y1.dtype != torch.float32,
        ROUND_BEFORE_W=norm_style == "diffusers" and nq1 is not None and nq1.dtype in (torch.float16, torch.bfloat16),
        num_warps=cfg["num_warps"])


def _one_launch(t_txt, t_img, nq_txt, nk_txt, nq_img, nk_img, out, cfg) -> bool:
    """Both streams in one launch of the row-block kernel: both take the Triton path, with the same
    norm-weight presence (the kernel's HAS_NW) and dtype."""
    if t_txt is None or cfg["epilogue"] != "row-block" or t_txt.dtype != t_img.dtype:
        return False
    D = out.shape[-1]
    return (_stream_takes_triton(t_txt, D, nq_txt, nk_txt) and _stream_takes_triton(t_img, D, nq_img, nk_img)
            and (nq_txt is None) == (nq_img is None))


def _linear_rows(x, w, bias):
    """gemm "cublas": the engine's own linear on [B*S, K] rows (bias in cuBLAS's epilogue, output in x's
    dtype, as the unfused nn.Linear stores it), shaped back to [B, S, 3*H*D]."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return F.linear(x2, w if w.stride(-1) == 1 else w.contiguous(), bias).view(*x.shape[:2], -1)


def _joint_shape(x_txt: Optional[torch.Tensor], x_img: torch.Tensor, w_img: torch.Tensor, heads: int) -> tuple:
    s_txt = 0 if x_txt is None else x_txt.shape[1]
    return (3, x_img.shape[0], s_txt + x_img.shape[1], heads, w_img.shape[0] // (3 * heads))


def _joint(x_txt: Optional[torch.Tensor], x_img: torch.Tensor, w_txt: Optional[torch.Tensor], w_img: torch.Tensor,
           b_txt: Optional[torch.Tensor], b_img: Optional[torch.Tensor], nq_txt: Optional[torch.Tensor],
           nk_txt: Optional[torch.Tensor], nq_img: Optional[torch.Tensor], nk_img: Optional[torch.Tensor],
           cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], eq_t: float, ek_t: float, eq_i: float,
           ek_i: float, heads: int, norm_style: str, rope_style: str, block_m: int, block_k: int, group_m: int,
           num_stages: int, num_warps: int, gemm: str, epilogue: str, block_h: int) -> torch.Tensor:
    """The op: both streams into one new [3, B, S_txt + S_img, H, D] (text first)."""
    s_txt = 0 if x_txt is None else x_txt.shape[1]
    out = torch.empty(_joint_shape(x_txt, x_img, w_img, heads), dtype=x_img.dtype, device=x_img.device)
    cfg = {"block_m": block_m, "block_k": block_k, "group_m": group_m, "num_stages": num_stages, "num_warps": num_warps,
           "gemm": gemm, "epilogue": epilogue, "block_h": block_h}
    if gemm == "cublas" and _one_launch(x_txt, x_img, nq_txt, nk_txt, nq_img, nk_img, out, cfg):
        _rows([(_linear_rows(x_txt, w_txt, b_txt), nq_txt, nk_txt, eq_t, ek_t, 0, 0),
               (_linear_rows(x_img, w_img, b_img), nq_img, nk_img, eq_i, ek_i, s_txt, s_txt)], cos, sin, heads, out,
              norm_style, cfg)
        return out
    if x_txt is not None:
        _stream_into(x_txt, w_txt, b_txt, nq_txt, nk_txt, eq_t, ek_t, None if cos is None else cos[:s_txt],
                     None if sin is None else sin[:s_txt], heads, out, 0, norm_style, rope_style, cfg)
    _stream_into(x_img, w_img, b_img, nq_img, nk_img, eq_i, ek_i, None if cos is None else cos[s_txt:],
                 None if sin is None else sin[s_txt:], heads, out, s_txt, norm_style, rope_style, cfg)
    return out


def _joint_y(y_txt: Optional[torch.Tensor], y_img: torch.Tensor, nq_txt: Optional[torch.Tensor],
             nk_txt: Optional[torch.Tensor], nq_img: Optional[torch.Tensor], nk_img: Optional[torch.Tensor],
             cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], eq_t: float, ek_t: float, eq_i: float,
             ek_i: float, heads: int, norm_style: str, rope_style: str, block_m: int, num_warps: int,
             epilogue: str, block_h: int, n_out: int) -> torch.Tensor:
    """The op of norm_rope: both streams' projection outputs into one new [n_out, B, S_txt + S_img, H, D]
    (n_out 3: q, k, v; 2: q and k only)."""
    out = torch.empty(_joint_y_shape(y_txt, y_img, heads, n_out), dtype=y_img.dtype, device=y_img.device)
    s_txt = 0 if y_txt is None else y_txt.shape[1]
    cfg = {**DEFAULT_CONFIG, "block_m": block_m, "num_warps": num_warps, "epilogue": epilogue, "block_h": block_h}
    if _one_launch(y_txt, y_img, nq_txt, nk_txt, nq_img, nk_img, out, cfg):
        _rows([(y_txt, nq_txt, nk_txt, eq_t, ek_t, 0, 0), (y_img, nq_img, nk_img, eq_i, ek_i, s_txt, s_txt)],
              cos, sin, heads, out, norm_style, cfg)
        return out
    if y_txt is not None:
        _stream_into(None, None, None, nq_txt, nk_txt, eq_t, ek_t, None if cos is None else cos[:s_txt],
                     None if sin is None else sin[:s_txt], heads, out, 0, norm_style, rope_style, cfg, y=y_txt)
    _stream_into(None, None, None, nq_img, nk_img, eq_i, ek_i, None if cos is None else cos[s_txt:],
                 None if sin is None else sin[s_txt:], heads, out, s_txt, norm_style, rope_style, cfg, y=y_img)
    return out


def _joint_y_shape(y_txt: Optional[torch.Tensor], y_img: torch.Tensor, heads: int, n_out: int) -> tuple:
    s_txt = 0 if y_txt is None else y_txt.shape[1]
    return (n_out, y_img.shape[0], s_txt + y_img.shape[1], heads, y_img.shape[-1] // (3 * heads))


def _register():
    """One registration per process: a second copy of this file (the store's and an engine
    worktree's are byte-identical, store check) reuses the op the first registered."""
    try:
        return getattr(torch.ops.optbot, _OP_NAME)
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op(f"optbot::{_OP_NAME}", mutates_args=())(_joint)

    @op.register_fake
    def _fake(x_txt, x_img, w_txt, w_img, b_txt, b_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin,
              eq_t, ek_t, eq_i, ek_i, heads, *style_and_config):
        return x_img.new_empty(_joint_shape(x_txt, x_img, w_img, heads))

    return op


def _register_y():
    try:
        return getattr(torch.ops.optbot, _OP_NAME + "_y")
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op(f"optbot::{_OP_NAME}_y", mutates_args=())(_joint_y)

    @op.register_fake
    def _fake(y_txt, y_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, eq_t, ek_t, eq_i, ek_i, heads, norm_style,
              rope_style, block_m, num_warps, epilogue, block_h, n_out):
        return y_img.new_empty(_joint_y_shape(y_txt, y_img, heads, n_out))

    return op


_OP = _register()
_OP_Y = _register_y()


def qkv_norm_rope(x_txt, x_img, w_txt, w_img, b_txt, b_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, eps, heads,
                  norm_style="torch", rope_style="real", block_m=None, block_k=None, group_m=None, num_stages=None,
                  num_warps=None, gemm=None, epilogue=None, block_h=None):
    """Both streams of a joint-attention block: returns q, k, v stacked, [3, B, S_txt + S_img, H, D]
    (text first), a new tensor. cos, sin: [S_txt + S_img, D] or None; eps: one float, or (q_txt,
    k_txt, q_img, k_img). gemm ("cublas" or "triton"), epilogue (EPILOGUES), block_m, block_h, block_k,
    group_m, num_stages, num_warps: the config (None: DEFAULT_CONFIG's)."""
    global _last_path
    if _aside():
        _last_path = "torch"
        return reference(x_txt, x_img, w_txt, w_img, b_txt, b_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, eps, heads,
                         norm_style, rope_style)
    eq_t, ek_t, eq_i, ek_i = eps if isinstance(eps, (tuple, list)) else (eps,) * 4
    cfg = dict(DEFAULT_CONFIG)
    for key, val in (("block_m", block_m), ("block_h", block_h), ("block_k", block_k), ("group_m", group_m),
                     ("num_stages", num_stages), ("num_warps", num_warps)):
        if val is not None:
            cfg[key] = int(val)
    _check_block_h(cfg["block_h"])
    cfg.update(_choice("gemm", gemm, GEMMS), **_choice("epilogue", epilogue, EPILOGUES))
    D = w_img.shape[0] // (3 * heads)
    paths = [_stream_takes_triton(x_img, D, nq_img, nk_img)]
    if x_txt is not None:
        paths.append(_stream_takes_triton(x_txt, D, nq_txt, nk_txt))
    _last_path = "triton" if all(paths) else "torch"
    # The registered op only under torch.compile (one graph node, no break); eager calls the
    # function itself: custom_op's Python dispatch costs tens of microseconds a call, more than
    # the kernel at small shapes (H200 micro, benchmarks/results/h200-modes-20261201/).
    return (_OP if torch.compiler.is_compiling() else _joint)(x_txt, x_img, w_txt, w_img, b_txt, b_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, float(eq_t),
               float(ek_t), float(eq_i), float(ek_i), int(heads), norm_style, rope_style, cfg["block_m"],
               cfg["block_k"], cfg["group_m"], cfg["num_stages"], cfg["num_warps"], cfg["gemm"], cfg["epilogue"],
               cfg["block_h"])


def norm_rope(y_txt, y_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, eps, heads, norm_style="torch",
              rope_style="real", block_m=None, num_warps=None, epilogue=None, block_h=None, qk_only=False):
    """The epilogue alone, for projections the engine ran itself (a quantized linear, or FLUX.2's
    single-stream to_qkv_mlp_proj): y_txt, y_img are the outputs [B, S, 3*H*D] of the merged q|k|v
    projections (bias included; rows may be strided, the last dim contiguous); returns q, k, v stacked,
    [3, B, S_txt + S_img, H, D] (text first), as qkv_norm_rope does, or with qk_only q and k only,
    [2, B, S_txt + S_img, H, D] (v is then the caller's view of y)."""
    global _last_path
    eq_t, ek_t, eq_i, ek_i = eps if isinstance(eps, (tuple, list)) else (eps,) * 4
    D = y_img.shape[-1] // (3 * heads)
    paths = [_stream_takes_triton(y, D, nq, nk) for y, nq, nk in ((y_img, nq_img, nk_img), (y_txt, nq_txt, nk_txt))
             if y is not None]
    _last_path = "triton" if all(paths) else "torch"
    bm = DEFAULT_CONFIG["block_m"] if block_m is None else int(block_m)
    nw = DEFAULT_CONFIG["num_warps"] if num_warps is None else int(num_warps)
    ep = _choice("epilogue", epilogue, EPILOGUES).get("epilogue", DEFAULT_CONFIG["epilogue"])
    bh = _check_block_h(DEFAULT_CONFIG["block_h"] if block_h is None else int(block_h))
    return (_OP_Y if torch.compiler.is_compiling() else _joint_y)(
        y_txt, y_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, float(eq_t), float(ek_t), float(eq_i), float(ek_i),
        int(heads), norm_style, rope_style, bm, nw, ep, bh, 2 if qk_only else 3)


def reference_norm_rope(y_txt, y_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, eps, heads, norm_style="torch",
                        rope_style="real", qk_only=False):
    """norm_rope's unfused engine code: reference() with the projections already run."""
    eq_t, ek_t, eq_i, ek_i = eps if isinstance(eps, (tuple, list)) else (eps,) * 4
    s_txt = 0 if y_txt is None else y_txt.shape[1]
    per_stream = rope_style == "complex" and cos is not None
    cs = (lambda a, b: (None, None)) if not per_stream else (lambda a, b: (cos[a:b], sin[a:b]))
    qi, ki, vi = reference_epilogue(*y_img.chunk(3, dim=-1), nq_img, nk_img, eq_i, ek_i, *cs(s_txt, None), heads,
                                    norm_style, rope_style)
    if y_txt is not None:
        qt, kt, vt = reference_epilogue(*y_txt.chunk(3, dim=-1), nq_txt, nk_txt, eq_t, ek_t, *cs(0, s_txt), heads,
                                        norm_style, rope_style)
        qi, ki, vi = torch.cat([qt, qi], dim=1), torch.cat([kt, ki], dim=1), torch.cat([vt, vi], dim=1)
    if cos is not None and not per_stream:
        qi, ki = _rope(qi, cos, sin), _rope(ki, cos, sin)
    return torch.stack([qi, ki] if qk_only else [qi, ki, vi])


def _check_block_h(block_h: int) -> int:
    if block_h < 1 or block_h & (block_h - 1):
        raise ValueError(f"block_h must be a power of 2 (heads per program of the row-block epilogue), not {block_h}")
    return block_h


def _choice(key: str, value, allowed: tuple) -> dict:
    """{key: value} for a given string config (checked against `allowed`), {} for None."""
    if value is None:
        return {}
    if value not in allowed:
        raise ValueError(f"{key} must be one of {allowed}, not {value!r}")
    return {key: value}


def reference(x_txt, x_img, w_txt, w_img, b_txt, b_img, nq_txt, nk_txt, nq_img, nk_img, cos, sin, eps, heads,
              norm_style="torch", rope_style="real"):
    """The unfused engine code for both streams, in the engine's order: per stream linear -> heads ->
    RMSNorm; FLUX.2 then concatenates [txt, img] and applies RoPE over the joint sequence, Qwen-Image
    applies RoPE per stream and then concatenates. Returns [3, B, S, H, D]."""
    eq_t, ek_t, eq_i, ek_i = eps if isinstance(eps, (tuple, list)) else (eps,) * 4
    s_txt = 0 if x_txt is None else x_txt.shape[1]
    per_stream = rope_style == "complex" and cos is not None
    cs = (lambda a, b: (None, None)) if not per_stream else (lambda a, b: (cos[a:b], sin[a:b]))
    qi, ki, vi = reference_stream(x_img, w_img, b_img, nq_img, nk_img, eq_i, ek_i, *cs(s_txt, None), heads, norm_style, rope_style)
    if x_txt is not None:
        qt, kt, vt = reference_stream(x_txt, w_txt, b_txt, nq_txt, nk_txt, eq_t, ek_t, *cs(0, s_txt), heads, norm_style, rope_style)
        qi, ki, vi = torch.cat([qt, qi], dim=1), torch.cat([kt, ki], dim=1), torch.cat([vt, vi], dim=1)
    if cos is not None and not per_stream:
        qi, ki = _rope(qi, cos, sin), _rope(ki, cos, sin)
    return torch.stack([qi, ki, vi])
