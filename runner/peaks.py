"""Ceilings measured in the same job as the profile: matmul rate and copy bandwidth.

Roofline figures use these, not datasheet numbers (DESIGN decision 9). On the GPU: a large bf16
matmul on random data (zeros run faster and flatter the ceiling) and a 1 GiB device-to-device
copy, counted as bytes read + bytes written. A ceiling is a best case, so it is the fastest trial. On the CPU: the same at CPU sizes, in the job's dtype.
"""
from __future__ import annotations

import torch

from runner.timing import time_fn


def measure(device: str, dtype: torch.dtype) -> dict:
    is_cuda = device.startswith("cuda")
    # A ceiling is the best the device does: the fastest trial (min) of the best of two shapes,
    # a square one and a DiT-like one (tokens x hidden -> 3 x hidden).
    shapes = [(8192, 8192, 8192), (4608, 6144, 18432)] if is_cuda else [(1024, 1024, 1024)]
    # inputs drawn on the CPU and copied: no device RNG (its state may be poisoned by a candidate's
    # failed graph capture earlier in the same process)
    g = torch.Generator(device="cpu").manual_seed(0)
    # Two products per trial (host sync overhead stays small), and a pause between trials: a long
    # stream of back-to-back 8192^3 products runs into the power limit and measures a throttled
    # clock (685 TFLOP/s sustained on the H200, while FLUX.2's own GEMMs ran at 763 in the step).
    reps = 2
    best = (0.0, shapes[0])
    for m, k, n in shapes:
        a = torch.randn(m, k, dtype=torch.float32, generator=g).to(device=device, dtype=dtype)
        b = torch.randn(k, n, dtype=torch.float32, generator=g).to(device=device, dtype=dtype)

        def mm_batch():
            for _ in range(reps):
                torch.mm(a, b)

        # a long warm-up: an idle H200 sits at 345 MHz and needs time under load to reach full clocks
        mm = time_fn(mm_batch, device, warmup=20 if is_cuda else 2, iters=20 if is_cuda else 5, flush_l2=False,
                     pause_s=0.05 if is_cuda else 0.0)
        rate = reps * 2 * m * k * n / (mm.min_ms * 1e-3) / 1e12
        if rate > best[0]:
            best = (rate, (m, k, n))
        del a, b
    nbytes = (1 << 30) if is_cuda else (64 << 20)
    src = torch.arange(nbytes // 4, device=device, dtype=torch.float32)  # copy speed ignores values
    dst = torch.empty_like(src)
    copy_reps = 10 if is_cuda else 2

    def cp_batch():
        for _ in range(copy_reps):
            dst.copy_(src)

    cp = time_fn(cp_batch, device, warmup=5, iters=10 if is_cuda else 5, flush_l2=False)
    del src, dst
    return {
        "device": "cuda" if is_cuda else "cpu",
        "matmul_tflops": round(best[0], 2),
        "matmul_shape": list(best[1]),
        "matmul_dtype": str(dtype).replace("torch.", ""),
        "copy_gbps": round(copy_reps * 2 * nbytes / (cp.min_ms * 1e-3) / 1e9, 1),
        "copy_bytes": nbytes,
    }
