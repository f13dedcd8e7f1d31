"""Configs of the QKV GEMM + norm + RoPE epilogue kernel at the workloads' shapes (gemm "cublas":
F.linear then the epilogue kernel; gemm "triton": the GEMM inside the kernel), against
cuBLAS running the same GEMM FLOPs (F.linear per stream, no epilogue) in the same process: how far
the fused kernel is from the GEMM it replaces, per config. CUDA only. (The 2026-12-04 results in
benchmarks/results/h200-*-20261204/qkv-gemm-configs.txt were timed with a plain median of CUDA
events, no L2 flush; the script now times with runner/timing.time_fn.)

    python benchmarks/qkv_gemm_configs.py [ENTRY ...]     # default: both qkv-norm-rope-epilogue entries

Prints one line per (entry, config) and a JSON summary as the last line.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from runner.timing import capture_graph, time_fn  # noqa: E402
ENTRIES = ["qwen-image-qkv-norm-rope-epilogue", "flux2-qkv-norm-rope-epilogue"]
# gemm "cublas": F.linear, then the epilogue kernel (no K loop): per program block_m rows x one head
# ("per-head") or x block_h heads of q, k or v ("row-block", a 3-D tile)
CONFIGS = [dict(gemm="cublas", epilogue="per-head", block_m=bm, num_warps=nw)
           for bm, nw in itertools.product((32, 64, 128), (4, 8))]
CONFIGS += [dict(gemm="cublas", epilogue="row-block", block_m=bm, block_h=bh, num_warps=nw)
            for bm, bh, nw in itertools.product((8, 16, 32), (2, 4, 8), (4, 8))]
# gemm "triton": the GEMM in the kernel; its best configs of 2026-12-04 (qkv-gemm-configs.txt there:
# all 16 lost to gemm "cublas" by 0.14-0.34 ms)
CONFIGS += [dict(gemm="triton", block_m=128, block_k=64, group_m=8, num_stages=4, num_warps=8),
            dict(gemm="triton", block_m=128, block_k=64, group_m=8, num_stages=3, num_warps=4)]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(mod)
    sys.path.pop(0)
    return mod


def _ms(fn) -> float:
    """Median of 20 timed calls after 3 warm-ups, L2 flushed before each (runner/timing.time_fn, as
    the store's microbenchmarks time kernels). A single call's time includes its Python and launch
    cost: for the 0.05-ms epilogue that cost is most of it (0.17-0.30 ms measured for every config on
    2026-12-04, about 1 TB/s): _graph_ms gives the device time."""
    return time_fn(fn, "cuda", warmup=3, iters=20).median_ms


def _graph_ms(fn) -> float:
    """fn's device time: captured once into a CUDA graph (runner/timing.capture_graph, after warm-up
    calls that compile its Triton kernels), the replay timed as _ms times a call: no Python, no launch
    cost, L2 flushed."""
    return _ms(capture_graph(fn))


def main(entries: list[str]) -> None:
    summary = {}
    for eid in entries:
        d = ROOT / "kernel_store" / eid
        test = _load(d / "test_qkv_norm_rope_gemm.py", f"t_{eid.replace('-', '_')}")
        op = sys.modules["qkv_norm_rope_gemm"]
        shape = test.BENCH_SHAPES[0]
        inputs = test.make_inputs(shape, "bfloat16", "cuda", 0)
        x_txt, x_img, w_txt, w_img, b_txt, b_img = inputs[:6]
        flop = 2 * (x_txt.shape[1] + x_img.shape[1]) * x_img.shape[0] * w_img.shape[0] * w_img.shape[1]
        cublas = _graph_ms(lambda: (F.linear(x_txt, w_txt, b_txt), F.linear(x_img, w_img, b_img)))
        ref_ms = _graph_ms(lambda: op.reference(*inputs))
        base = op.qkv_norm_rope(*inputs)
        rows = []
        print(f"{eid} {shape}: cuBLAS GEMMs {cublas:.3f} ms ({flop / cublas / 1e9:.0f} TFLOP/s), "
              f"unfused reference {ref_ms:.3f} ms, DEFAULT_CONFIG {op.DEFAULT_CONFIG}", flush=True)
        # the epilogue alone (norm_rope on the linears' outputs): bytes = [M, 3*H*D] read + written once,
        # cos/sin [S, D] fp32 read once: its bound at the copy ceiling
        ys = (F.linear(x_txt, w_txt, b_txt), F.linear(x_img, w_img, b_img))
        epi_args = inputs[6:]
        epi_bytes = 2 * sum(y.numel() * y.element_size() for y in ys) + 2 * inputs[10].numel() * 4
        for cfg in CONFIGS:
            try:
                out = op.qkv_norm_rope(*inputs, **cfg)
                diff = (out.float() - base.float()).abs().max().item()
                ms = _ms(lambda: op.qkv_norm_rope(*inputs, **cfg))
                gms = _graph_ms(lambda: op.qkv_norm_rope(*inputs, **cfg))
                row = {**cfg, "ms": round(ms, 4), "graph_ms": round(gms, 4), "tflops": round(flop / gms / 1e9, 1),
                       "max_diff_vs_default": diff}
                if cfg["gemm"] == "cublas":
                    kw = {k: cfg[k] for k in ("block_m", "num_warps", "epilogue", "block_h") if k in cfg}
                    epi = _graph_ms(lambda: op.norm_rope(*ys, *epi_args, **kw))
                    row.update(epilogue_ms=round(epi, 4), epilogue_gbps=round(epi_bytes / epi / 1e6, 1))
            except Exception as e:  # noqa: BLE001 - out of shared memory and the like: the row says so
                print(f"  {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            rows.append(row)
            epi_txt = (f", epilogue alone {row['epilogue_ms']:.3f} ms replayed ({row['epilogue_gbps']:.0f} GB/s)"
                       if "epilogue_ms" in row else "")
            print(f"  {cfg}: {ms:.3f} ms a call, {gms:.3f} ms replayed ({row['tflops']:.0f} TFLOP/s){epi_txt}, "
                  f"max |diff| vs default {diff:.3g}", flush=True)
        best = min(rows, key=lambda r: r["graph_ms"])
        summary[eid] = {"shape": shape, "cublas_ms": round(cublas, 4), "reference_ms": round(ref_ms, 4),
                        "epilogue_bytes": epi_bytes,
                        "default": op.DEFAULT_CONFIG, "best": best, "rows": rows}
        del sys.modules["qkv_norm_rope_gemm"]
    summary["env"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "triton": __import__("triton").__version__}
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:] or ENTRIES)
