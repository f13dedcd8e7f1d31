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
    seq = line.rsplit("   ", 1)[-1].split()
    assert seq[0].endswith("LDG") and seq[1] == "1BAR" and "LDG" not in " ".join(seq[2:]), seq
    r = _run(*GELU, "--const", "BLOCK_N=2048", "--const", "CHUNKS=0", "--const", "EVEN=0", "--warps", "8")
    assert r.returncode == 0, r.stderr[-2000:]
    after = r.stdout.strip().splitlines()[-1].rsplit("   ", 1)[-1].split("1BAR")[-1]
    assert "LDG" in after, r.stdout  # the second pass reads the row again after the barrier


def test_bad_input_names_what_is_missing():
    r = _run("kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py", "_gelu_quant_kernel", "--arg", "H=*bf16")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "'Q'" in r.stderr, r.stderr
    r = _run("kernel_store/qwen-image-fp8-norm-quant/gelu_quant.py", "_no_such_kernel")
    assert r.returncode == 2 and "no Triton kernel named '_no_such_kernel'" in r.stderr, r.stderr
    r = _run("no/such/file.py", "k")
    assert r.returncode == 2 and "no such file" in r.stderr


def _sig(**types):
    return [a for n, t in types.items() for a in ("--arg", f"{n}={t}")]


def _consts(**values):
    return [a for n, v in values.items() for a in ("--const", f"{n}={v}")]


NORM = ["kernel_store/qwen-image-fp8-norm-quant/norm_quant.py", "_norm_mod_quant_kernel",
        *_sig(X="*bf16", SHIFT="*bf16", SCALE="*bf16", Q="*fp8e4nv", S_OUT="*fp32", S="i32", D="i32", sxb="i64",
              sxs="i64", smb="i64", sq="i64", eps="fp32"),
        *_consts(TORCHAO=1, F8_STORE=1, CUDA_MATH=1, EXACT=0)]


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


