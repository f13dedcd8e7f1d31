"""kernel_store entries and lessons: the real files load; malformed ones name the file and field."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from bot.errors import ConfigError
from bot.knowledge import OPPORTUNITY_KINDS
from bot.knowledge.lessons import load_lessons, parse_lesson, search, write_lesson
from bot.knowledge.store import STORE_DIR, added_file_content, find_entries, load_entry, load_store, patch_added_files

SEEDS = {"flux2-qk-rmsnorm-rope", "flux2-swiglu", "flux2-norm-modulate", "qwen-image-drop-all-ones-mask",
         "qwen-image-absorb-bias", "flux2-qkv-norm-rope-epilogue", "qwen-image-qkv-norm-rope-epilogue",
         "flux2-merge-qkv", "qwen-image-cfg-modulation-cache"}


def test_seed_store_loads():
    entries = {e.id: e for e in load_store()}
    assert SEEDS <= set(entries)
    for e in entries.values():
        assert e.pattern in OPPORTUNITY_KINDS
        assert e.provenance.kind == "authored" and e.provenance.author
        assert e.patch_path.is_file()
        # GPU numbers come only from a GPU run: none are invented in the seed.
        assert not (e.bench().get("gpu") or {}).get("end_to_end") or e.bench()["gpu"]["end_to_end"].get("command")
    assert entries["flux2-qk-rmsnorm-rope"].adds_kernels == ("_qk_rmsnorm_rope_kernel",)


def test_kernel_sources_are_the_files_the_patch_adds():
    for e in load_store():
        patch = e.patch_path.read_text()
        for src in e.kernel_files():
            target = next(p for p in patch_added_files(patch) if Path(p).name == src.name)
            assert added_file_content(patch, target) == src.read_text(), src


def test_find_entries_by_pattern_engine_hardware():
    assert {e.id for e in find_entries("attention-waste", "diffusers", "h200")} >= {"flux2-qk-rmsnorm-rope", "qwen-image-drop-all-ones-mask"}
    assert find_entries("attention-waste", "sglang", "h200") == []
    assert find_entries("attention-waste", "diffusers", "mi300") == []


def _copy_entry(tmp_path: Path, entry_id: str = "flux2-swiglu") -> Path:
    dst = tmp_path / "store" / entry_id
    shutil.copytree(STORE_DIR / entry_id, dst)
    return dst


@pytest.mark.parametrize("edit, field, expected", [
    (lambda d: d.pop("pattern"), "pattern", "one of merge-siblings"),
    (lambda d: d.update(pattern="make-it-fast"), "pattern", "one of merge-siblings"),
    (lambda d: d.update(id="other-id"), "id", "the folder name"),
    (lambda d: d["provenance"].pop("author"), "provenance.author", "the person"),
    (lambda d: d.update(provenance={"kind": "generated", "agent": "x"}), "provenance.run_id", "run id"),
    (lambda d: d.update(dtype=["fp8"]), "dtype", "one of float32"),
    (lambda d: d.update(status="great"), "status", "candidate"),
    (lambda d: d["engine"].update(base_sha="main"), "engine.base_sha", "sha"),
    (lambda d: d["engine"]["patches"][0].pop("function"), "engine.patches[0].function", "required"),
    (lambda d: d.update(colour="red"), "colour", "a known field"),
])
def test_entry_schema_errors_name_file_and_field(tmp_path, edit, field, expected):
    folder = _copy_entry(tmp_path)
    data = yaml.safe_load((folder / "entry.yaml").read_text())
    edit(data)
    (folder / "entry.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as ei:
        load_entry(folder)
    msg = str(ei.value)
    assert str(folder / "entry.yaml") in msg and f"key '{field}'" in msg and expected in msg


def test_entry_bad_yaml_and_missing_patch(tmp_path):
    folder = _copy_entry(tmp_path)
    (folder / "patch.diff").unlink()
    with pytest.raises(ConfigError, match="patch.diff"):
        load_entry(folder)
    (folder / "entry.yaml").write_text("id: [unclosed\n")
    with pytest.raises(ConfigError, match=r"entry.yaml: key '\(yaml\)'"):
        load_entry(folder)


GOOD = """---
kind: caveat
applies-to: {pattern: attention-waste, engine: diffusers, hardware: h200}
evidence: [qwen-image-drop-all-ones-mask]
confidence: medium
---
# A mask costs the fast kernel
Body text about cudnn.
"""


@pytest.mark.parametrize("old, new, field", [
    ("kind: caveat", "kind: tip", "kind"),
    ("confidence: medium", "confidence: 0.9", "confidence"),
    ("evidence: [qwen-image-drop-all-ones-mask]", "evidence: []", "evidence"),
    ("pattern: attention-waste", "pattern: speed", "applies-to.pattern"),
    ("hardware: h200", "colour: h200", "applies-to.colour"),
])
def test_lesson_schema_errors(tmp_path, old, new, field):
    f = tmp_path / "a-lesson.md"
    with pytest.raises(ConfigError) as ei:
        parse_lesson(GOOD.replace(old, new), f)
    assert str(f) in str(ei.value) and f"key '{field}'" in str(ei.value)


def test_lessons_parse_search_and_write(tmp_path):
    lesson = parse_lesson(GOOD, tmp_path / "mask-costs.md")
    assert lesson.title == "A mask costs the fast kernel" and lesson.applies("attention-waste", "diffusers", "h200")
    assert not lesson.applies("attention-waste", "sglang", None)
    write_lesson(tmp_path, "mask-costs", "caveat", {"pattern": "attention-waste", "engine": "diffusers"},
                 ["qwen-image-drop-all-ones-mask"], "high", "# Title\nwhat was tried, what happened, why")
    write_lesson(tmp_path, "other", "pattern", {"pattern": "merge-siblings"}, ["run-1"], "low", "# Merge\nqkv")
    assert [x.slug for x in search("", pattern="attention-waste", root=tmp_path)] == ["mask-costs"]
    assert [x.slug for x in search("qkv", root=tmp_path)] == ["other"]
    assert search("nothing-like-this", root=tmp_path) == []


def test_repo_lessons_load_and_cite_real_evidence():
    lessons = load_lessons()
    assert lessons, "the seed lessons are missing"
    ids = {e.id for e in load_store()}
    root = Path(__file__).resolve().parents[2]
    for lesson in lessons:
        for ev in lesson.evidence:
            if ev.startswith(("run:", "commit:")):  # written by the learn step of a run
                continue
            ev = ev.removeprefix("entry:")
            assert ev in ids or (root / ev.split("::")[0]).exists(), f"{lesson.slug}: evidence {ev!r} not found"
