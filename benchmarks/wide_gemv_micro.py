"""Qwen-Image's timestep modulation in FP8 as qwen-image-cfg-modulation-cache computes it: the 120 block
linears ([3072 -> 18432] each, all reading the same silu(temb), one row a pass) merged into runs of R
linears, one `_scaled_mm` per run (e4m3 weights with row-wise scales, the one-row input quantized per
call, bias, bf16 out: torchao's PerRow path), and the outputs concatenated. For R in 1 (the blocks' own
linears), 3, 6 (the entry's 768 MiB runs), 12, 24, 60 and 120 (one linear: what ran out of memory in
torchao's quantization on an H100), the time of a whole pass's modulation against its byte bound (6.8
GB of e4m3 plus scales and bias, over the copy bandwidth measured in the same process), and the same
with the input's quantization left out (the GEMMs alone). Why: on an H100 the entry's 20 GEMMs a pass
ran at 78% of the copy ceiling (benchmarks/results/h100-fp8-modmerge-20261207/), where the prediction
assumed the ceiling; this says whether wider runs would close that.

Times are medians of CUDA-graph replays (benchmarks/gelu_quant_micro.py's harness).

    python benchmarks/wide_gemv_micro.py [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gelu_quant_micro import _copy_bandwidth, _graph_time, _load  # noqa: E402

BLOCKS, DIM, MULT = 60, 3072, 6  # Qwen-Image: 60 blocks, img_mod and txt_mod each [dim -> 6 dim]


_NQ = _load("kernel_store/qwen-image-fp8-norm-quant/norm_quant.py")  # its quantize_rows: torchao's recipe


def quantize_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's dynamic per-row activation quantization, as the store's reference writes it."""
    return _NQ.quantize_rows(x, "torchao")


def _mm(xq, xs, wt, ws, bias):
    return torch._scaled_mm(xq, wt, xs, ws, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    dev = "cuda"
    n_lin, rows = 2 * BLOCKS, MULT * DIM
    # random e4m3 codes below the NaN pattern (0x7f), both signs: the GEMM's bytes, not its values
    w = torch.randint(0, 0x7E, (n_lin * rows, DIM), dtype=torch.uint8, device=dev)
    w |= torch.randint(0, 2, (n_lin * rows, 1), dtype=torch.uint8, device=dev) << 7
    w = w.view(torch.float8_e4m3fn)
    w_scale = torch.rand(1, n_lin * rows, device=dev) * 1e-3
    bias = torch.randn(n_lin * rows, device=dev, dtype=torch.bfloat16)
    x = torch.nn.functional.silu(torch.randn(1, DIM, device=dev, dtype=torch.bfloat16))
    bw = _copy_bandwidth()
    nbytes = w.numel() + w_scale.numel() * 4 + bias.numel() * 2 + n_lin * rows * 2
    bound_ms = nbytes / bw * 1e3
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy {bw / 1e12:.2f} TB/s; a pass's "
          f"modulation: {nbytes / 1e9:.2f} GB, byte bound {bound_ms:.3f} ms")
    out = []
    for per_run in (1, 3, 6, 12, 24, 60, 120):
        n = per_run * rows
        parts = [(w[i:i + n], w_scale[:, i:i + n], bias[i:i + n]) for i in range(0, n_lin * rows, n)]
        wt = [p[0].t() for p in parts]  # column-major, as _scaled_mm wants its second operand

        def gemms(xq, xs):  # the input quantized once a pass (the entry: one SiLU, the same row to every run)
            return torch.cat([_mm(xq, xs, t, s, b) for t, (_, s, b) in zip(wt, parts)], dim=-1)

        def gemms_quantizing():  # torchao's linear: each call quantizes its input
            return torch.cat([_mm(*quantize_row(x), t, s, b) for t, (_, s, b) in zip(wt, parts)], dim=-1)

        xq, xs = quantize_row(x)
        alone = _graph_time(lambda: gemms(xq, xs), reps=10)
        per_call = _graph_time(gemms_quantizing, reps=10)
        row = {"linears_per_run": per_run, "gemms_a_pass": len(parts), "rows_per_gemm": n, "gemms_ms": alone,
               "with_input_quantization_ms": per_call, "bound_ms": bound_ms,
               "gemms_pct_of_copy": 100 * bound_ms / alone}
        out.append(row)
        print(f"  {per_run:4d} linears a run, {len(parts):4d} GEMMs of {n:8d} rows: GEMMs {alone:7.3f} ms "
              f"({row['gemms_pct_of_copy']:5.1f}% of copy), with the input quantized per GEMM {per_call:7.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "python": platform.python_version(), "copy_bytes_per_s": bw,
                                               "bytes_a_pass": nbytes, "rows": out}, indent=1))


if __name__ == "__main__":
    main()
