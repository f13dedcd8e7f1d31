"""The agent's tools, confined to one candidate worktree.

File tools (read_file, search, edit_file, write_file) resolve every path inside the worktree and
refuse anything that escapes it: absolute paths elsewhere, ``..``, and symlinks (a symlink is never
followed out of the worktree, and never written through). Nothing under ``.git`` can be read or
written: a hook or config written there would run in the bot's own process at commit time.
Search is a Python regex scan, never a shell.

run_correctness and run_microbenchmark snapshot the worktree as a commit and hand that commit to THE
validator (bot.validate, through bot/generate/agent/validation.py); the model reads the verdict as the
validator renders it. The candidate's code runs only in runner child processes whose environment
carries no keys. read_profile, read_lessons and read_store return text.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MAX_READ_CHARS = 60_000
MAX_SEARCH_HITS = 200
MAX_WRITE_BYTES = 2_000_000


class ToolError(Exception):
    """A tool call the agent got wrong (bad path, no match...): returned to it as an error result."""


def confine(root: Path, rel: str, *, for_write: bool = False) -> Path:
    """Resolve `rel` inside `root`; raise ToolError when it escapes, crosses a symlink or touches .git."""
    if not isinstance(rel, str) or not rel.strip():
        raise ToolError("path must be a non-empty string relative to the worktree")
    if "\x00" in rel:
        raise ToolError("path contains a NUL byte")
    root = root.resolve()
    p = Path(rel)
    if p.is_absolute():
        try:
            p = p.relative_to(root)
        except ValueError:
            raise ToolError(f"{rel}: absolute path outside the worktree") from None
    if ".git" in p.parts:
        raise ToolError(f"{rel}: the .git folder is off limits")
    # Walk component by component so a symlink anywhere on the way is caught, even one that points
    # back inside (it could be re-pointed between check and use).
    cur = root
    for part in p.parts:
        if part in ("", "."):
            continue
        if part == "..":
            raise ToolError(f"{rel}: '..' is not allowed (paths stay inside the worktree)")
        cur = cur / part
        if cur.is_symlink():
            raise ToolError(f"{rel}: {cur.relative_to(root)} is a symlink; symlinks are not followed")
    resolved = cur.resolve()
    if resolved != root and root not in resolved.parents:
        raise ToolError(f"{rel}: resolves outside the worktree")
    if for_write and resolved == root:
        raise ToolError(f"{rel}: is the worktree itself, not a file")
    return resolved


# JSON schemas the model sees (Messages API `tools`).
TOOL_SPECS: list[dict] = [
    {"name": "read_file",
     "description": "Read a text file of the engine worktree (path relative to the worktree root). "
                    "Optional 1-based start_line/end_line. Returns the lines prefixed with their numbers.",
     "input_schema": {"type": "object", "properties": {
         "path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
         "required": ["path"]}},
    {"name": "search",
     "description": "Search files of the worktree for a Python regular expression. Optional path (a folder "
                    "or file, default the whole worktree) and glob on file names (default *.py). Returns "
                    "path:line: text for up to 200 hits.",
     "input_schema": {"type": "object", "properties": {
         "pattern": {"type": "string"}, "path": {"type": "string"}, "glob": {"type": "string"}},
         "required": ["pattern"]}},
    {"name": "edit_file",
     "description": "Replace exactly one occurrence of old_text by new_text in a file of the worktree. "
                    "old_text must occur exactly once (include enough context).",
     "input_schema": {"type": "object", "properties": {
         "path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"}},
         "required": ["path", "old_text", "new_text"]}},
    {"name": "write_file",
     "description": "Create or overwrite a file of the worktree with the given content (e.g. a new Triton "
                    "kernel module). Parent folders are created.",
     "input_schema": {"type": "object", "properties": {
         "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}},
    {"name": "run_correctness",
     "description": "Validate the worktree's current state for correctness against the base engine "
                    "(several seeds and shapes, in an isolated runner process). Returns the verdict, its "
                    "reason and numbers.",
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "run_microbenchmark",
     "description": "Time the worktree's current state against the base engine (per-step latency; the "
                    "device that measured it is named). Returns the numbers and the verdict.",
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "read_profile",
     "description": "The base engine's profile of one step: total, categories and the top kernels with the "
                    "module that launched each. Optional top (default 30).",
     "input_schema": {"type": "object", "properties": {"top": {"type": "integer"}}}},
    {"name": "read_lessons",
     "description": "Lessons learned in earlier runs (what worked, what failed and why), filtered by "
                    "optional pattern (opportunity kind) and a free-text query.",
     "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}, "query": {"type": "string"}}}},
    {"name": "read_store",
     "description": "Kernel-store entries (validated optimizations) matching an optional pattern; with "
                    "entry_id, that entry's entry.yaml and patch.diff.",
     "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}, "entry_id": {"type": "string"}}}},
]


@dataclass
class ToolHooks:
    """What the non-file tools call; each returns text for the model (or raises ToolError)."""
    run_correctness: Callable[[], str]
    run_microbenchmark: Callable[[], str]
    read_profile: Callable[[int], str]
    read_lessons: Callable[[str | None, str | None], str]
    read_store: Callable[[str | None, str | None], str]


class Workspace:
    """The tools of one agent over one worktree."""

    def __init__(self, root: Path, hooks: ToolHooks):
        self.root = Path(root).resolve()
        self.hooks = hooks
        self.edits = 0  # successful edit_file/write_file calls

    def call(self, name: str, args: dict) -> tuple[str, bool]:
        """Run one tool; returns (text for the model, is_error). Never raises for the agent's mistakes."""
        fn = getattr(self, f"tool_{name}", None)
        if fn is None or name not in {t["name"] for t in TOOL_SPECS}:
            return f"unknown tool {name!r}", True
        if not isinstance(args, dict):
            return "tool input must be a JSON object", True
        try:
            out = fn(**args)
        except ToolError as e:
            return f"error: {e}", True
        except TypeError as e:
            return f"error: bad arguments for {name}: {e}", True
        return out, False

    # ---- files

    def tool_read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        p = confine(self.root, path)
        if not p.is_file():
            raise ToolError(f"{path}: no such file")
        lines = p.read_text(errors="replace").splitlines()
        a = max(1, int(start_line or 1))
        b = min(len(lines), int(end_line or len(lines)))
        out, size = [], 0
        for i in range(a, b + 1):
            line = f"{i:5d}  {lines[i - 1]}"
            size += len(line) + 1
            if size > MAX_READ_CHARS:
                out.append(f"... truncated at line {i - 1} of {len(lines)}; ask for start_line={i}")
                break
            out.append(line)
        return "\n".join(out) if out else f"{path}: empty range ({len(lines)} lines)"

    def tool_search(self, pattern: str, path: str = ".", glob: str = "*.py") -> str:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ToolError(f"bad regular expression {pattern!r}: {e}") from None
        base = confine(self.root, path) if path not in ("", ".") else self.root
        files = [base] if base.is_file() else sorted(base.rglob(glob))
        hits: list[str] = []
        for f in files:
            if ".git" in f.relative_to(self.root).parts or f.is_symlink() or not f.is_file():
                continue
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            for i, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{f.relative_to(self.root)}:{i}: {line.strip()[:200]}")
                    if len(hits) >= MAX_SEARCH_HITS:
                        return "\n".join(hits) + f"\n... stopped at {MAX_SEARCH_HITS} hits; narrow the search"
        return "\n".join(hits) if hits else "no matches"

    def tool_edit_file(self, path: str, old_text: str, new_text: str) -> str:
        p = confine(self.root, path, for_write=True)
        if not p.is_file():
            raise ToolError(f"{path}: no such file (use write_file to create one)")
        text = p.read_text()
        n = text.count(old_text) if old_text else 0
        if n != 1:
            raise ToolError(f"{path}: old_text occurs {n} times; it must occur exactly once")
        self._write(p, text.replace(old_text, new_text, 1))
        return f"edited {path} ({len(old_text)} -> {len(new_text)} characters)"

    def tool_write_file(self, path: str, content: str) -> str:
        p = confine(self.root, path, for_write=True)
        if len(content.encode()) > MAX_WRITE_BYTES:
            raise ToolError(f"{path}: content over {MAX_WRITE_BYTES} bytes")
        # Create parents one by one, re-checking confinement (no symlinked parent can be created
        # by us, but one could exist).
        parent_rel = os.path.relpath(p.parent, self.root)
        if parent_rel != ".":
            confine(self.root, parent_rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        self._write(p, content)
        return f"wrote {path} ({len(content)} characters)"

    def _write(self, p: Path, text: str) -> None:
        if p.is_symlink():
            raise ToolError(f"{p.relative_to(self.root)} is a symlink; not written")
        # O_NOFOLLOW: the final component is never followed even if it became a symlink meanwhile.
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.edits += 1

    # ---- validator, profile, knowledge

    def tool_run_correctness(self) -> str:
        return self.hooks.run_correctness()

    def tool_run_microbenchmark(self) -> str:
        return self.hooks.run_microbenchmark()

    def tool_read_profile(self, top: int = 30) -> str:
        return self.hooks.read_profile(int(top))

    def tool_read_lessons(self, pattern: str | None = None, query: str | None = None) -> str:
        return self.hooks.read_lessons(pattern, query)

    def tool_read_store(self, pattern: str | None = None, entry_id: str | None = None) -> str:
        return self.hooks.read_store(pattern, entry_id)
