"""The stand-ins the SGLang adapter installs for packages that cannot be there (sgl_kernel on the
GPU box, torchvision on a CPU machine): torch rmsnorm kernels that match a reference, and
placeholders that stop with their own name instead of computing anything."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runner.engines import sglang_standins as st

ROOT = Path(__file__).resolve().parents[2]


def _ref_rmsnorm(x, w, eps):
    x64 = x.double()
    return (x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double())


@pytest.mark.parametrize("shape", [(1, 128), (37, 96), (3, 5, 200)])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_rmsnorm_matches_reference(shape, dtype, atol):
    g = torch.Generator().manual_seed(hash(shape) % 1000)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    y = st.rmsnorm(x, w, 1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.double(), _ref_rmsnorm(x, w, 1e-6), atol=atol, rtol=atol)
    out = torch.empty_like(x)
    assert st.rmsnorm(x, w, 1e-6, out=out) is out and torch.equal(out, y)


def test_fused_add_rmsnorm_is_in_place_like_the_kernel():
    g = torch.Generator().manual_seed(7)
    x, r, w = torch.randn(9, 64, generator=g), torch.randn(9, 64, generator=g), torch.rand(64, generator=g) + 0.5
    x0, r0 = x.clone(), r.clone()
    assert st.fused_add_rmsnorm(x, r, w, 1e-5) is None
    torch.testing.assert_close(r, x0 + r0)
    torch.testing.assert_close(x.double(), _ref_rmsnorm(x0 + r0, w, 1e-5), atol=1e-5, rtol=1e-5)


def test_placeholders_raise_with_their_name():
    m = st._Missing("sgl_kernel.flash_attn.flash_attn_varlen_func", "absent")
    with pytest.raises(NotImplementedError, match="sgl_kernel.flash_attn.flash_attn_varlen_func is not available"):
        m(torch.zeros(1))
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.scalar_type\.scalar_types\.uint4"):
        st._Missing("sgl_kernel.scalar_type.scalar_types", "absent").uint4()


def test_installed_stand_in_serves_the_import_chain_in_a_child():
    code = (
        "import importlib.util, torch\n"
        "from runner.engines import sglang_standins as st\n"
        "assert importlib.util.find_spec('sgl_kernel') is None\n"
        "st.install_sgl_kernel()\n"
        "from sgl_kernel import rmsnorm, fused_add_rmsnorm, moe_sum_reduce\n"
        "from sgl_kernel.flash_attn import flash_attn_varlen_func\n"
        "import sgl_kernel.kvcacheio\n"
        "assert rmsnorm is st.rmsnorm\n"
        "try:\n    flash_attn_varlen_func(1)\nexcept NotImplementedError as e:\n    print('RAISED', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "RAISED sgl_kernel.flash_attn.flash_attn_varlen_func is not available" in r.stdout


def test_flashinfer_absence_is_reported_never_stood_in():
    """On CUDA without flashinfer the notes say SGLang's RoPE runs its torch fallback, and nothing
    is installed under that name (SGLang's try/except imports keep falling back). On CPU SGLang
    never asks for it: no note."""
    code = (
        "import importlib.util, sys\n"
        "from runner.engines import sglang_standins as st\n"
        "assert importlib.util.find_spec('flashinfer') is None\n"
        "print('CPU', sorted(st.install(False)))\n"
        "notes = st.install(True)\n"
        "print('CUDA', sorted(notes))\n"
        "print('NOTE', notes['flashinfer'])\n"
        "assert 'flashinfer' not in sys.modules and importlib.util.find_spec('flashinfer') is None\n"
        "try:\n    import flashinfer.rope\nexcept ImportError:\n    print('IMPORT FAILS')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "CPU ['torchvision']" in r.stdout or "CPU []" in r.stdout
    assert "CUDA ['flashinfer', 'sgl_kernel'" in r.stdout
    assert f"NOTE {st.FLASHINFER_NOTE}" in r.stdout and "torch fallback" in st.FLASHINFER_NOTE
    assert "IMPORT FAILS" in r.stdout


def test_the_stand_in_code_optbot_records_is_in_sglangs_source(sglang_engine):
    """The spans the adapter records for the analyzer (runner/engines/sglang.py STAND_IN_CODE) resolve
    in the materialized SGLang and start at the function they name."""
    from runner.engines.sglang import STAND_IN_CODE, code_span

    root = sglang_engine.repo_path / "python"
    for what, (rel, qualname) in STAND_IN_CODE.items():
        span = code_span(str(root), rel, qualname)
        assert span and span.startswith(rel + ":"), (what, span)
        first, last = map(int, span.rpartition(":")[2].split("-"))
        lines = (root / rel).read_text().splitlines()
        assert lines[first - 1].lstrip().startswith(f"def {qualname.split('.')[-1]}(") and last > first
