"""runner/peaks.py: the ceilings a roofline floor is computed from, measured in the same run; the
FP8 ceiling (bench's second floor row, issue 16) where `_scaled_mm` runs, and the reason where not."""
from __future__ import annotations

import torch

from runner import peaks, quant
from runner.roofline import compute_floor


def test_fp8_ceiling_is_measured_on_cpu_beside_the_matmul_one():
    pk = peaks.measure("cpu", torch.float32, fp8=True)
    assert quant.fp8_unsupported("cpu") == ""
    assert pk["matmul_tflops"] > 0 and pk["fp8_matmul_tflops"] > 0
    assert pk["fp8_matmul_shape"] == [1024, 1024, 1024] and "row-wise" in pk["fp8_matmul_form"]
    assert "fp8_matmul_tflops" not in peaks.measure("cpu", torch.float32)  # only where a floor row asks


def test_the_fp8_operands_are_the_form_scaled_mm_takes():
    a, b, sa, sb = peaks._fp8_operands("cpu")(32, 48, 16, torch.Generator().manual_seed(1))
    assert a.dtype == b.dtype == torch.float8_e4m3fn and a.shape == (32, 48) and b.shape == (48, 16)
    assert b.stride() == (1, 48)  # column-major, as _scaled_mm wants its second operand
    out = peaks._fp8_mm(a, b, sa, sb)
    ref = (a.float() @ b.float()) * sa * sb
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), ref, rtol=2e-2, atol=1e-1)


def test_fp8_floor_adds_linear_at_fp8_and_attention_at_the_matmul_ceiling():
    pk = peaks.measure("cpu", torch.float32, fp8=True)
    fl = {"linear": 3e12, "attention": 1e12}
    ms, basis = compute_floor(fl, pk)
    assert ms == 4e12 / (pk["matmul_tflops"] * 1e12) * 1e3 and "float32 matmul measured in this run (cpu)" in basis
    ms, basis = compute_floor(fl, pk, fp8=True)
    assert ms == (3e12 / (pk["fp8_matmul_tflops"] * 1e12) + 1e12 / (pk["matmul_tflops"] * 1e12)) * 1e3
    assert f"at {pk['fp8_matmul_tflops']} TFLOP/s FP8" in basis and "(cpu)" in basis
    # a run whose FP8 ceiling could not be measured says why, with no number
    ms, basis = compute_floor(fl, {**pk, "fp8_matmul_tflops": None, "fp8_matmul_why": "compute capability 8.0: FP8 ..."}, fp8=True)
    assert ms is None and basis == "FP8 ceiling not measured: compute capability 8.0: FP8 ..."
