"""What the knowledge tells an agent (bot/knowledge/prompt.py): the prompt's knowledge block, from
the real lesson and entry loaders, caveats first; one entry's text, never outside the store."""
from __future__ import annotations

import shutil

from bot.knowledge.lessons import write_lesson
from bot.knowledge.location import SHIPPED_STORE
from bot.generate.agent.prompts import knowledge_block
from bot.knowledge.prompt import store_entry_text


def _knowledge(tmp_path):
    store, lessons = tmp_path / "kernel_store", tmp_path / "lessons"
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", store / "flux2-swiglu")
    write_lesson(lessons, "a-worked", "pattern", {"pattern": "fuse-elementwise-chain", "engine": "diffusers"},
                 ["run:r-1"], "low", "# Worked: fused it\nTried: a fusion.")
    write_lesson(lessons, "b-failed", "caveat", {"pattern": "fuse-elementwise-chain", "hardware": "h200"},
                 ["run:r-2"], "medium", "# Failed: slower on h200\nRoot cause: slower.")
    write_lesson(lessons, "c-other", "caveat", {"pattern": "merge-siblings"}, ["run:r-3"], "high", "# Other\nqkv")
    return store, lessons


def test_the_prompt_block_lists_matching_lessons_caveats_first_then_entries(tmp_path):
    store, lessons = _knowledge(tmp_path)
    text = knowledge_block("fuse-elementwise-chain", "diffusers", "h200", lessons_dir=lessons, store_dir=store)
    assert text.index("[caveat, confidence medium] b-failed") < text.index("[pattern, confidence low] a-worked")
    assert "c-other" not in text  # another pattern
    assert "flux2-swiglu" in text and "patch.diff" in text  # the entry in full, as a worked example
    assert "b-failed" in knowledge_block("fuse-elementwise-chain", "diffusers", "h200", lessons_dir=lessons,
                                         store_dir=store, max_chars=400)  # whole items within the budget


def test_one_entrys_text(tmp_path):
    store, _ = _knowledge(tmp_path)
    text = store_entry_text("flux2-swiglu", store)
    assert text.startswith("entry.yaml:\nid: flux2-swiglu") and "\npatch.diff:\ndiff --git" in text
    assert store_entry_text("../lessons", store) == "no store entry '../lessons'"
    assert store_entry_text("nope", store) == "no store entry 'nope'"
