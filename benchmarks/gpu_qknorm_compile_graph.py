"""Issue 20: why flux2-qk-rmsnorm-rope faults under torch.compile + CUDA graph (and not in either
alone). One self-contained GPU command, FLUX.2's shapes (B=1, 512 text + 4096 image tokens, 48
heads of 128, bf16), the store entry's own kernel file, the engine's call pattern
(`_qk_norm_rope`: `new_empty` of the joint layout, the kernel writing into two slices of it, q/k
as strided views of one fused projection):

  for each variant of the call, in each mode (eager, graph, compile, compile+graph):
    run it, compare with the unfused torch reference (rel L2), report ok | wrong | crash + error.

Variants: `slices` (the patch as it is), `whole` (one output per tensor, cat afterwards),
`contig` (x made contiguous first). A crash poisons the CUDA context, so every (variant, mode)
runs in its own process. Usage: python benchmarks/gpu_qknorm_compile_graph.py OUT_DIR
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernel_store" / "flux2-qk-rmsnorm-rope"
VARIANTS = ("slices", "whole", "contig")
MODES = ("eager", "graph", "compile", "compile+graph")


def one(variant: str, mode: str) -> dict:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(KERNEL))
    from qk_norm_rope import last_path, qk_rmsnorm_rope, reference

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    B, St, Si, H, D = 1, 512, 4096, 48, 128
    wq, wk, wqa, wka = (torch.rand(D, device=dev, dtype=dt) + 0.5 for _ in range(4))
    ang = torch.rand(St + Si, D // 2, device=dev) * 6.28
    cos = ang.cos().repeat_interleave(2, -1).float()
    sin = ang.sin().repeat_interleave(2, -1).float()
    proj = torch.nn.Linear(H * D, 3 * H * D, bias=False, device=dev, dtype=dt)
    proj_t = torch.nn.Linear(H * D, 3 * H * D, bias=False, device=dev, dtype=dt)
    img = torch.randn(B, Si, H * D, device=dev, dtype=dt)
    txt = torch.randn(B, St, H * D, device=dev, dtype=dt)

    def views(x, p):
        q, k, v = p(x).chunk(3, dim=-1)  # strided views of one fused projection
        return q.unflatten(-1, (H, D)), k.unflatten(-1, (H, D)), v.unflatten(-1, (H, D))

    def fused(x, ex, w, ew):
        if variant == "contig":
            x, ex = x.contiguous(), ex.contiguous()
        if variant == "whole":
            a = qk_rmsnorm_rope(ex, ew, cos[:St], sin[:St], 1e-6)
            b = qk_rmsnorm_rope(x, w, cos[St:], sin[St:], 1e-6)
            return torch.cat([a, b], dim=1)
        out = x.new_empty(x.shape[0], St + x.shape[1], x.shape[2], x.shape[3])
        qk_rmsnorm_rope(ex, ew, cos[:St], sin[:St], 1e-6, out=out[:, :St])
        qk_rmsnorm_rope(x, w, cos[St:], sin[St:], 1e-6, out=out[:, St:])
        return out

    def block(img, txt):
        q, k, v = views(img, proj)
        eq, ek, ev = views(txt, proj_t)
        q, k = fused(q, eq, wq, wqa), fused(k, ek, wk, wka)
        v = torch.cat([ev, v], dim=1)
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    def unfused(img, txt):
        q, k, v = views(img, proj)
        eq, ek, ev = views(txt, proj_t)
        q = torch.cat([reference(eq, wqa, cos[:St], sin[:St], 1e-6), reference(q, wq, cos[St:], sin[St:], 1e-6)], 1)
        k = torch.cat([reference(ek, wka, cos[:St], sin[:St], 1e-6), reference(k, wk, cos[St:], sin[St:], 1e-6)], 1)
        v = torch.cat([ev, v], dim=1)
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    fn = torch.compile(block, fullgraph=False) if "compile" in mode else block
    with torch.no_grad():
        want = unfused(img, txt)
        if "graph" in mode:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fn(img, txt)
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static = fn(img, txt)
            for _ in range(3):
                g.replay()
            got = static
        else:
            got = fn(img, txt)
        torch.cuda.synchronize()
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    return {"variant": variant, "mode": mode, "status": "ok" if rel < 0.02 else "wrong", "rel_l2": rel,
            "kernel_path": last_path()}


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        try:
            print("RESULT " + json.dumps(one(sys.argv[2], sys.argv[3])))
        except Exception as e:  # the crash is the result
            print("RESULT " + json.dumps({"variant": sys.argv[2], "mode": sys.argv[3], "status": "crash",
                                          "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}))
        return 0
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "results" / "qknorm-compile-graph"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for variant in VARIANTS:
        for mode in MODES:
            for blocking in ("0", "1") if mode == "compile+graph" else ("0",):
                env = {**os.environ, "CUDA_LAUNCH_BLOCKING": blocking, "TORCH_LOGS": "graph_breaks"}
                p = subprocess.run([sys.executable, __file__, "--one", variant, mode], capture_output=True,
                                   text=True, env=env, timeout=600)
                line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
                row = json.loads(line[7:]) if line else {"variant": variant, "mode": mode, "status": "died",
                                                          "error": (p.stderr or "")[-300:]}
                row["cuda_launch_blocking"] = blocking
                row["graph_breaks"] = sum("Graph break" in ln for ln in p.stderr.splitlines())
                rows.append(row)
                with open(out / "logs.txt", "a") as f:  # one file: a call brings back only a few
                    f.write(f"===== {variant} {mode} CUDA_LAUNCH_BLOCKING={blocking}\n{p.stdout[-3000:]}\n"
                            f"--- stderr ---\n{p.stderr[-8000:]}\n")
                print(json.dumps(row), flush=True)
                (out / "qknorm-compile-graph.json").write_text(json.dumps(rows, indent=1))  # partial on a timeout
    return 0


if __name__ == "__main__":
    sys.exit(main())
