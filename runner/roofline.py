"""A step's compute floor: its counted FLOPs (runner/profiler.count_flops) at ceilings measured in
the same job (runner/peaks.measure). Pure arithmetic, no torch: the bench command (bot side), the
profile job and the validator's plausibility check (runner side) all take their floor from here.

An unquantized step's floor is every FLOP at the matmul ceiling. A step whose linear layers run in
FP8 (precision "bfloat16+fp8") has its linear FLOPs at the FP8 ceiling and attention, still bf16,
at the matmul ceiling: measured on an H100, SGLang's FP8 FLUX.2 ran 317.8 ms/step eager, under its
bf16 floor (384.7 ms), and a validator that held every FP8 candidate "implausible" against the
bf16 floor could deliver none (benchmarks/results/h100-sglang-fp8-optimize-20261206/)."""
from __future__ import annotations


def compute_floor(flops: dict, peaks: dict, fp8: bool = False) -> tuple[float | None, str]:
    """(floor ms, what it is made of); (None, why) when the FP8 ceiling was not measured."""
    lin, att = flops["linear"], flops["attention"]
    where = f"measured in this run ({peaks['device']})"
    if not fp8:
        return ((lin + att) / (peaks["matmul_tflops"] * 1e12) * 1e3,
                f"{(lin + att) / 1e12:.4g} TFLOP (linear {lin / 1e12:.4g} + attention {att / 1e12:.4g}) at "
                f"{peaks['matmul_tflops']} TFLOP/s {peaks['matmul_dtype']} matmul {where}")
    if not peaks.get("fp8_matmul_tflops"):
        return None, f"FP8 ceiling not measured: {peaks.get('fp8_matmul_why', 'no FP8 figure in this run')}"
    return ((lin / (peaks["fp8_matmul_tflops"] * 1e12) + att / (peaks["matmul_tflops"] * 1e12)) * 1e3,
            f"linear {lin / 1e12:.4g} TFLOP at {peaks['fp8_matmul_tflops']} TFLOP/s FP8 "
            f"({peaks['fp8_matmul_form']}) + attention {att / 1e12:.4g} TFLOP at {peaks['matmul_tflops']} TFLOP/s "
            f"{peaks['matmul_dtype']}, {where}")
