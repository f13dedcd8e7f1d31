"""An activation + FP8 per-row quantization kernel's variants against torch's unfused ops and
inductor's fusion of them, at the workload's shapes, with the byte bound of each shape: the GELU of
Qwen-Image's MLP (`--kernel gelu`, the default), FLUX.2's SwiGLU (`--kernel swiglu`: its exact
two-pass form, a wider block, and the fast arithmetic below), or Qwen-Image's norm + modulation
(`--kernel norm-quant`: kernel_store/qwen-image-fp8-norm-quant/norm_quant.py), or the GELU with SGLang's
static scale (`--kernel gelu-static`: kernel_store/sglang-qwen-image-fp8-gelu-quant/).

Variants of the GELU kernel (kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py):
- two-pass: blocks of 2048, 4 warps, the GELU computed twice;
- one-pass: the default config (the row in registers, its loads before its one reduction), at 8, 16
  (the default) and 32 warps;
- one-pass, fast arithmetic: EXACT off on the GPU (the entry's default since 2026-12-06), i.e.
  Triton's own float32 division (approximate, as inductor's generated kernels divide) and tanh
  through exp, where the exact form uses libdevice's tanhf and a correctly rounded division (torch's
  CUDA kernels' arithmetic).
Of the SwiGLU kernel (kernel_store/flux2-fp8-norm-quant/swiglu_quant.py): one pass (the row's 3 prefix
and 9 SwiGLU blocks in registers, the entry's default since 2026-12-06) at 16 and 32 warps, fast and
exact (libdevice's expf and the correctly rounded division, or Triton's exp and `/`), and the two passes
(the row read twice) at block 2048 / 8, 16 warps and 4096 / 16. `--before DIR` adds an earlier copy of
each kernel file (DIR/gelu_quant.py, swiglu_quant.py, norm_quant.py) beside the live one.
Every variant is reported with how many e4m3 codes differ from the unfused ops and from inductor's
fusion (the FP8 gate's evidence is inductor's own distance from eager, docs/fp8.md).

Times are medians of CUDA-graph replays (50 calls a graph; the largest inputs, 100-340 MB, are over
the 50 MB L2). The bound printed is the bytes (bf16 in, e4m3 out, float32 scales) over the copy bandwidth
measured in the same process; a variant far above it is bound by its arithmetic (libdevice's tanhf or
expf and the correctly rounded division are tens of instructions an element).

    python benchmarks/gelu_quant_micro.py [--kernel gelu|swiglu|norm-quant|gelu-static] [--before DIR] [--json FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from runner.timing import capture_graph  # noqa: E402


def _load(rel: str):
    """A kernel file (ROOT-relative) as a module registered under its name (dynamo imports a compiled
    function's module by name)."""
    return _load_file(ROOT / rel, "micro_kernel_" + Path(rel).stem)


def _load_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _graph_time(fn, reps: int = 50, trials: int = 7) -> float:
    """Median ms of one call, from CUDA-graph replays of `reps` calls."""
    fn()
    replay = capture_graph(lambda: [fn() for _ in range(reps)], warmup=1)
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
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


def _gelu_cases(before: str = ""):
    """(label, shape, calls a step, input bytes, {variant: fn -> (q, scale)}) at Qwen-Image's MLP:
    image and text tokens x 12288, 120 calls each a step (60 blocks x 2 CFG passes). The kernel is
    the live entry's copy (kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py); `before`, a folder
    holding an earlier gelu_quant.py, adds that file's one pass (fast) beside it."""
    gq = _load("kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py")
    old = _load_file(Path(before) / "gelu_quant.py", "before_gelu_quant") if before else None
    compiled = torch.compile(lambda h: gq.reference(h, "torchao"), fullgraph=True)

    def launch(h, block_n=0, warps=0, exact=True, mod=gq):  # the entry's own launch, its arithmetic chosen here
        mod.ARITHMETIC = "exact" if exact else "fast"
        return mod._launch(h, True, block_n, warps)

    for M, N in [(4096, 12288), (512, 12288)]:
        torch.manual_seed(0)
        h = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 2
        variants = {
            "torch eager (unfused)": lambda h=h: gq.reference(h, "torchao"),
            "inductor fusion": lambda h=h: compiled(h),
            "one-pass, exact": lambda h=h: launch(h),
            "one-pass, fast (default warps)": lambda h=h: launch(h, 0, 0, False),
            "one-pass, fast, 8 warps": lambda h=h: launch(h, 0, 8, False),
            "one-pass, fast, 32 warps": lambda h=h: launch(h, 0, 32, False),
            "two-pass, fast, block 2048, 4 warps": lambda h=h: launch(h, 2048, 4, False),
        }
        if old is not None:
            variants["before: one-pass, fast (default warps)"] = lambda h=h: launch(h, 0, 0, False, old)
            variants["before: one-pass, fast, 32 warps"] = lambda h=h: launch(h, 0, 32, False, old)
        yield f"{M} x {N}", (M, N), 120, M * N * 2, variants


def _sglang_static_quant():
    """SGLang's `static_quant_fp8` (the `_static_quant_fp8` kernel's launcher), from the engine repository
    that `optbot engine init sglang` (or benchmarks/gpu_sglang.sh) made, when sglang is not importable
    as it is; None, with the reason printed, where it cannot be had (the row is then left out)."""
    eng = Path(os.environ.get("OPTBOT_HOME", Path.home() / ".cache" / "optbot")) / "engines" / "sglang-0.5.23" / "python"
    if eng.is_dir() and str(eng) not in sys.path:
        sys.path.append(str(eng))
    try:
        from sglang.kernels.ops.quantization.fp8_kernel import static_quant_fp8
    except Exception as e:  # noqa: BLE001 - sglang absent or not importable here: no upstream row
        print(f"(no SGLang row: sglang.kernels.ops.quantization.fp8_kernel does not import: {type(e).__name__}: "
              f"{str(e)[:160]})")
        return None
    return static_quant_fp8


def _gelu_static_cases(before: str = ""):
    """SGLang's Qwen-Image in its ModelOpt FP8 path (kernel_store/sglang-qwen-image-fp8-gelu-quant): the
    GELU and the static (one scale, calibrated ahead) quantization of its output. Upstream runs torch's
    GELU kernel and then SGLang's `_static_quant_fp8` (that row where sglang imports: run under
    `benchmarks/gpu_sglang.sh cmd`); the scale is a fixed value here, as a checkpoint's. Each variant
    returns (q, the scale); the bytes count no per-row scales (12 KB at most: within the rounding)."""
    gs = _load("kernel_store/sglang-qwen-image-fp8-gelu-quant/gelu_static_quant.py")
    compiled = torch.compile(gs.reference, fullgraph=True)
    static_quant_fp8 = _sglang_static_quant()
    for M, N in [(4096, 12288), (512, 12288)]:
        torch.manual_seed(0)
        h = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 2
        scale = torch.tensor(0.02, device="cuda", dtype=torch.float32)  # |gelu| up to ~9: a few saturate
        variants = {
            "torch eager (unfused)": lambda h=h: (gs.reference(h, scale), scale),
            "inductor fusion": lambda h=h: (compiled(h, scale), scale),
            "the entry (default block, warps)": lambda h=h: (gs._launch(h, scale, 0, 0), scale),
            "block 2048, 4 warps": lambda h=h: (gs._launch(h, scale, 2048, 4), scale),
            "block 8192, 16 warps": lambda h=h: (gs._launch(h, scale, 8192, 16), scale),
        }
        if static_quant_fp8 is not None:
            variants["SGLang: torch GELU + _static_quant_fp8"] = lambda h=h: (
                static_quant_fp8(torch.nn.functional.gelu(h, approximate="tanh"), scale)[0], scale)
        yield f"{M} x {N}", (M, N), 120, M * N * 2, variants


def _swiglu_cases(before: str = ""):
    """The same at FLUX.2's: the single-stream blocks' [attention output 6144 | SwiGLU of 2 x 18432]
    over 4608 tokens (48 calls a step), the double-stream blocks' SwiGLU over 4096 image and 512 text
    tokens (8 calls each); one pass a step. The live entry's copy
    (kernel_store/flux2-fp8-norm-quant/swiglu_quant.py) in its one-pass and two-pass forms at several
    blocks and warps; `before`: an earlier swiglu_quant.py beside it."""
    sq = _load("kernel_store/flux2-fp8-norm-quant/swiglu_quant.py")
    old = _load_file(Path(before) / "swiglu_quant.py", "before_swiglu_quant") if before else None
    compiled = torch.compile(lambda x, p: sq.reference(x, p, "torchao"), fullgraph=True)

    def launch(x, p, block_n=2048, warps=8, exact=True, mod=sq, one_pass=False):
        mod.ARITHMETIC = "exact" if exact else "fast"
        mod.ONE_PASS = one_pass
        return mod._launch(x, p, True, block_n, warps)

    for M, P, W, calls in [(4608, 6144, 36864, 48), (4096, 0, 36864, 8), (512, 0, 36864, 8)]:
        torch.manual_seed(0)
        x = torch.randn(M, W, device="cuda", dtype=torch.bfloat16) * 2
        p = torch.randn(M, P, device="cuda", dtype=torch.bfloat16) if P else None
        variants = {
            "torch eager (unfused)": lambda x=x, p=p: sq.reference(x, p, "torchao"),
            "inductor fusion": lambda x=x, p=p: compiled(x, p),
            "two passes, fast, block 2048, 8 warps": lambda x=x, p=p: launch(x, p, exact=False),
        }
        for warps in (16, 32):  # 16: the entry's default since 2026-12-06
            variants[f"one pass, fast, block 2048, {warps} warps"] = (
                lambda x=x, p=p, w=warps: launch(x, p, 2048, w, False, one_pass=True))
        variants["one pass, exact, block 2048, 16 warps"] = lambda x=x, p=p: launch(x, p, 2048, 16, True, one_pass=True)
        for block, warps in [(2048, 16), (4096, 16)]:
            variants[f"two passes, fast, block {block}, {warps} warps"] = (
                lambda x=x, p=p, b=block, w=warps: launch(x, p, b, w, False))
        if old is not None:
            variants["before: two passes, fast, block 2048, 8 warps"] = lambda x=x, p=p: launch(x, p, 2048, 8, False, old)
        yield f"{M} x ({P} + {W} // 2)", (M, P, W), calls, (M * W + M * P) * 2, variants


def _norm_quant_cases(before: str = ""):
    """Qwen-Image's LayerNorm + modulation and the FP8 quantization of its output (the QKV and MLP
    inputs): image and text tokens x 3072, 240 calls each a step (norm1 and norm2 of 60 blocks, 2
    CFG passes). Variants: inductor's fusion of the unfused ops (the `:aside` stack), the store's
    norm + modulation kernel followed by inductor's compiled quantization (the stack before
    qwen-image-fp8-norm-quant), and that entry's kernel doing both in one pass (its NUM_WARPS, 8, 4;
    exact arithmetic) and with the row as one block or its default blocks (BLOCKS) at 2-8 warps. Until
    2026-12-06 the one-pass kernel was a prototype in benchmarks/."""
    nq = _load("kernel_store/qwen-image-fp8-norm-quant/norm_quant.py")
    nm = _load("kernel_store/qwen-image-norm-modulate/qwen_norm_modulate.py")
    old = _load_file(Path(before) / "norm_quant.py", "before_norm_quant") if before else None
    compiled = torch.compile(lambda x, sh, sc: nq.reference(x, sh, sc, 1e-6), fullgraph=True)
    cquant = torch.compile(lambda y: nq.quantize_rows(y, "torchao"), fullgraph=True)

    def store_then_inductor(x, sh, sc):
        return cquant(nm.norm_modulate(x, sh[:, None], sc[:, None], 1e-6))

    def entry(x, sh, sc, num_warps=0, arithmetic="fast", mod=nq, **knobs):
        """The entry's kernel with its module settings (ARITHMETIC, and BLOCKS where the file has it) set
        for this call only."""
        knobs = {"ARITHMETIC": arithmetic, **{k: v for k, v in knobs.items() if hasattr(mod, k)}}
        was = {k: getattr(mod, k) for k in knobs}
        for k, v in knobs.items():
            setattr(mod, k, v)
        try:
            return mod.norm_modulate_quant(x, sh, sc, 1e-6, "torchao", num_warps)
        finally:
            for k, v in was.items():
                setattr(mod, k, v)

    for M in (4096, 512):
        torch.manual_seed(0)
        x = torch.randn(1, M, 3072, device="cuda", dtype=torch.bfloat16) * 3 + 0.5
        sh = torch.randn(1, 3072, device="cuda", dtype=torch.bfloat16) * 0.5
        sc = torch.randn(1, 3072, device="cuda", dtype=torch.bfloat16) * 0.5
        variants = {
            "torch eager (unfused)": lambda x=x, sh=sh, sc=sc: nq.reference(x, sh, sc, 1e-6),
            "inductor fusion": lambda x=x, sh=sh, sc=sc: compiled(x, sh, sc),
            "store norm+mod kernel, inductor quant": lambda x=x, sh=sh, sc=sc: store_then_inductor(x, sh, sc),
            "norm_quant, one pass (the entry: fast, its NUM_WARPS)": lambda x=x, sh=sh, sc=sc: entry(x, sh, sc),
            "norm_quant, 8 warps": lambda x=x, sh=sh, sc=sc: entry(x, sh, sc, 8),
            "norm_quant, exact": lambda x=x, sh=sh, sc=sc: entry(x, sh, sc, 0, "exact"),
            "norm_quant, 4 warps": lambda x=x, sh=sh, sc=sc: entry(x, sh, sc, 4),
        }
        # BLOCKS: the row as blocks in registers (0: three of 1024 for 3072; 1: one 4096-lane block)
        for blocks, warps in ((1, 4), (0, 8), (0, 2)):
            variants[f"norm_quant, {blocks or 'default'} block(s), {warps} warps"] = (
                lambda x=x, sh=sh, sc=sc, nb=blocks, w=warps: entry(x, sh, sc, w, BLOCKS=nb))
        if old is not None:
            variants["before: norm_quant, 8 warps"] = lambda x=x, sh=sh, sc=sc: entry(x, sh, sc, 8, "fast", old)
            variants["before: norm_quant, 4 warps"] = lambda x=x, sh=sh, sc=sc: entry(x, sh, sc, 4, "fast", old)
        yield f"{M} x 3072", (M, 3072), 240, M * 3072 * 2, variants


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("gelu", "swiglu", "norm-quant", "gelu-static"), default="gelu",
                    help="gelu: qwen-image-fp8-gelu-quant at Qwen-Image's shapes; swiglu: flux2-fp8-swiglu-quant "
                         "at FLUX.2's; norm-quant: Qwen-Image's norm + modulation + quantization "
                         "(kernel_store/qwen-image-fp8-norm-quant's kernel against inductor and the store's norm kernel); "
                         "gelu-static: sglang-qwen-image-fp8-gelu-quant (SGLang's static scale) at Qwen-Image's shapes")
    ap.add_argument("--before", default="", metavar="DIR",
                    help="a folder holding earlier copies of the kernel files (gelu_quant.py, swiglu_quant.py, "
                         "norm_quant.py): their variants run beside the live entries' (before / after an edit)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (the variants differ only in the GPU's arithmetic)", file=sys.stderr)
        return 2
    bw = _copy_bandwidth()
    rows = []
    cases = {"gelu": _gelu_cases, "swiglu": _swiglu_cases, "norm-quant": _norm_quant_cases,
             "gelu-static": _gelu_static_cases}[args.kernel]
    for label, shape, calls, inputs, variants in cases(args.before):
        ref_q, ref_s = variants["torch eager (unfused)"]()
        ind_q, _ = variants["inductor fusion"]()
        M, N = ref_q.shape
        nbytes = inputs + M * N + M * 4  # what the kernel reads, then e4m3 values and float32 scales
        bound_ms = nbytes / bw * 1e3
        print(f"\n[{label}] bytes {nbytes / 1e6:.1f} MB, byte bound {bound_ms * 1e3:.1f} us "
              f"at {bw / 1e12:.2f} TB/s (copy measured here), {calls} calls a step")
        for name, fn in variants.items():
            try:
                ms = _graph_time(fn)
                q, s = fn()
            except Exception as e:  # one variant's failure (a config the compiler refuses) loses no other row
                print(f"  {name:34s} FAILED: {type(e).__name__}: {str(e)[:300]}")
                rows.append({"shape": list(shape), "variant": name, "error": f"{type(e).__name__}: {str(e)[:1000]}"})
                continue
            diff_ref = int((q.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
            diff_ind = int((q.view(torch.uint8) != ind_q.view(torch.uint8)).sum())
            rows.append({"shape": list(shape), "variant": name, "us": ms * 1e3, "bound_us": bound_ms * 1e3,
                         "calls_per_step": calls, "ms_per_step": ms * calls, "codes_differ_from_eager": diff_ref,
                         "codes_differ_from_inductor": diff_ind,
                         "scales_equal_eager": bool(torch.equal(s, ref_s))})
            print(f"  {name:34s} {ms * 1e3:8.1f} us  x{ms / bound_ms:4.1f} bound  "
                  f"{ms * calls:6.2f} ms/step  e4m3 codes != eager {diff_ref}, != inductor {diff_ind}")
    per_step = {}
    for r in rows:
        if "ms_per_step" in r:
            per_step[r["variant"]] = per_step.get(r["variant"], 0.0) + r["ms_per_step"]
    print("\nper step:")
    for k, v in per_step.items():
        print(f"  {k:34s} {v:6.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "python": platform.python_version(),
            "kernel": args.kernel, "copy_bandwidth_Bps": bw, "command": "python " + " ".join(sys.argv), "rows": rows,
            "per_step_ms": per_step}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
