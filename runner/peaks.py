"""Ceilings measured in the same job as the profile: matmul rate and copy bandwidth.

Roofline figures use these, not datasheet numbers (DESIGN decision 9). On the GPU: a large bf16
matmul on random data (zeros run faster and flatter the ceiling) and a 1 GiB device-to-device
copy, counted as bytes read + bytes written. A ceiling is a best case, so it is the fastest trial. On the CPU: the same at CPU sizes, in the job's dtype.

With `fp8=True` (bench's floor rows), also the FP8 matmul ceiling: `torch._scaled_mm` on float8
e4m3 operands with row-wise float32 scales and a bf16 output, the form an FP8 deployment's linear
layers take (dynamic per-token activation scales, per-channel weight scales), with fast accumulation
on a GPU as the deployments set it. Measured where it
runs: a CUDA device of compute capability 8.9 or newer, and the CPU (where torch emulates it,
slower than float32: the figure says so rather than flattering anything). Elsewhere it is None
with the reason.

With `sustained=True` on CUDA (bench's floor rows), also the matmul rate a dense step can hold: the
DiT-like product back to back for about 3 s, no pauses, the median batch. An H200 kept busy runs
into its 700 W power cap (nvidia-smi's throttle reason "SW power cap") and its SM clock drops from
1980 to about 1600-1650 MHz (benchmarks/results/h200-qwen-aside-20261204/), so a compiled or
graph-replayed step cannot reach the burst ceiling the first floor row uses.
"""
from __future__ import annotations

import torch

from runner import quant
from runner.errors import error_line
from runner.timing import time_fn


def _shapes(is_cuda: bool) -> list[tuple[int, int, int]]:
    # the best of two shapes, a square one and a DiT-like one (tokens x hidden -> 3 x hidden)
    return [(8192, 8192, 8192), (4608, 6144, 18432)] if is_cuda else [(1024, 1024, 1024)]


def _best_rate(device: str, make, op) -> tuple[float, tuple[int, int, int]]:
    """The fastest trial's TFLOP/s over the shapes: `make(m, k, n, g)` gives the operands (drawn on
    the CPU from a fixed generator and copied: no device RNG, whose state a candidate's failed
    graph capture earlier in the process may have poisoned), `op(*operands)` one product."""
    is_cuda = device.startswith("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    # Two products per trial (host sync overhead stays small), and a pause between trials: a long
    # stream of back-to-back 8192^3 products runs into the power limit and measures a throttled
    # clock (685 TFLOP/s sustained on the H200, while FLUX.2's own GEMMs ran at 763 in the step).
    reps = 2
    best = (0.0, _shapes(is_cuda)[0])
    for m, k, n in _shapes(is_cuda):
        operands = make(m, k, n, g)

        def batch():
            for _ in range(reps):
                op(*operands)

        # a long warm-up: an idle H200 sits at 345 MHz and needs time under load to reach full clocks
        t = time_fn(batch, device, warmup=20 if is_cuda else 2, iters=20 if is_cuda else 5, flush_l2=False,
                    pause_s=0.05 if is_cuda else 0.0)
        rate = reps * 2 * m * k * n / (t.min_ms * 1e-3) / 1e12
        if rate > best[0]:
            best = (rate, (m, k, n))
        del operands
    return best


def _fp8_operands(device: str):
    def make(m, k, n, g):
        a = torch.randn(m, k, generator=g).to(device=device, dtype=torch.float8_e4m3fn)  # [M, K] row-major
        b = torch.randn(n, k, generator=g).to(device=device, dtype=torch.float8_e4m3fn).t()  # [K, N] column-major
        sa = (torch.rand(m, 1, generator=g) + 0.5).to(device)  # per-row (token) scales
        sb = (torch.rand(1, n, generator=g) + 0.5).to(device)  # per-column (output channel) scales
        return a, b, sa, sb
    return make


def _fp8_mm(a, b, sa, sb):
    # fast accumulation on the GPU, as both FP8 deployments run their GEMMs (torchao's Float8MMConfig
    # default, SGLang's FP8 GEMM): without it Hopper's FP8 products promote partial sums more often and
    # run slower, so the "ceiling" sat below the steps' own GEMMs (FLUX.2's at 1,431 TFLOP/s against
    # 1,182 measured here, H100, 2026-12-06)
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=a.is_cuda)


def _sustained_rate(device: str, dtype: torch.dtype) -> tuple[float, tuple[int, int, int]]:
    """TFLOP/s of the DiT-like product held for ~3 s without pauses: the median of 20 batches of 100
    after 10 batches of warm-up (the power cap engages within the first second)."""
    m, k, n = _shapes(True)[1]
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=g).to(device=device, dtype=dtype)
    reps = 100

    def batch():
        for _ in range(reps):
            torch.mm(a, b)

    t = time_fn(batch, device, warmup=10, iters=20, flush_l2=False)
    return reps * 2 * m * k * n / (t.median_ms * 1e-3) / 1e12, (m, k, n)


def measure(device: str, dtype: torch.dtype, fp8: bool = False, sustained: bool = False) -> dict:
    is_cuda = device.startswith("cuda")

    def make(m, k, n, g):
        return (torch.randn(m, k, dtype=torch.float32, generator=g).to(device=device, dtype=dtype),
                torch.randn(k, n, dtype=torch.float32, generator=g).to(device=device, dtype=dtype))

    rate, shape = _best_rate(device, make, torch.mm)
    nbytes = (1 << 30) if is_cuda else (64 << 20)
    src = torch.arange(nbytes // 4, device=device, dtype=torch.float32)  # copy speed ignores values
    dst = torch.empty_like(src)
    copy_reps = 10 if is_cuda else 2

    def cp_batch():
        for _ in range(copy_reps):
            dst.copy_(src)

    cp = time_fn(cp_batch, device, warmup=5, iters=10 if is_cuda else 5, flush_l2=False)
    del src, dst
    out = {
        "device": "cuda" if is_cuda else "cpu",
        "matmul_tflops": round(rate, 2),
        "matmul_shape": list(shape),
        "matmul_dtype": str(dtype).replace("torch.", ""),
        "copy_gbps": round(copy_reps * 2 * nbytes / (cp.min_ms * 1e-3) / 1e9, 1),
        "copy_bytes": nbytes,
    }
    if sustained and is_cuda:
        s_rate, s_shape = _sustained_rate(device, dtype)
        out.update(matmul_sustained_tflops=round(s_rate, 2), matmul_sustained_shape=list(s_shape))
    if fp8:
        why = quant.fp8_unsupported(device)
        if not why:
            try:
                f_rate, f_shape = _best_rate(device, _fp8_operands(device), _fp8_mm)
                out.update(fp8_matmul_tflops=round(f_rate, 2), fp8_matmul_shape=list(f_shape),
                           fp8_matmul_form="_scaled_mm e4m3 x e4m3, row-wise fp32 scales, bf16 out"
                           + (", fast accumulation" if device.startswith("cuda") else ""))
            except RuntimeError as e:  # a build without the kernel for this device
                why = f"_scaled_mm failed: {error_line(e)}"
        if why:
            out.update(fp8_matmul_tflops=None, fp8_matmul_why=why)
    return out
