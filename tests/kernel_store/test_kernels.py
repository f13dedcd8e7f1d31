"""Each seed kernel's test, run the way `store check` runs it: a `kernel_test` runner job in its own
process, Triton under TRITON_INTERPRET=1 on CPU, the Triton path required. Plus the job's failure
reasons on a wrong kernel and on a kernel that silently falls back to torch."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bot.knowledge.check import check_sources, run_kernel_tests
from bot.knowledge.location import SHIPPED_STORE as STORE_DIR
from bot.knowledge.store import load_entry, load_store

KERNEL_ENTRIES = [e.id for e in load_store(STORE_DIR) if e.test_files()]


@pytest.mark.parametrize("entry_id", KERNEL_ENTRIES)
def test_seed_kernel_under_interpreter(entry_id, base_worktree, tmp_path):
    entry = load_entry(STORE_DIR / entry_id)
    assert check_sources(entry).ok
    checks = run_kernel_tests(entry, str(base_worktree / "src"), "", "cpu", tmp_path, params={"seeds": [0, 1]})
    for c in checks:
        assert c.ok, c.reason
        cases = c.details["cases"]
        assert c.details["interpret"] is True
        assert {case["path"] for case in cases} == {"triton"}
        assert any(case["shape"][0] == 1 for case in cases)  # M=1 is covered
        assert {case["dtype"] for case in cases} >= {"float32", "bfloat16"}
        assert c.details["micro"] is None  # no timing on CPU


def _broken_entry(tmp_path: Path, src_edit) -> Path:
    folder = tmp_path / "flux2-swiglu"
    shutil.copytree(STORE_DIR / "flux2-swiglu", folder)
    src = folder / "swiglu.py"
    text = src.read_text()
    edited = src_edit(text)
    assert edited != text, "the edit no longer matches swiglu.py: update it with the kernel"
    src.write_text(edited)
    return folder


def test_wrong_kernel_fails_with_location(tmp_path, base_worktree):
    folder = _broken_entry(tmp_path, lambda s: s.replace("v = act * b\n", "v = act * b + 0.01 * (cols == 5)\n"))
    entry = load_entry(folder)
    assert not check_sources(entry).ok  # it no longer matches the patched engine file
    (c,) = run_kernel_tests(entry, str(base_worktree / "src"), "", "cpu", tmp_path / "run", params={"seeds": [0]})
    assert c.ok is False
    assert "out of tolerance" in c.reason and "first at" in c.reason


def test_kernel_that_skips_triton_is_rejected(tmp_path, base_worktree):
    folder = _broken_entry(tmp_path, lambda s: s.replace("return not _aside() and triton is not None and (", "return False and ("))
    (c,) = run_kernel_tests(load_entry(folder), str(base_worktree / "src"), "", "cpu", tmp_path / "run", params={"seeds": [0]})
    assert c.ok is False and "not triton" in c.reason


def test_the_compile_mode_checks_the_engine_call(tmp_path, base_worktree):
    """The compile mode (on CUDA by default; asked for here on CPU): the registered op of
    flux2-qk-rmsnorm-rope compiled whole (fullgraph) gives the reference's numbers."""
    entry = load_entry(STORE_DIR / "flux2-qk-rmsnorm-rope")
    (c,) = run_kernel_tests(entry, str(base_worktree / "src"), "", "cpu", tmp_path,
                            params={"seeds": [0], "modes": ["compile"], "mode_shapes": [[1, 37, 3, 32]]})
    assert c.ok, c.reason
    compiled = [case for case in c.details["cases"] if case["mode"] == "compile"]
    assert {case["dtype"] for case in compiled} == {"float32", "bfloat16"} and all(x["passed"] for x in compiled)
    assert "(eager, compile)" in c.reason


def test_a_graph_break_fails_the_compile_mode(tmp_path, base_worktree):
    """A kernel torch.compile cannot keep whole fails its case under compile, with the mode named
    (its eager cases pass: the break is invisible there)."""
    folder = tmp_path / "flux2-qk-rmsnorm-rope"
    shutil.copytree(STORE_DIR / "flux2-qk-rmsnorm-rope", folder)
    test = folder / "test_qk_norm_rope.py"
    old = "def kernel(*inputs):\n    return op.qk_rmsnorm_rope_joint(*inputs)"
    assert old in test.read_text()
    test.write_text(test.read_text().replace(old, "def kernel(*inputs):\n    torch._dynamo.graph_break()\n"
                                                 "    return op.qk_rmsnorm_rope_joint(*inputs)"))
    (c,) = run_kernel_tests(load_entry(folder), str(base_worktree / "src"), "", "cpu", tmp_path / "run",
                            params={"seeds": [0], "modes": ["compile"], "mode_shapes": [[1, 37, 3, 32]]})
    assert c.ok is False
    failed = [case for case in c.details["cases"] if not case["passed"]]
    assert failed and {case["mode"] for case in failed} == {"compile"}, c.reason
    assert "crashed under compile" in failed[0]["reason"] and "graph_break" in failed[0]["reason"], failed[0]["reason"]


def test_micro_text_names_the_compiled_bar():
    from bot.knowledge.check import micro_text

    assert micro_text({"shape": [512, 36864], "speedup": 1.15, "vs_compiled": 0.83}) == "[512, 36864] 1.15x (0.83x vs compiled)"
    assert micro_text({"shape": [4], "speedup": 2.0, "vs_compiled": None, "compile_error": "Unsupported: x"}) == \
        "[4] 2.00x (reference does not compile)"
    assert micro_text({"shape": [4], "speedup": 2.0}) == "[4] 2.00x"  # a record from before the compiled bar


@pytest.mark.gpu
def test_micro_times_the_kernel_against_the_compiled_reference_on_cuda(tmp_path, base_worktree):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    (c,) = run_kernel_tests(load_entry(STORE_DIR / "flux2-swiglu"), str(base_worktree / "src"), "", "cuda", tmp_path,
                            params={"seeds": [0], "modes": [], "bench_iters": 5})
    assert c.ok, c.reason
    for row in c.details["micro"]:
        assert row["reference_compiled"]["median_ms"] > 0 and row["vs_compiled"] > 0, row
