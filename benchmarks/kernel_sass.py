"""Registers, spills and the order of global loads, barriers and stores of a Triton kernel as ptxas
builds it for a GPU, on a machine without one (triton's bundled ptxas and cuobjdump; no CUDA device).

A row kernel whose next block's loads wait on the last block's reduction barrier pays one memory
latency per block (lessons/a-row-kernel-issues-its-loads-before-its-reductions.md): the `LDG`/`BAR`
sequence printed here shows it before any GPU time is spent, and the registers say how many programs
an SM holds (65,536 registers / (32 x warps x registers a thread)); the instruction count, over the
values a thread holds, what an element costs to issue (a kernel without loops: each thread runs each
instruction once; an H100 SM issues 4 warp instructions a cycle).

    python benchmarks/kernel_sass.py FILE KERNEL --arg NAME=TYPE ... [--const NAME=VALUE ...]
        [--warps 4,8,16] [--arch 90]

TYPE is a Triton signature type (`*bf16`, `*fp8e4nv`, `*fp32`, `i32`, `i64`, `fp32`); every argument
not given as --const needs one. Pointers and integers are marked divisible by 16, as a real launch
specializes them (without that the loads do not vectorize and the SASS is not the GPU's). Example
(kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py at Qwen-Image's 12288-wide rows):

    python benchmarks/kernel_sass.py kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py _gelu_quant_kernel \\
      --arg H='*bf16' --arg Q='*fp8e4nv' --arg S='*fp32' --arg N=i32 --arg sh=i64 --arg sq=i64 \\
      --const BLOCK_N=4096 --const CHUNKS=3 --const ROUND=1 --const TORCHAO=1 --const F8_STORE=1 \\
      --const CUDA_MATH=1 --const EXACT=0 --const EVEN=1 --warps 8,16
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def _tool(name: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.is_file():
        raise ValueError(f"{path} not found: this triton has no bundled {name}")
    return str(path)


def _value(v: str):
    try:
        return int(v)
    except ValueError:
        return {"True": True, "False": False}.get(v, v)


def build(file: Path, kernel: str, args: dict[str, str], consts: dict, warps: int, arch: int,
          fp_fusion: bool | None = None) -> dict:
    """{"regs", "instructions", "stack", "sequence", "half_fmas", "fp_fusion"}: the cubin's resource usage,
    its SASS instruction count, its LDG/BAR/STG order (run-length coded) and the bf16/f16 fused
    multiply-adds of its PTX. fp_fusion None: as the module launches it (its FP_FUSION, else Triton's
    default, on)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("kernel_sass_" + file.stem, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    fn = getattr(mod, kernel, None)
    if fn is None or not hasattr(fn, "arg_names"):
        raise ValueError(f"{file}: no Triton kernel named {kernel!r}")
    names = list(fn.arg_names)
    unknown = sorted((set(args) | set(consts)) - set(names))
    if unknown:
        raise ValueError(f"{kernel} has no argument(s) {unknown}; its arguments: {names}")
    need = [n for n in names if n not in args and n not in consts and n not in _defaults(fn)]
    if need:
        raise ValueError(f"{kernel}: give --arg NAME=TYPE or --const NAME=VALUE for {need}")
    sig = {n: args.get(n, "constexpr") for n in names}
    constexprs = {(names.index(n),): v for n, v in consts.items()}
    for n, v in _defaults(fn).items():
        constexprs.setdefault((names.index(n),), v)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or sig[n] in ("i32", "i64")}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    if fp_fusion is None:
        fp_fusion = bool(getattr(mod, "FP_FUSION", True))
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": warps, "enable_fp_fusion": fp_fusion})
    # A kernel that rounds to bf16 where the unfused code stores (x.to(bf16).to(fp32)) lets LLVM narrow the
    # arithmetic between two roundings to bf16 and, with fp fusion on, contract a product and the sum after
    # it into one bf16 FMA: one rounding where the unfused code rounds twice (the FP8 codes then differ from
    # eager's; benchmarks/results/h100-fp8-s12-20261207/). Counted here, per PTX instruction (a bf16x2 is two).
    half_fmas = len(re.findall(r"^\s*(?:@%p\d+\s+)?fma\.rn(?:\.\w+)*\.(?:bf16|f16)(?:x2)?\b",
                               compiled.asm["ptx"], re.M))
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    seq = [m.group(1) for line in sass.splitlines() if (m := re.search(r"\b(LDG|BAR|STG)\b", line))]
    # every SASS instruction a thread issues on the straight-line path (loops counted once): with the
    # values a thread holds, the issue cost of an element (an SM issues 4 warp instructions a cycle)
    ops = [line for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+[A-Z@]", line)]
    return {"regs": int(re.search(r"REG:(\d+)", usage).group(1)), "instructions": len(ops),
            "stack": int(re.search(r"STACK:(\d+)", usage).group(1)), "half_fmas": half_fmas, "fp_fusion": fp_fusion,
            "sequence": " ".join(f"{len(list(g))}{k}" for k, g in itertools.groupby(seq))}


def _defaults(fn) -> dict:
    """The kernel's constexpr parameters with Python defaults (a `X: tl.constexpr = 1`)."""
    import inspect

    return {p.name: p.default for p in inspect.signature(fn.fn).parameters.values()
            if p.default is not inspect.Parameter.empty}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("file", type=Path)
    ap.add_argument("kernel")
    ap.add_argument("--arg", action="append", default=[], metavar="NAME=TYPE")
    ap.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    ap.add_argument("--fp-fusion", choices=("on", "off"), default=None,
                    help="Triton's enable_fp_fusion (default: as the module launches, its FP_FUSION, else on)")
    a = ap.parse_args(argv)
    if not a.file.is_file():
        print(f"error: {a.file}: no such file", file=sys.stderr)
        return 2
    try:
        args = dict(kv.split("=", 1) for kv in a.arg)
        consts = {k: _value(v) for k, v in (kv.split("=", 1) for kv in a.const)}
        warps = [int(w) for w in a.warps.split(",")]
    except ValueError:
        print("error: --arg and --const take NAME=VALUE, --warps a comma-separated list of integers", file=sys.stderr)
        return 2
    for w in warps:
        try:
            r = build(a.file, a.kernel, args, consts, w, a.arch,
                      None if a.fp_fusion is None else a.fp_fusion == "on")
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        per_sm = 65536 // (32 * w * max(r["regs"], 1))
        print(f"{w:3d} warps: {r['regs']:3d} registers ({min(per_sm, 64 // w)} programs an SM), "
              f"{r['instructions']} instructions, stack {r['stack']} B, {r['half_fmas']} bf16/f16 FMAs "
              f"(fp fusion {'on' if r['fp_fusion'] else 'off'})   {r['sequence']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
