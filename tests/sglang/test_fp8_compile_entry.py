"""sglang-fp8-quant-compile: SGLang's own FP8 DiT gets through torch.compile. No GPU needed.

1. Its static FP8 quantization kernel builds when inductor launches it: Triton compiles for sm_90 on
   the CPU with the signature inductor gave the kernel on the H200 (read from the kernel inductor wrote
   there, committed with the run), so upstream's kernel fails here exactly as it did there and the test
   can fail; the patched one builds, and under Triton's own float32 signature both produce the same PTX
   (the fix changes nothing for eager SGLang).
2. Its FP8 GEMM dispatch traces under torch.compile(fullgraph=True) (the H100's second failure)."""
from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from bot.generate.replay import apply_entry
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "sglang-fp8-quant-compile"
KERNEL = "_static_quant_fp8"
FILE = "python/sglang/kernels/ops/quantization/fp8_kernel.py"
RECORDED = ROOT / "benchmarks/results/h200-sglang-fp8-20261206/inductor-failing-kernel.py"

triton = pytest.importorskip("triton")


def _inductor_meta() -> tuple[dict, dict]:
    """(signature, constants) of the kernel as inductor launched it on the H200."""
    text = RECORDED.read_text()
    meta = re.search(r"triton_meta=(\{.*\}),\n", text).group(1)
    sig = ast.literal_eval(re.search(r"'signature': (\{[^}]*\})", meta).group(1))
    consts = re.search(r"'constants': (\{[^}]*\})", meta).group(1)
    consts = ast.literal_eval(consts.replace("triton.language.float8e4nv", "'float8e4nv'"))
    return sig, consts


def _load_kernel(src_file: Path, tmp: Path, name: str):
    """The kernel function alone, as its own module (the rest of the file imports SGLang's CUDA stack)."""
    text = src_file.read_text()
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == KERNEL)
    lines = text.splitlines()[fn.decorator_list[0].lineno - 1:fn.end_lineno]  # from its @triton.jit
    mod = tmp / f"{name}.py"
    mod.write_text("import triton\nimport triton.language as tl\n\n\n" + "\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(name, mod)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return getattr(m, KERNEL)


def _compile(kernel, signature: dict, constants: dict):
    """triton.compile for an H200/H100 (sm_90): the exception, or the compiled kernel."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {k: (getattr(tl, v) if isinstance(v, str) else v) for k, v in constants.items()}
    src = ASTSource(kernel, signature=signature, constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    try:
        return triton.compile(src, target=GPUTarget("cuda", 90, 32))
    except Exception as e:  # noqa: BLE001  the lowering error is the result
        return e


def _ptx(compiled) -> str:
    """The kernel's PTX instructions: the entry function's body without source locations (the debug
    sections and .loc lines carry the source's line numbers, which the patch's comment shifts)."""
    ptx = compiled.asm["ptx"]
    body = ptx[ptx.index(".visible .entry"):ptx.index("\n}\n", ptx.index(".visible .entry"))]
    return "\n".join(ln for ln in body.splitlines() if not ln.lstrip().startswith((".loc", "$L__", "//")))


@pytest.fixture(scope="module")
def kernels(sglang_engine, tmp_path_factory):
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as e:  # pragma: no cover  a Triton without its NVIDIA backend
        pytest.skip(f"Triton's NVIDIA backend is not importable here: {e}")
    e = get_entry(ENTRY, SHIPPED_STORE)
    r = apply_entry(sglang_engine, e, name="test-sglang-fp8-compile")
    assert r.status == "applied", r.reason
    tmp = tmp_path_factory.mktemp("sglang-fp8-compile")
    return (_load_kernel(Path(sglang_engine.repo_path) / FILE, tmp, "sgl_static_quant_base"),
            _load_kernel(Path(r.worktree) / FILE, tmp, "sgl_static_quant_patched"))


@pytest.mark.slow
def test_upstream_fails_as_on_the_h200_and_the_patch_builds(kernels):
    base, patched = kernels
    sig, consts = _inductor_meta()
    assert sig["fp8_min"] == sig["fp8_max"] == "fp64"  # what inductor gives a Python float
    err = _compile(base, sig, consts)
    assert isinstance(err, Exception) and "PassManager::run failed" in str(err), err
    built = _compile(patched, sig, consts)
    assert not isinstance(built, Exception), built
    assert built.asm.get("cubin")
    assert "cvt.rn.satfinite.e4m3x2.f32" in built.asm["ptx"]  # clamped in float32, converted to e4m3


@pytest.mark.slow
def test_under_tritons_own_signature_the_patch_changes_nothing(kernels):
    base, patched = kernels
    sig, consts = _inductor_meta()
    eager = dict(sig, fp8_min="fp32", fp8_max="fp32")  # Triton's launcher types a Python float fp32
    a, b = _compile(base, eager, consts), _compile(patched, eager, consts)
    assert not isinstance(a, Exception) and not isinstance(b, Exception), (a, b)
    assert _ptx(a) == _ptx(b)


DISPATCH = r"""
import sys, torch
from sglang.kernels.ops.gemm import _FP8_SCALED_MM
assert sys.modules["sglang"].__file__.startswith(sys.argv[1]), sys.modules["sglang"].__file__
torch.manual_seed(0)
a = torch.randn(16, 32).to(torch.float8_e4m3fn)
b = torch.randn(24, 32).to(torch.float8_e4m3fn).t()  # column-major, as SGLang stores FP8 weights
dispatch = lambda a, b, sa, sb: _FP8_SCALED_MM(a, b, sa, sb, torch.bfloat16)
native = lambda a, b, sa, sb: _FP8_SCALED_MM.forward_native(a, b, sa, sb, torch.bfloat16)
# per-token A scales, per-channel B scales: the row-wise layout torch._scaled_mm takes as is
rowwise = (torch.rand(16) + 0.5, torch.rand(24) + 0.5)
# what SGLang's ModelOpt FP8 linear passes: one static input scale (0-dim, `input_scale.max()`) and
# per-channel weight scales of shape [N, 1] (`convert_to_channelwise`)
modelopt = (torch.tensor(0.75), torch.rand(24, 1) + 0.5)
cases = {"rowwise": (dispatch, rowwise), "modelopt": (dispatch, modelopt), "modelopt-native": (native, modelopt)}
for name, (f, (sa, sb)) in cases.items():
    want = ((a.float() * sa.reshape(-1, 1)) @ (b.float() * sb.reshape(1, -1))).to(torch.bfloat16)
    try:  # eager first, as a run warms up (on the CPU the base's reference fails here with ModelOpt's scales)
        ref = f(a, b, sa, sb)
    except Exception:
        ref = None
    try:
        out = torch.compile(f, fullgraph=True)(a, b, sa, sb)
    except Exception as e:
        print(name, "FAILS", type(e).__name__, " ".join(str(e).split())[:4000])
        continue
    close = torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-2)
    print(name, "OK", ref is not None and torch.equal(out, ref), close)
