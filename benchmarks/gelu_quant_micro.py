"""GELU + FP8 per-row quantization at Qwen-Image's MLP shapes: the store kernel's variants against
torch's unfused ops and inductor's fusion of them, with the two bounds of each shape.

Variants (kernel_store/qwen-image-fp8-gelu-quant/gelu_quant.py):
- two-pass: blocks of 2048, the GELU computed twice (the entry before 2026-12-06);
- one-pass: the default config (the row in registers), at 8, 16 and 32 warps;
- one-pass, fast arithmetic: EXACT off on the GPU (the entry's default since 2026-12-06), i.e. Triton's own float32 division
  (approximate, as inductor's generated kernels divide) and tanh through exp, where the entry uses
  libdevice's tanhf and a correctly rounded division (torch's CUDA kernels' arithmetic). Every
  variant is reported with how many e4m3 codes differ from the unfused ops and from inductor's
  fusion (the FP8 gate's evidence is inductor's own distance from eager, docs/fp8.md).

Times are medians of CUDA-graph replays (50 calls a graph; the image call's h is 100 MB, over the
50 MB L2). The bound printed is the bytes (bf16 in, e4m3 out, float32 scales) over the copy bandwidth
measured in the same process; a variant far above it is bound by its arithmetic (libdevice's tanhf
and the correctly rounded division are tens of instructions an element).

    python benchmarks/gelu_quant_micro.py [--json FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(4096, 12288), (512, 12288)]
CALLS_PER_STEP = 120  # 60 blocks x 2 CFG passes, per stream


def _load():
    path = ROOT / "kernel_store/qwen-image-fp8-gelu-quant/gelu_quant.py"
    spec = importlib.util.spec_from_file_location("gelu_quant_micro_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dynamo imports a compiled function's module by name
    spec.loader.exec_module(mod)
    return mod


def _graph_time(fn, reps: int = 50, trials: int = 7) -> float:
    """Median ms of one call, from CUDA-graph replays of `reps` calls."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    times.sort()
    return times[len(times) // 2]


def _copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = _graph_time(lambda: y.copy_(x), reps=5)
    return 2 * x.numel() / (ms / 1e3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (the variants differ only in the GPU's arithmetic)", file=sys.stderr)
        return 2
    gq = _load()
    bw = _copy_bandwidth()
    compiled = torch.compile(lambda h: gq.reference(h, "torchao"), fullgraph=True)

    def launch(h, block_n=0, warps=0, exact=True):
        M, N = h.shape
        q = torch.empty((M, N), dtype=torch.float8_e4m3fn, device=h.device)
        s = torch.empty((M, 1), dtype=torch.float32, device=h.device)
        bn, chunks, nw = gq._config(N, block_n, warps)
        gq._gelu_quant_kernel[(M,)](h, q, s, N, h.stride(0), q.stride(0), BLOCK_N=bn, CHUNKS=chunks, ROUND=True,
                                    TORCHAO=True, F8_STORE=True, CUDA_MATH=True, EXACT=exact, num_warps=nw)
        return q, s

    rows = []
    for M, N in SHAPES:
        torch.manual_seed(0)
        h = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 2
        ref_q, ref_s = gq.reference(h, "torchao")
        ind_q, ind_s = compiled(h)
        nbytes = M * N * 2 + M * N + M * 4
        variants = {
            "torch eager (unfused)": lambda: gq.reference(h, "torchao"),
            "inductor fusion": lambda: compiled(h),
            "two-pass, block 2048": lambda: launch(h, 2048),
            "one-pass (default warps)": lambda: launch(h),
            "one-pass, 8 warps": lambda: launch(h, 0, 8),
            "one-pass, 32 warps": lambda: launch(h, 0, 32),
            "one-pass, fast arithmetic": lambda: launch(h, 0, 0, False),
        }
        bound_ms = nbytes / bw * 1e3
        print(f"\n[{M} x {N}] bytes {nbytes / 1e6:.1f} MB, byte bound {bound_ms * 1e3:.1f} us "
              f"at {bw / 1e12:.2f} TB/s (copy measured here)")
        for name, fn in variants.items():
            ms = _graph_time(fn)
            q, s = fn()
            diff_ref = int((q.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
            diff_ind = int((q.view(torch.uint8) != ind_q.view(torch.uint8)).sum())
            rows.append({"shape": [M, N], "variant": name, "us": ms * 1e3, "bound_us": bound_ms * 1e3,
                         "ms_per_step": ms * CALLS_PER_STEP, "codes_differ_from_eager": diff_ref,
                         "codes_differ_from_inductor": diff_ind,
                         "scales_equal_eager": bool(torch.equal(s, ref_s))})
            print(f"  {name:34s} {ms * 1e3:8.1f} us  x{ms / bound_ms:4.1f} bound  "
                  f"{ms * CALLS_PER_STEP:6.2f} ms/step  e4m3 codes != eager {diff_ref}, != inductor {diff_ind}")
    per_step = {}
    for r in rows:
        per_step[r["variant"]] = per_step.get(r["variant"], 0.0) + r["ms_per_step"]
    print("\nper step (120 calls of each shape):")
    for k, v in per_step.items():
        print(f"  {k:34s} {v:6.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "python": platform.python_version(),
            "copy_bandwidth_Bps": bw, "command": "python " + " ".join(sys.argv), "rows": rows,
            "per_step_ms": per_step}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
