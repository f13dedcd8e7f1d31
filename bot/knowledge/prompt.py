"""What the knowledge tells an agent: the knowledge block of its system prompt and the text of one
store entry (its read_store tool). The lessons and entries come from the real loaders
(lessons.search with caveats first, store.find_entries); a None folder means location.py's.
"""
from __future__ import annotations

from pathlib import Path

from bot.knowledge.lessons import search
from bot.knowledge.location import locate
from bot.knowledge.store import find_entries


def prompt_context(pattern: str | None, engine: str | None, hardware: str | None, *, lessons_dir: Path | None = None,
                   store_dir: Path | None = None, max_chars: int = 12_000) -> str:
    """Matching lessons (caveats first), then the store entries of the pattern."""
    parts = []
    lessons = search("", pattern, engine, hardware, root=lessons_dir, caveats_first=True)
    if lessons:
        parts.append("## Lessons from earlier runs (caveats first)")
        for lesson in lessons:
            parts.append(f"### [{lesson.kind}, confidence {lesson.confidence}] {lesson.slug}\n{lesson.body}")
    entries = find_entries(pattern, engine, hardware, store_dir)
    if entries:
        parts.append("## Kernel-store entries for this pattern (validated optimizations; read_store shows a patch)")
        for e in entries:
            prov = f"{e.provenance.kind} {e.provenance.agent or e.provenance.author}".strip()
            parts.append(f"- {e.id}: {e.title} [{e.status}; {prov}; hardware {', '.join(e.hardware)}]")
    text = "\n\n".join(parts) if parts else "No lessons or store entries match this pattern, engine and hardware yet."
    return text if len(text) <= max_chars else text[:max_chars] + "\n... (truncated; use read_lessons/read_store)"


def store_entry_text(entry_id: str, store_dir: Path | None = None, max_chars: int = 30_000) -> str:
    """entry.yaml and patch.diff of one entry; an id that leaves the store is no entry."""
    root = Path(store_dir) if store_dir is not None else locate().kernel_store
    d = (root / entry_id).resolve()
    if root.resolve() not in d.parents or not (d / "entry.yaml").is_file():
        return f"no store entry {entry_id!r}"
    text = "entry.yaml:\n" + (d / "entry.yaml").read_text()
    if (d / "patch.diff").is_file():
        text += "\npatch.diff:\n" + (d / "patch.diff").read_text()
    return text[:max_chars]
