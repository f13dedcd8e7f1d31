"""Ceilings measured in the same job as the profile: matmul rate and copy bandwidth.

Roofline figures use these, not datasheet numbers (DESIGN decision 9). On the GPU: a large bf16
matmul on random data (zeros run faster and flatter the ceiling) and a 1 GiB device-to-device
copy, counted as bytes read + bytes written. On the CPU: the same at CPU sizes, in the job's dtype.
"""
from __future__ import annotations

import torch

from runner.timing import time_fn


def measure(device: str, dtype: torch.dtype) -> dict:
    is_cuda = device.startswith("cuda")
    n = 8192 if is_cuda else 1024
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    reps = 10 if is_cuda else 2  # several products per trial: host sync overhead stays < 0.5%

    def mm_batch():
        for _ in range(reps):
            torch.mm(a, b)

    # a long warm-up: an idle H200 sits at 345 MHz and needs time under load to reach full clocks
    mm = time_fn(mm_batch, device, warmup=20 if is_cuda else 2, iters=10 if is_cuda else 5, flush_l2=False)
    nbytes = (1 << 30) if is_cuda else (64 << 20)
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    def cp_batch():
        for _ in range(reps):
            dst.copy_(src)

    cp = time_fn(cp_batch, device, warmup=5, iters=10 if is_cuda else 5, flush_l2=False)
    del a, b, src, dst
    return {
        "device": "cuda" if is_cuda else "cpu",
        "matmul_tflops": round(reps * 2 * n**3 / (mm.median_ms * 1e-3) / 1e12, 2),
        "matmul_shape": [n, n, n],
        "matmul_dtype": str(dtype).replace("torch.", ""),
        "copy_gbps": round(reps * 2 * nbytes / (cp.median_ms * 1e-3) / 1e9, 1),
        "copy_bytes": nbytes,
    }
