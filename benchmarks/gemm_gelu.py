"""A linear followed by tanh-GELU (Qwen-Image's img_mlp/txt_mlp first projection) as two kernels, the
engine's way, against one cuBLASLt GEMM with the GELU in its epilogue (torch._addmm_activation,
use_gelu=True), at the workload's shapes. CUDA only; device time from CUDA-graph replays.

    python benchmarks/gemm_gelu.py

Bounds per image-stream call (4096 x 3072 -> 12288, bf16): 0.31 TFLOP, ~0.42 ms at ~740 TFLOP/s; the
GELU pass the fusion removes reads and writes 4096 x 12288 bf16 (201 MB), ~0.05 ms at 4.2 TB/s.
Prints one line per shape and way, then a JSON summary.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner.timing import capture_graph, time_fn  # noqa: E402

SHAPES = {"img_mlp.net.0 (4096 tokens)": (4096, 3072, 12288), "txt_mlp.net.0 (512 tokens)": (512, 3072, 12288)}


def graph_ms(fn) -> float:
    """Device time of fn: its CUDA graph's replay (runner/timing.capture_graph), L2 flushed before each."""
    return time_fn(capture_graph(fn), "cuda", warmup=3, iters=30).median_ms


def main() -> None:
    torch.manual_seed(0)
    out = {}
    for name, (m, k, n) in SHAPES.items():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 0.1
        unfused = lambda: F.gelu(F.linear(x, w, b), approximate="tanh")  # noqa: E731
        fused = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)  # noqa: E731
        linear = lambda: F.linear(x, w, b)  # noqa: E731
        ref, got = unfused().float(), fused().float()
        rel = ((got - ref).norm() / ref.norm()).item()
        row = {"shape": [m, k, n], "linear_ms": graph_ms(linear), "unfused_ms": graph_ms(unfused),
               "fused_ms": graph_ms(fused), "rel_l2_fused_vs_unfused": rel,
               "max_abs_diff": (got - ref).abs().max().item()}
        flop = 2 * m * k * n
        print(f"{name}: linear {row['linear_ms']:.4f} ms ({flop / row['linear_ms'] / 1e9:.0f} TFLOP/s), "
              f"linear + gelu {row['unfused_ms']:.4f} ms, _addmm_activation(use_gelu) {row['fused_ms']:.4f} ms "
              f"(saves {row['unfused_ms'] - row['fused_ms']:.4f} ms a call); rel L2 {rel:.2e}, max |diff| "
              f"{row['max_abs_diff']:.3g}", flush=True)
        out[name] = row
    out["env"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
