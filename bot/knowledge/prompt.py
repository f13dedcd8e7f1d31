"""The text of one store entry (the agent's read_store tool); a None folder means location.py's.
The knowledge block of the agent's system prompt is bot/generate/agent/prompts.knowledge_block."""
from __future__ import annotations

from pathlib import Path

from bot.knowledge.location import locate


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
