"""Health probe: is the device usable? Run after a job faulted on a GPU, before the next job.

A small matmul whose result is known, on the job's device, synchronized. A device left in a bad
state by an illegal memory access (or a hung context) fails here instead of failing the next
candidate's validation with a misleading reason.
"""
from __future__ import annotations

import torch

from runner import env as envmod


def run(job) -> dict:
    dev = job.device
    a = torch.arange(64 * 64, dtype=torch.float32, device=dev).reshape(64, 64) / 4096
    b = torch.eye(64, dtype=torch.float32, device=dev) * 2
    c = a @ b
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    ok = bool(torch.equal(c.cpu(), (a * 2).cpu()))
    if not ok:
        raise RuntimeError("health probe: a 64x64 matmul returned a wrong result")
    return {"ok": True, "healthy": True, "env": envmod.capture(dev)}
