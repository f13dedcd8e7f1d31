"""benchmarks/kernel_sass.py: a Triton kernel built for sm_90 on a machine with no GPU (triton's bundled
ptxas and cuobjdump), its registers and its order of loads, barriers and stores: the evidence of
lessons/a-row-kernel-issues-its-loads-before-its-reductions.md, taken before any GPU time."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
triton = pytest.importorskip("triton")
if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").is_file():
    pytest.skip("this triton bundles no cuobjdump", allow_module_level=True)

GELU = ["kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py", "_gelu_quant_kernel",
        "--arg", "H=*bf16", "--arg", "Q=*fp8e4nv", "--arg", "S=*fp32", "--arg", "N=i32", "--arg", "sh=i64",
        "--arg", "sq=i64", "--const", "ROUND=1", "--const", "TORCHAO=1", "--const", "F8_STORE=1",
        "--const", "CUDA_MATH=1", "--const", "EXACT=0"]


def _run(*args):
    return subprocess.run([sys.executable, "benchmarks/kernel_sass.py", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_the_one_pass_gelu_kernel_loads_its_row_before_its_one_barrier():
    """Qwen-Image's 12288-wide row in three blocks: every load before the single reduction barrier; the
    two-pass form (CHUNKS 0, blocks of 2048) loops, its loads on either side of the barrier."""
    r = _run(*GELU, "--const", "BLOCK_N=4096", "--const", "CHUNKS=3", "--const", "EVEN=1", "--warps", "16")
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("16 warps:") and "registers" in line and "stack 0 B" in line, line
    seq = line.split("B   ")[-1].split()
    assert seq[0].endswith("LDG") and seq[1] == "1BAR" and "LDG" not in " ".join(seq[2:]), seq
    r = _run(*GELU, "--const", "BLOCK_N=2048", "--const", "CHUNKS=0", "--const", "EVEN=0", "--warps", "8")
    assert r.returncode == 0, r.stderr[-2000:]
    after = r.stdout.strip().splitlines()[-1].split("1BAR")[-1]
    assert "LDG" in after, r.stdout  # the second pass reads the row again after the barrier


def test_bad_input_names_what_is_missing():
    r = _run("kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py", "_gelu_quant_kernel", "--arg", "H=*bf16")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "'Q'" in r.stderr, r.stderr
    r = _run("kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py", "_no_such_kernel")
    assert r.returncode == 2 and "no Triton kernel named '_no_such_kernel'" in r.stderr, r.stderr
    r = _run("no/such/file.py", "k")
    assert r.returncode == 2 and "no such file" in r.stderr


NORM = ["kernel_store/qwen-image-fp8-norm-quant/norm_quant.py", "_norm_mod_quant_kernel",
        *[a for n, t in (("X", "*bf16"), ("SHIFT", "*bf16"), ("SCALE", "*bf16"), ("Q", "*fp8e4nv"), ("S_OUT", "*fp32"),
                         ("S", "i32"), ("D", "i32"), ("sxb", "i64"), ("sxs", "i64"), ("smb", "i64"), ("sq", "i64"),
                         ("eps", "fp32")) for a in ("--arg", f"{n}={t}")],
        *[a for kv in ("TORCHAO=1", "F8_STORE=1", "CUDA_MATH=1", "EXACT=0") for a in ("--const", kv)]]


def _instructions(*consts):
    r = _run(*NORM, *[a for kv in consts for a in ("--const", kv)], "--warps", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    return int(line.split(" instructions")[0].split()[-1])


def test_the_norm_kernels_blocks_and_hardware_rounding_halve_its_instructions():
    """qwen-image-fp8-norm-quant at Qwen-Image's 3072-wide row, 4 warps: one padded 4096-lane block with
    the interpreter's integer bf16 rounding (the form measured at 2.2x its byte bound, issue-bound) against
    the default, three 1024-wide blocks with the GPU's own conversion (lessons/a-row-kernel-can-be-bound-
    by-the-instructions-it-issues.md): at least twice fewer instructions a thread."""
    before = _instructions("BLOCK=4096", "NB=1", "EVEN=0", "ROUND=1")
    after = _instructions("BLOCK=1024", "NB=3", "EVEN=1", "ROUND=2")
    assert after * 2 <= before, (before, after)
