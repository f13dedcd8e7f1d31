"""A kernel test (the kernel test contract, docs/store.md) of the OLD flux2-qk-rmsnorm-rope call
pattern: the engine's `new_empty` of the joint [txt, img] layout with the Triton kernel writing into
two slices of it. Run as a kernel_test job with the runner's compile and compile+graph modes, it
shows whether those modes catch the fault at the kernel test's small shapes and at FLUX.2's
(benchmarks/results/h200-qknorm-compile-graph-20261201/README.md)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kernel_store" / "flux2-qk-rmsnorm-rope"))
import test_qk_norm_rope as t  # noqa: E402
from qk_norm_rope import last_path, qk_rmsnorm_rope  # noqa: E402

SHAPES = t.SHAPES + [(1, 4608, 48, 128)]  # FLUX.2: 512 text + 4096 image tokens would be S // 3 = 1536 here
CASES = [("bfloat16", 2e-2, 2e-2)]
make_inputs, reference = t.make_inputs, t.reference


def kernel(x, weight, ex, eweight, cos, sin, eps, eeps):
    s_txt = 0 if ex is None else ex.shape[1]
    out = x.new_empty(x.shape[0], s_txt + x.shape[1], x.shape[2], x.shape[3])
    if ex is not None:
        qk_rmsnorm_rope(ex, eweight, cos[:s_txt], sin[:s_txt], eeps, out=out[:, :s_txt])
    qk_rmsnorm_rope(x, weight, cos[s_txt:], sin[s_txt:], eps, out=out[:, s_txt:])
    return out


def kernel_path():
    return last_path()