"""


def _dispatch_under_compile(python_dir: Path) -> dict[str, str]:
    from tests.sglang.conftest import run_in_engine

    out = run_in_engine(DISPATCH, python_dir)
    return dict(ln.split(" ", 1) for ln in out.strip().splitlines() if ln.split(" ", 1)[0] in ("rowwise", "modelopt", "modelopt-native"))


@pytest.mark.slow
def test_sglangs_fp8_gemm_dispatch_traces_under_compile_with_the_patch(sglang_engine):
    """What stopped SGLang's FP8 DiT under compile once the kernel above built.
    On the H100 of 2026-12-06: InternalTorchDynamoError "object.__new__(PlatformInfo) is not safe": the
    FP8 GEMM's per-call backend choice asks `_platform()` for a msgspec Struct dynamo cannot build.
    On the H200 of 2026-12-06, with that fixed: "For non-tensorwise scaling, scale tensors must be 2D,
    but got scale_a.dim()=0 and scale_b.dim()=2": the compile-safe reference (`forward_native`) hands
    ModelOpt's one static input scale and per-channel weight scales to torch._scaled_mm unchanged, a
    pairing the AOT kernel takes and torch does not.
    On the CPU the base fails both ways under fullgraph (the dispatch as on the H100; its reference
    with ModelOpt's scales with the H200's message); patched, all three trace to the reference
    (SGLang's own choice under enter_torch_compile), bit-identical to eager and equal to the
    dequantized product."""
    pytest.importorskip("msgspec")
    e = get_entry(ENTRY, SHIPPED_STORE)
    r = apply_entry(sglang_engine, e, name="test-sglang-fp8-dispatch")
    assert r.status == "applied", r.reason
    base = _dispatch_under_compile(Path(sglang_engine.repo_path) / "python")
    assert base["rowwise"].startswith("FAILS") and "object.__new__" in base["rowwise"], base
    assert base["modelopt"].startswith("FAILS") and "object.__new__" in base["modelopt"], base
    assert base["modelopt-native"].startswith("FAILS") and "scale_a.dim()=0" in base["modelopt-native"], base
    patched = _dispatch_under_compile(Path(r.worktree) / "python")
    assert patched == dict.fromkeys(("rowwise", "modelopt", "modelopt-native"), "OK True True"), patched
