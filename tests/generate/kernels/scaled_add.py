"""A small Triton kernel for the variant-search tests: out = x + alpha * y, blocked over a flat index.
BLOCK is the tunable; BLOCK=8 with a broken mask (the `buggy` flag) is a deliberately wrong variant."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

CONFIG_SPACE = {"BLOCK": [16, 64, 256], "num_warps": [1, 4], "buggy": [False, True]}

_last = ""


@triton.jit
def _scaled_add(X, Y, OUT, n, alpha, BLOCK: tl.constexpr, BUGGY: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0)
    y = tl.load(Y + offs, mask=m, other=0.0)
    if BUGGY:
        y = y * 0.5  # wrong on purpose
    tl.store(OUT + offs, x + alpha * y, mask=m)


def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float, BLOCK: int = 64, num_warps: int = 4,
               buggy: bool = False) -> torch.Tensor:
    global _last
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        _last = "torch"
        return x + alpha * y
    out = torch.empty_like(x)
    n = x.numel()
    _scaled_add[(triton.cdiv(n, BLOCK),)](x, y, out, n, alpha, BLOCK=BLOCK, BUGGY=buggy, num_warps=num_warps)
    _last = "triton"
    return out


def last_path() -> str:
    return _last
