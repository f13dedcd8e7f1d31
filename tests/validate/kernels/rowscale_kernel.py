"""A small Triton kernel and its reference, following the kernel test contract (docs/validate.md):
y[m, n] = x[m, n] * s[n]. `kernel` handles every row; `kernel_full_tiles` only whole 16-row tiles
(the "specialized to one shape" mistake: right when M % 16 == 0)."""
import torch
import triton
import triton.language as tl

SHAPES = [(64, 96), (48, 40)]
NAME = "rowscale"


@triton.jit
def _rowscale(x_ptr, s_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    cols = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask)
    s = tl.load(s_ptr + cols, mask=cols < N)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], x * s[None, :], mask=mask)


def make_inputs(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    m, n = shape
    return (torch.randn(m, n, generator=g).to(device, dtype), torch.randn(n, generator=g).to(device, dtype))


def reference(x, s):
    return x * s


def _launch(x, s, grid_rows):
    y = torch.empty_like(x)
    m, n = x.shape
    _rowscale[(grid_rows,)](x, s, y, m, n, BLOCK_M=16, BLOCK_N=triton.next_power_of_2(n))
    return y


def kernel(x, s):
    return _launch(x, s, triton.cdiv(x.shape[0], 16))


def kernel_full_tiles(x, s):
    return _launch(x, s, x.shape[0] // 16)
