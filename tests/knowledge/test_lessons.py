"""lessons/ (bot/knowledge/lessons.py): parse errors name the file and key; search; write; the
repository's lessons load and cite real evidence."""
from __future__ import annotations

import pytest

from bot.errors import ConfigError
from bot.knowledge.lessons import load_lessons, parse_lesson, search, write_lesson
from bot.knowledge.location import SHIPPED_LESSONS, SHIPPED_STORE
from bot.knowledge.store import load_store


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


def test_caveats_first_ranks_a_caveat_before_a_pattern_at_equal_score(tmp_path):
    """The agent's view (bot/knowledge/prompt.py): a known failure is the costlier thing to repeat."""
    write_lesson(tmp_path, "a-worked", "pattern", {"pattern": "merge-siblings"}, ["run-1"], "low", "# Worked\nqkv")
    write_lesson(tmp_path, "b-failed", "caveat", {"pattern": "merge-siblings"}, ["run-2"], "low", "# Failed\nqkv")
    assert [x.slug for x in search("qkv", root=tmp_path)] == ["a-worked", "b-failed"]
    assert [x.slug for x in search("qkv", root=tmp_path, caveats_first=True)] == ["b-failed", "a-worked"]


def test_repo_lessons_load_and_cite_real_evidence():
    lessons = load_lessons(SHIPPED_LESSONS)
    assert lessons, "the seed lessons are missing"
    ids = {e.id for e in load_store(SHIPPED_STORE)}
    root = SHIPPED_STORE.parent
    for lesson in lessons:
        for ev in lesson.evidence:
            if ev.startswith(("run:", "commit:")):  # written by the learn step of a run
                continue
            ev = ev.removeprefix("entry:")
            assert ev in ids or (root / ev.split("::")[0]).exists(), f"{lesson.slug}: evidence {ev!r} not found"