_I64 = "i64"
# Every store kernel that rounds to bf16 where the unfused code stores and then computes on the rounded
# values, built as its module launches it for an H100 at the workload's shapes, the GPU's own rounding
# (ROUND 2 where the kernel has that form, else its cast).
ROUNDING_KERNELS = {
    "qwen-image-fp8-norm-quant": ["kernel_store/qwen-image-fp8-norm-quant/norm_quant.py", "_norm_mod_quant_kernel",
        *NORM[2:], *_consts(BLOCK=1024, NB=3, EVEN=1, ROUND=2)],
    "flux2-fp8-norm-quant": ["kernel_store/flux2-fp8-norm-quant/flux2_norm_quant.py", "_flux2_norm_quant_kernel",
        *_sig(X="*bf16", G="*bf16", Y="*bf16", SHIFT="*bf16", SCALE="*bf16", HOUT="*bf16", Q="*fp8e4nv",
              S_OUT="*fp32", S="i32", D="i32", sxb=_I64, sxs=_I64, syb=_I64, sys_=_I64, smb=_I64, shob=_I64,
              shos=_I64, sq=_I64, eps="fp32"),
        *_consts(BLOCK_D=8192, RESIDUAL=1, ROUND=2, TORCHAO=1, F8_STORE=1, CUDA_MATH=1, EXACT=0)],
    "qwen-image-norm-modulate": ["kernel_store/qwen-image-norm-modulate/qwen_norm_modulate.py",
        "_qwen_norm_modulate_kernel",
        *_sig(X="*bf16", SHIFT="*bf16", SCALE="*bf16", OUT="*bf16", M="i32", S="i32", D="i32", eps="fp32",
              sxb=_I64, sxs=_I64, smb=_I64, sms=_I64, sob=_I64, sos=_I64),
        *_consts(BLOCK_M=1, BLOCK_D=4096, ROUND=1, BF16=0)],
    "qwen-image-absorb-bias": ["kernel_store/qwen-image-absorb-bias/gate_bias_residual.py",
        "_gate_bias_residual_kernel",
        *_sig(R="*bf16", G="*bf16", Y="*bf16", BIAS="*bf16", OUT="*bf16", M="i32", S="i32", D="i32", srb=_I64,
              srs=_I64, sgb=_I64, sgs=_I64, syb=_I64, sys_=_I64),
        *_consts(HAS_BIAS=1, ROUND=1, BLOCK_M=4, BLOCK_N=1024)],
    "flux2-norm-modulate": ["kernel_store/flux2-norm-modulate/norm_modulate.py", "_norm_modulate_kernel",
        *_sig(H="*bf16", G="*bf16", Y="*bf16", SHIFT="*bf16", SCALE="*bf16", HOUT="*bf16", OUT="*bf16", S="i32",
              D="i32", eps="fp32", **{n: _I64 for n in "shb shs syb sys_ smb sms sgb sgs sob sos".split()}),
        *_consts(BLOCK_D=8192, RESIDUAL=1, ROUND=1)],
    "qwen-image-fp8-gelu-quant": [*GELU[:2], *[a.replace("ROUND=1", "ROUND=2") for a in GELU[2:]],
        *_consts(BLOCK_N=4096, CHUNKS=3, EVEN=1)],
    "flux2-fp8-swiglu-quant": ["kernel_store/flux2-fp8-swiglu-quant/swiglu_quant.py", "_swiglu_quant_kernel",
        *_sig(X="*bf16", P="*bf16", Q="*fp8e4nv", S="*fp32", I="i32", PW="i32", sx=_I64, sp=_I64, sq=_I64),
        *_consts(BLOCK_N=2048, PC=3, IC=9, ROUND=2, TORCHAO=1, F8_STORE=1, CUDA_MATH=1, EXACT=0)],
    "flux2-qk-rmsnorm-rope": ["kernel_store/flux2-qk-rmsnorm-rope/qk_norm_rope.py", "_qk_rmsnorm_rope_kernel",
        *_sig(X="*bf16", W="*bf16", COS="*fp32", SIN="*fp32", OUT="*bf16", n_rows="i32", S="i32", H="i32",
              eps="fp32", **{n: _I64 for n in "sxb sxs sxh sob sos soh scs".split()}),
        *_consts(HALF=64, BLOCK_HALF=64, BLOCK_M=4, HAS_W=1, ROUND=1)],
    "flux2-swiglu": ["kernel_store/flux2-swiglu/swiglu.py", "_swiglu_kernel",
        *_sig(X="*bf16", P="*bf16", OUT="*bf16", n_cols="i32", n_prefix="i32", sx=_I64, sp=_I64, so=_I64),
        *_consts(BLOCK_N=1024, ROUND=1)],
    "qwen-image-qkv-norm-rope-epilogue": ["kernel_store/qwen-image-qkv-norm-rope-epilogue/qkv_norm_rope_gemm.py",
        "_norm_rope_rows_kernel",
        *_sig(Y0="*bf16", Y1="*bf16", NQ0="*bf16", NK0="*bf16", NQ1="*bf16", NK1="*bf16", COS="*fp32", SIN="*fp32",
              OUT="*bf16", M0="i32", M1="i32", S0="i32", S1="i32", OFF0="i32", OFF1="i32", COFF0="i32",
              COFF1="i32", H="i32", eps_q0="fp32", eps_k0="fp32", eps_q1="fp32", eps_k1="fp32",
              **{n: _I64 for n in "sy0 sy1 so3 sob sos soh scs".split()}),
        *_consts(D=128, BLOCK_M=16, BLOCK_H=2, HAS_NW=1, HAS_ROPE=1, ROUND=1, ROUND_BEFORE_W=1)],
    "sglang-qwen-image-fp8-gelu-quant": ["kernel_store/sglang-qwen-image-fp8-gelu-quant/gelu_static_quant.py",
        "_gelu_static_quant_kernel", *_sig(H="*bf16", Q="*fp8e4nv", S="*fp32", numel="i64"),
        *_consts(BLOCK=4096, ROUND=2, F8_STORE=1, EVEN=1)],
    "sglang-qwen-image-fp8-norm-quant": ["kernel_store/sglang-qwen-image-fp8-norm-quant/norm_static_quant.py",
        "_norm_static_quant_kernel",
        *_sig(X="*bf16", R="*bf16", G="*bf16", SCALE="*bf16", SHIFT="*bf16", S_IN="*fp32", Q="*fp8e4nv",
              ROUT="*bf16", S="i32", D="i32", sx=_I64, sr=_I64, sgb=_I64, smb=_I64, sq=_I64, sro=_I64, eps="fp32"),
        *_consts(BLOCK=1024, NB=3, EVEN=1, RESIDUAL=1, GATED=1, ROUND=2, F8_STORE=1)],
}
# Kernels with a ROUND parameter not built above, and why: the GEMM kernel's epilogue is the rows kernel's
# (the same norm and RoPE arithmetic, built above); a GEMM build takes minutes.
NOT_BUILT = {"_qkv_norm_rope_gemm_kernel"}


def _half_fmas(*args) -> int:
    r = _run(*args, "--warps", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.strip().splitlines()[-1].split(" bf16/f16 FMAs")[0].split()[-1])


@pytest.mark.parametrize("entry", sorted(ROUNDING_KERNELS))
def test_a_kernel_that_emulates_bf16_stores_contracts_no_bf16_fma(entry):
    """Built as launched (the module's FP_FUSION), no bf16 fused multiply-add: each rounding the unfused
    code makes stays a rounding (lessons/rounding-emulation-needs-fp-fusion-off.md)."""
    assert _half_fmas(*ROUNDING_KERNELS[entry]) == 0


def test_fp_fusion_on_contracts_the_modulation_into_bf16_fmas():
    """The failure the check above exists for, and that it can see: the same norm kernel with Triton's
    default fp fusion contracts round(round(n * scale) + shift) into one bf16 FMA per element pair."""
    assert _half_fmas(*ROUNDING_KERNELS["qwen-image-fp8-norm-quant"], "--fp-fusion", "on") >= 12


def test_every_store_kernel_that_rounds_is_checked():
    """A new kernel with a ROUND parameter joins ROUNDING_KERNELS (or says why not): the contraction is
    invisible on the CPU, so only this list keeps it from coming back."""
    import re

    built = {(Path(v[0]).name, v[1]) for v in ROUNDING_KERNELS.values()}
    missing = []
    for f in sorted((ROOT / "kernel_store").glob("*/*.py")):
        if f.name.startswith("test_"):
            continue
        for m in re.finditer(r"def (_\w*kernel)\(([^)]*)\)", f.read_text()):
            if "ROUND" in m.group(2) and (f.name, m.group(1)) not in built and m.group(1) not in NOT_BUILT:
                missing.append(f"{f.relative_to(ROOT)}: {m.group(1)}")
    assert not missing, missing
