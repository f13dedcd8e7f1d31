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
    src.write_text(src_edit(src.read_text()))
    return folder


def test_wrong_kernel_fails_with_location(tmp_path, base_worktree):
    folder = _broken_entry(tmp_path, lambda s: s.replace("(act * b)", "(act * b + 0.01 * (cols == 5))"))
    entry = load_entry(folder)
    assert not check_sources(entry).ok  # it no longer matches the patched engine file
    (c,) = run_kernel_tests(entry, str(base_worktree / "src"), "", "cpu", tmp_path / "run", params={"seeds": [0]})
    assert c.ok is False
    assert "out of tolerance" in c.reason and "first at" in c.reason


def test_kernel_that_skips_triton_is_rejected(tmp_path, base_worktree):
    folder = _broken_entry(tmp_path, lambda s: s.replace("return triton is not None and (", "return False and ("))
    (c,) = run_kernel_tests(load_entry(folder), str(base_worktree / "src"), "", "cpu", tmp_path / "run", params={"seeds": [0]})
    assert c.ok is False and "not triton" in c.reason
