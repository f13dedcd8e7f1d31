"""Issue 20: why flux2-qk-rmsnorm-rope faults under torch.compile + CUDA graph (and not in either
alone). One self-contained GPU command, FLUX.2's shapes (B=1, 512 text + 4096 image tokens, 48
heads of 128, bf16), the store entry's own kernel file, the engine's call pattern
(`_qk_norm_rope`: `new_empty` of the joint layout, the kernel writing into two slices of it, q/k
as strided views of one fused projection):

  for each variant of the call, in each mode (eager, graph, compile, compile+graph):
    run it, compare with the unfused torch reference (rel L2), report ok | wrong | crash + error.

Variants: `slices` (the patch as it is), `whole` (one output per tensor, cat afterwards),
`contig` (x made contiguous first), `triton_op` and `custom_op` (the joint [txt, img] output made
inside one registered op: torch.library.triton_op, which inductor sees into, or custom_op with a
fake, which it does not). `--only V,...` runs some; `--dump` also writes inductor's output code of
each variant's compile mode. A crash poisons the CUDA context, so every (variant, mode)
runs in its own process. Usage: python benchmarks/gpu_qknorm_compile_graph.py OUT_DIR
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernel_store" / "flux2-qk-rmsnorm-rope"
VARIANTS = ("slices", "whole", "contig", "triton_op", "custom_op")
MODES = ("eager", "graph", "compile", "compile+graph")
STAGE = ["set-up"]  # where a crash happened


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

    if variant in ("triton_op", "custom_op"):
        joint = _registered(variant)

    def fused(x, ex, w, ew):
        if variant in ("triton_op", "custom_op"):
            return joint(x, ex, w, ew, cos, sin, 1e-6)
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
            STAGE[0] = "warm-up on a side stream"
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fn(img, txt)
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            STAGE[0] = "capture"
            with torch.cuda.graph(g):
                static = fn(img, txt)
            torch.cuda.synchronize()
            STAGE[0] = "replay"
            for _ in range(3):
                g.replay()
                torch.cuda.synchronize()
            got = static
        else:
            STAGE[0] = "run"
            got = fn(img, txt)
        torch.cuda.synchronize()
    STAGE[0] = "compare"
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    return {"variant": variant, "mode": mode, "status": "ok" if rel < 0.02 else "wrong", "rel_l2": rel,
            "kernel_path": last_path()}


def _registered(kind: str):
    """The joint [txt, img] QK norm + RoPE as one registered op that allocates its own output."""
    import torch
    import triton
    from torch.library import custom_op, triton_op, wrap_triton

    from qk_norm_rope import _qk_rmsnorm_rope_kernel, qk_rmsnorm_rope

    def launch(launcher, x, w, cos, sin, eps, out):
        B, S, H, D = x.shape
        launcher[(triton.cdiv(B * S * H, 16),)](
            x, w, cos, sin, out, B * S * H, S, H, x.stride(0), x.stride(1), x.stride(2),
            out.stride(0), out.stride(1), out.stride(2), cos.stride(0), eps,
            HALF=D // 2, BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_M=16, HAS_W=True, ROUND=True, num_warps=4)

    def shape(x, ex):
        return (x.shape[0], ex.shape[1] + x.shape[1], x.shape[2], x.shape[3])

    if kind == "triton_op":
        @triton_op("optbot_probe::qk_joint_triton", mutates_args={})
        def joint(x: torch.Tensor, ex: torch.Tensor, w: torch.Tensor, ew: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, eps: float) -> torch.Tensor:
            st = ex.shape[1]
            out = x.new_empty(shape(x, ex))
            launch(wrap_triton(_qk_rmsnorm_rope_kernel), ex, ew, cos[:st].contiguous(), sin[:st].contiguous(), eps, out[:, :st])
            launch(wrap_triton(_qk_rmsnorm_rope_kernel), x, w, cos[st:].contiguous(), sin[st:].contiguous(), eps, out[:, st:])
            return out
        return joint

    @custom_op("optbot_probe::qk_joint_custom", mutates_args=())
    def joint(x: torch.Tensor, ex: torch.Tensor, w: torch.Tensor, ew: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, eps: float) -> torch.Tensor:
        st = ex.shape[1]
        out = x.new_empty(shape(x, ex))
        qk_rmsnorm_rope(ex, ew, cos[:st], sin[:st], eps, out=out[:, :st])
        qk_rmsnorm_rope(x, w, cos[st:], sin[st:], eps, out=out[:, st:])
        return out

    @joint.register_fake
    def _(x, ex, w, ew, cos, sin, eps):
        return x.new_empty(shape(x, ex))

    return joint


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        try:
            print("RESULT " + json.dumps(one(sys.argv[2], sys.argv[3])))
        except Exception as e:  # the crash is the result
            print("RESULT " + json.dumps({"variant": sys.argv[2], "mode": sys.argv[3], "status": "crash",
                                          "stage": STAGE[0],
                                          "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}))
        return 0
    args = sys.argv[1:]
    dump = "--dump" in args
    only = VARIANTS
    if "--only" in args:
        only = tuple(args[args.index("--only") + 1].split(","))
        del args[args.index("--only"):args.index("--only") + 2]
    args = [a for a in args if a != "--dump"]
    out = Path(args[0]) if args else ROOT / "benchmarks" / "results" / "qknorm-compile-graph"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for variant in only:
        for mode in MODES:
            for blocking in ("0", "1") if mode == "compile+graph" and not dump else ("0",):
                logs = "graph_breaks,output_code" if dump and mode == "compile" else "graph_breaks"
                env = {**os.environ, "CUDA_LAUNCH_BLOCKING": blocking, "TORCH_LOGS": logs}
                p = subprocess.run([sys.executable, __file__, "--one", variant, mode], capture_output=True,
                                   text=True, env=env, timeout=600)
                line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
                row = json.loads(line[7:]) if line else {"variant": variant, "mode": mode, "status": "died",
                                                          "error": (p.stderr or "")[-300:]}
                row["cuda_launch_blocking"] = blocking
                row["graph_breaks"] = sum("Graph break" in ln for ln in p.stderr.splitlines())
                rows.append(row)
                if dump and mode == "compile":
                    (out / f"output-code-{variant}.txt").write_text(p.stderr)
                with open(out / "logs.txt", "a") as f:  # one file: a call brings back only a few
                    f.write(f"===== {variant} {mode} CUDA_LAUNCH_BLOCKING={blocking}\n{p.stdout[-3000:]}\n"
                            f"--- stderr ---\n{p.stderr[-8000:]}\n")
                print(json.dumps(row), flush=True)
                (out / "qknorm-compile-graph.json").write_text(json.dumps(rows, indent=1))  # partial on a timeout
    return 0


if __name__ == "__main__":
    sys.exit(main())
