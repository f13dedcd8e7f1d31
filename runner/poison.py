"""Poison memory before a correctness run, so a candidate cannot pass on stale memory.

A published "100x" kernel returned an uninitialized output buffer that happened to hold the
reference's result from an earlier run. Two defences, both used by runner/kinds/validate_step.py:

1. ``poison_allocator(device)``: fill memory the allocator will hand out next with NaN.
   - CUDA: torch's caching allocator keeps freed blocks and hands them to the next ``torch.empty``
     of a fitting size. We allocate large blocks (a share of the free memory, capped) plus many
     small ones (the small-block pool is separate), fill them with NaN and free them: the next
     allocations are carved out of NaN memory.
   - CPU: tensors come from the C allocator (posix_memalign). We allocate and NaN-fill blocks of
     several sizes and free them, which leaves NaN in the heap chunks the next malloc reuses. That is
     best effort: large blocks are mmap'd and come back zeroed from the kernel (zeros are wrong too,
     but not NaN), so defence 2 is what makes CPU runs strict.
2. ``PoisonEmpty()``: a TorchDispatchMode under which every floating-point tensor made by
   ``empty``, ``empty_like``, ``empty_strided``, ``new_empty`` and ``new_empty_strided`` is filled
   with NaN before the caller sees it. An output that is never written stays NaN and fails the
   finite check, deterministically, on any device. Only ops dispatched from Python-visible calls are
   intercepted (inside our handler the mode is off), so library kernels' own scratch buffers are
   unaffected. Integer tensors are left alone (there is no NaN for them).

Base and candidate run under the same poisoning, so poisoning never changes what "correct" means.

``PoisonEmpty`` is compile-transparent (``ignore_compile_internals``): a region under
``torch.compile`` is compiled and its compiled code is what runs, with the mode on around it. A
non-transparent mode makes dynamo refuse to trace and mark the frame's code object "skip" for the
rest of the process, so a compiled candidate ran eager in the correctness runs AND in the profile and
timing after them, in the same process (the H200 compile-region verdict: outputs bit-identical to the
base, op histogram identical). The cost: buffers that compiled code allocates itself (inductor's
``empty_strided``) do not pass through the dispatcher, so defence 2 does not see them; on CUDA
defence 1 still hands them NaN memory from the caching allocator, on CPU it is best effort.
What the compiled code dispatches (fallback and custom ops) and all eager code still pass through it.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_EMPTY_OPS = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
}


class PoisonEmpty(TorchDispatchMode):
    """Fill every new uninitialized floating-point tensor with NaN."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Let torch.compile compile under the mode (module docstring): the validator checks the code
        # that the timing runs, compiled, not an eager fallback of it.
        return True

    def __init__(self):
        super().__init__()
        self.filled = 0  # how many tensors were poisoned (reported, so a test can see it worked)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _EMPTY_OPS and isinstance(out, torch.Tensor) and (out.is_floating_point() or out.is_complex()):
            out.fill_(float("nan"))
            self.filled += 1
        return out


def poison_allocator(device: str, max_bytes: int | None = None) -> dict:
    """Leave NaN in the memory the allocator hands out next. Returns what was done (for the log)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        # Leave headroom: the step itself needs memory, and a failed poison must not cause an OOM.
        budget = int(min(free * 0.5, max_bytes or 16 * 2**30))
        blocks = []
        size = budget
        # a few large blocks of decreasing size, so large allocations of any size find NaN
        while size >= 2**20 and sum(b.numel() * 4 for b in blocks) < budget:
            try:
                blocks.append(torch.full((size // 4,), float("nan"), device=dev, dtype=torch.float32))
            except torch.OutOfMemoryError:
                pass
            size //= 2
        # the small-block pool (allocations under 1 MiB live in 2 MiB segments of their own)
        small = [torch.full((512 * 1024 // 4,), float("nan"), device=dev) for _ in range(64)]
        n = sum(b.numel() * 4 for b in blocks) + sum(b.numel() * 4 for b in small)
        torch.cuda.synchronize(dev)
        del blocks, small  # freed into the caching allocator, not to the driver
        return {"device": "cuda", "bytes": n, "how": "caching allocator: NaN blocks allocated and freed"}
    n = 0
    keep = []
    for size in (4 << 10, 64 << 10, 256 << 10, 1 << 20, 8 << 20, 32 << 20):
        for _ in range(4):
            keep.append(torch.full((size // 4,), float("nan"), dtype=torch.float32))
            n += size
    del keep
    return {"device": "cpu", "bytes": n, "how": "heap blocks NaN-filled and freed (best effort); empty() -> NaN mode"}
