"""The store's SGLang entries patch SGLang's real source (kernel_store/sglang-*), and on the CPU the
store check leaves their validation to the GPU they target instead of calling them "not engaged"."""
from __future__ import annotations

import ast
from pathlib import Path

from bot.generate.replay import apply_entry
from bot.knowledge.check import check_entry
from bot.knowledge.store import get_entry
from bot.knowledge.location import SHIPPED_STORE


def test_the_cudnn_entry_applies_to_sglangs_flux2_and_waits_for_its_gpu(sglang_engine, tmp_path):
    e = get_entry("sglang-flux2-cudnn-attention", SHIPPED_STORE)
    assert e.engine.name == "sglang" and e.engine.base_sha == sglang_engine.base_sha
    r = apply_entry(sglang_engine, e, name="test-sglang-cudnn")
    assert r.status == "applied", r.reason
    src = (Path(r.worktree) / e.engine.patches[0].file).read_text()
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "USPAttention"]
    assert len(calls) == 2 and all(any(k.arg == "allow_cudnn_sdp" and k.value.value is True for k in c.keywords)
                                   for c in calls)
    res = check_entry(e, "cpu", tmp_path, run_kernels=False)
    by = {c.name: c for c in res.checks}
    assert by["patch"].ok is True and by["validate"].ok is None and "targets h200 only" in by["validate"].reason
    assert res.ok
