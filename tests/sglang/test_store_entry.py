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


def _rope_patch(root: Path, old: str, new: str) -> str:
    import difflib

    rel = "python/sglang/multimodal_gen/runtime/layers/rotary_embedding/utils.py"
    text = (root / rel).read_text()
    assert text.count(old) == 1
    return "".join(difflib.unified_diff(text.splitlines(True), text.replace(old, new).splitlines(True),
                                        f"a/{rel}", f"b/{rel}"))


FALLBACK_LINE = "            cos_b = cos.unsqueeze(-2)\n"  # in SGLang's torch RoPE fallback (FlashInfer absent)
OUTSIDE_LINE = "def _warn_about_missing_flashinfer():\n"


def test_a_store_entry_that_changes_stand_in_code_is_not_replayed(sglang_engine, tmp_path):
    """An entry whose patch changes the lines that run only because FlashInfer is absent (the run's
    `stand_in_code`) is skipped with the reason, whatever opportunity of its kind it matched; the same
    entry is applied where the run has no such stand-in, and a patch outside the span is not caught."""
    import shutil

    import yaml

    from bot.generate.replay import on_stand_in_code, replay
    from runner.engines.sglang import STAND_IN_CODE, code_span
    from tests.fakes import opportunity

    root = sglang_engine.repo_path
    code = {"flashinfer": [code_span(str(root / "python"), *STAND_IN_CODE["flashinfer"])]}
    inside = _rope_patch(root, FALLBACK_LINE, "            cos_b = cos.unsqueeze(-2)  # fused elsewhere\n")
    assert on_stand_in_code(inside, code).startswith("flashinfer (sglang/multimodal_gen/runtime/layers/rotary_embedding/utils.py:")
    assert on_stand_in_code(_rope_patch(root, OUTSIDE_LINE, "def _warn_about_missing_flashinfer():  # x\n"), code) == ""
    assert on_stand_in_code(inside, {}) == ""

    store = tmp_path / "store"
    shutil.copytree(SHIPPED_STORE / "sglang-flux2-cudnn-attention", store / "sglang-rope-test")
    f = store / "sglang-rope-test" / "entry.yaml"
    d = yaml.safe_load(f.read_text())
    d.pop("retired")
    d.update(id="sglang-rope-test", status="validated-cpu", hardware=["cpu"])
    d["engine"]["patches"] = [{"file": "python/sglang/multimodal_gen/runtime/layers/rotary_embedding/utils.py",
                               "function": "apply_flashinfer_rope_qk_inplace"}]
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    rel = d["engine"]["patches"][0]["file"]
    (store / "sglang-rope-test" / "patch.diff").write_text(f"diff --git a/{rel} b/{rel}\n{inside}")
    opps = [opportunity("attention-waste", id="opp-qk")]
    (r,) = replay(sglang_engine, opps, "sglang", "cpu", "flux2", store_root=store, stand_in_code=code)
    assert r.status == "skipped" and r.reason.startswith("its patch changes code that runs here only for a stand-in: flashinfer")
    (r,) = replay(sglang_engine, opps, "sglang", "cpu", "flux2", store_root=store)
    assert r.status == "applied", r.reason
