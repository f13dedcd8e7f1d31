"""A kernel test's optional bench_kernel / bench_reference (docs/store.md, the kernel test contract):
the microbenchmark times them instead of kernel() / reference() where those wrap the op for the
comparison. They run only on a GPU there, so a wrong call would first show on GPU time: here each
one runs on the CPU and gives the values kernel() / reference() compare (dequantized the same way)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WITH_HOOKS = sorted(p for p in (ROOT / "kernel_store").glob("*/test_*.py") if "def bench_kernel" in p.read_text())


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_hooks_{path.parent.name.replace('-', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _values(out, inputs):
    """The op's output as kernel()/reference() compare it: e4m3 values times their scale."""
    if isinstance(out, tuple):
        q, s = out
        return q.to(torch.float32) * s
    return out.to(torch.float32) * inputs[-1]  # a static scale, the last input


def test_the_fp8_kernels_have_hooks():
    names = {p.parent.name for p in WITH_HOOKS}
    assert {"qwen-image-fp8-gelu-quant", "qwen-image-fp8-norm-quant", "flux2-fp8-norm-quant",
            "flux2-fp8-swiglu-quant", "sglang-qwen-image-fp8-gelu-quant", "sglang-qwen-image-fp8-norm-quant"} <= names, names


@pytest.mark.parametrize("path", WITH_HOOKS, ids=lambda p: p.parent.name)
def test_hooks_time_what_kernel_and_reference_compare(path):
    mod = _load(path)
    assert hasattr(mod, "bench_reference"), f"{path}: bench_kernel without bench_reference"
    dtype = mod.CASES[0][0]
    inputs = mod.make_inputs(mod.SHAPES[0], dtype, "cpu", 0)
    values = getattr(mod, "_values", _values)  # a test whose op returns more than (values, scales) says how
    torch.testing.assert_close(values(mod.bench_kernel(*inputs), inputs), mod.kernel(*inputs), atol=0, rtol=0)
    torch.testing.assert_close(values(mod.bench_reference(*inputs), inputs), mod.reference(*inputs),
                               atol=0, rtol=0)


def test_both_microbenchmarks_time_the_same_subject():
    """`store check`'s micro (runner/kinds/kernel_test) and the validator's (runner/kinds/kernel_check) take
    what they time from one rule, kernel_test.bench_subject: the module's BENCH_SHAPES (the validator's one
    shape is the first) and its bench hooks, else SHAPES and kernel / reference. Before 2026-12-07 the
    validator timed SHAPES[0] through kernel(): [1, 1, 64] and a dequantization for SGLang's norm kernel."""
    import inspect

    from runner.kinds import kernel_check
    from runner.kinds.kernel_test import bench_subject

    sglang_norm = _load(ROOT / "kernel_store/sglang-qwen-image-fp8-norm-quant/test_norm_static_quant.py")
    shapes, kern, ref = bench_subject(sglang_norm)
    assert shapes[0] == (1, 4096, 3072, 0) and shapes == [tuple(s) for s in sglang_norm.BENCH_SHAPES]
    assert (kern, ref) == (sglang_norm.bench_kernel, sglang_norm.bench_reference)
    plain = _load(ROOT / "kernel_store/flux2-qk-rmsnorm-rope/test_qk_norm_rope.py")
    assert not hasattr(plain, "BENCH_SHAPES") and not hasattr(plain, "bench_kernel")
    assert bench_subject(plain) == ([tuple(s) for s in plain.SHAPES], plain.kernel, plain.reference)
    assert "bench_subject(mod)" in inspect.getsource(kernel_check.run)
