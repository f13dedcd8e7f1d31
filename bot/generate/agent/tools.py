"""The agent's tools, confined to one candidate worktree.

File tools (read_file, search, edit_file, write_file) resolve every path inside the worktree and
refuse anything that escapes it: absolute paths elsewhere, ``..``, and symlinks (a symlink is never
followed out of the worktree, and never written through). Nothing under ``.git`` can be read or
written: a hook or config written there would run in the bot's own process at commit time.
Search is a Python regex scan, never a shell: its glob is a file-name pattern (no folders, no
``..``), the walk never follows a symlink, and the scan runs in a child process with a time limit, so
a catastrophic pattern cannot hang the bot. Every argument is checked against the tool's schema, and
every mistake comes back to the agent as an error result, never as an exception in the bot.

declare_kernels records the kernels the agent adds and removes and each one's test_<op>.py (a
confined path in the worktree): they become the candidate's Optbot-Adds-Kernels,
Optbot-Removes-Kernels and Optbot-Kernel-Tests trailers, so THE validator checks engagement by name
and runs the kernel tests. run_kernel_test runs a declared test against its reference as a
`kernel_test` runner job (bot/knowledge/check.run_kernel_test, the path `store check` takes).
run_correctness and run_microbenchmark snapshot the worktree as a commit and hand that commit to THE
validator (bot.validate, through bot/generate/agent/validation.py); the model reads the verdict as the
validator renders it. The candidate's code runs only in runner child processes whose environment
carries no keys. read_profile, read_lessons and read_store return text.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MAX_READ_CHARS = 60_000
MAX_SEARCH_HITS = 200
MAX_SEARCH_BYTES = 20_000_000  # text handed to one search's scanner
MAX_WRITE_BYTES = 2_000_000
SEARCH_TIMEOUT_S = 10.0
_JSON_TYPES = {"string": (str,), "integer": (int,), "array": (list,)}
MAX_DECLARED = 16  # kernels (or tests) one declaration names
_KERNEL_NAME = re.compile(r"[A-Za-z0-9_:.*@\[\]<>+-]{1,200}")  # a trailer value: no comma, space or newline
# The search's scanner: reads {"pattern", "files": [[path, text], ...], "max"} on stdin, prints the
# hits as JSON. It runs in its own process so that its time can be limited (re has no timeout).
_SCANNER = """
import json, re, sys
job = json.load(sys.stdin)
rx, hits = re.compile(job["pattern"]), []
for path, text in job["files"]:
    for i, line in enumerate(text.splitlines(), 1):
        if rx.search(line):
            hits.append(f"{path}:{i}: {line.strip()[:200]}")
            if len(hits) >= job["max"]:
                break
    if len(hits) >= job["max"]:
        break
print(json.dumps(hits))
"""


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
    {"name": "declare_kernels",
     "description": "Declare the kernels your change adds and removes, and the kernel test of each added "
                    "kernel (test_<op>.py in the worktree, beside the kernel: SHAPES with M=1 and odd sizes, "
                    "CASES [(dtype, atol, rtol)], make_inputs(shape, dtype, device, seed), reference(*inputs), "
                    "kernel(*inputs), kernel_path() -> 'triton' | 'torch'). The names go on the candidate "
                    "commit: the validator requires each added kernel to run in the step and each removed "
                    "one to be gone (on CPU, aten ops or module paths; KERNEL@MODULE_GLOB scopes a name), "
                    "and runs every declared test. A new call replaces the declaration.",
     "input_schema": {"type": "object", "properties": {
         "adds": {"type": "array", "items": {"type": "string"}},
         "removes": {"type": "array", "items": {"type": "string"}},
         "tests": {"type": "array", "items": {"type": "string"}}}}},
    {"name": "run_kernel_test",
     "description": "Run a declared kernel test (path, default every declared test) against its reference "
                    "on randomized inputs in an isolated runner process: pass/fail, the first failing case, "
                    "the worst error, and on CUDA the kernel's speedup over the reference per shape (on CPU "
                    "Triton runs under TRITON_INTERPRET=1, correctness only).",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
    {"name": "read_profile",
     "description": "The base engine's profile of one step: total, categories, the top kernels with the "
                    "module that launched each (optional top, default 30), and always every kernel row of "
                    "your opportunity's ops with the time attributed to them, however low they rank.",
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


def _check_args(name: str, args: dict) -> None:
    """The agent's arguments against the tool's JSON schema: known names, required ones present, each
    of its declared type (an integer is not a bool)."""
    schema = next(t["input_schema"] for t in TOOL_SPECS if t["name"] == name)
    props = schema.get("properties", {})
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise ToolError(f"{name}: unknown arguments {unknown}; it takes {sorted(props) or 'none'}")
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        raise ToolError(f"{name}: missing required arguments {missing}")
    for k, v in args.items():
        want = props[k].get("type")
        if v is not None and want in _JSON_TYPES and (not isinstance(v, _JSON_TYPES[want]) or isinstance(v, bool)):
            raise ToolError(f"{name}: argument {k} must be a{'n' if want in ('integer', 'array') else ''} {want}, "
                            f"got {type(v).__name__} {json.dumps(v)[:40]}")
        item = props[k].get("items", {}).get("type")
        if want == "array" and v is not None and item in _JSON_TYPES:
            bad = [x for x in v if not isinstance(x, _JSON_TYPES[item]) or isinstance(x, bool)]
            if bad:
                raise ToolError(f"{name}: argument {k} must be a list of {item}s, got {json.dumps(bad[0])[:40]}")


PROFILE_KEYS = ("device", "total_ms", "step_ms", "launches", "idle_ms", "categories", "peaks")
MAX_PROFILE_TOP = 200


def read_profile_text(profile: dict | None, top: int, opportunity_rows: list) -> str:
    """read_profile's answer: the profile's summary, its `top` kernel rows, and the opportunity's own
    rows (brief.KernelRow, from brief.kernel_rows) in full, so the agent always sees the kernels it
    works on, not only the step's heaviest."""
    if not profile:
        return "no profile is available for this run"
    keep = {k: profile.get(k) for k in PROFILE_KEYS if k in profile}
    keep["kernels"] = (profile.get("kernels") or [])[:max(1, min(top, MAX_PROFILE_TOP))]
    keep["opportunity_kernels"] = [r.to_json() for r in opportunity_rows]
    return json.dumps(keep, indent=1, default=str)


@dataclass(frozen=True)
class Declaration:
    """What declare_kernels recorded: kernel names (trailer values) and test paths relative to the
    worktree root (the engine repository's root, where Optbot-Kernel-Tests paths are read)."""
    adds: tuple[str, ...] = ()
    removes: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"adds": list(self.adds), "removes": list(self.removes), "tests": list(self.tests)}


@dataclass
class ToolHooks:
    """What the non-file tools call; each returns text for the model (or raises ToolError). The
    validator and the kernel test get the current declaration."""
    run_correctness: Callable[[Declaration], str]
    run_microbenchmark: Callable[[Declaration], str]
    read_profile: Callable[[int], str]
    read_lessons: Callable[[str | None, str | None], str]
    read_store: Callable[[str | None, str | None], str]
    run_kernel_test: Callable[[list[str]], str]


class Workspace:
    """The tools of one agent over one worktree."""

    def __init__(self, root: Path, hooks: ToolHooks):
        self.root = Path(root).resolve()
        self.hooks = hooks
        self.edits = 0  # successful edit_file/write_file calls
        self.declared = Declaration()  # the last declare_kernels call

    def call(self, name: str, args: dict) -> tuple[str, bool]:
        """Run one tool; returns (text for the model, is_error). Never raises for the agent's mistakes."""
        fn = getattr(self, f"tool_{name}", None)
        if fn is None or name not in {t["name"] for t in TOOL_SPECS}:
            return f"unknown tool {name!r}", True
        if not isinstance(args, dict):
            return "tool input must be a JSON object", True
        try:
            _check_args(name, args)
            out = fn(**args)
        except ToolError as e:
            return f"error: {e}", True
        except (TypeError, ValueError, OSError) as e:  # anything else the agent's input can cause
            return f"error: {name}: {type(e).__name__}: {e}", True
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
            re.compile(pattern)
        except re.error as e:
            raise ToolError(f"bad regular expression {pattern!r}: {e}") from None
        if not glob or "/" in glob or "\\" in glob or ".." in glob or "\x00" in glob:
            raise ToolError(f"glob {glob!r}: a file-name pattern such as *.py (no folders, no '..'); "
                            f"use path for a folder")
        base = confine(self.root, path) if path not in ("", ".") else self.root
        files, size = [], 0
        for f in ([base] if base.is_file() else self._walk(base)):
            if not fnmatch.fnmatch(f.name, glob):
                continue
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            size += len(text)
            if size > MAX_SEARCH_BYTES:
                break
            files.append([str(f.relative_to(self.root)), text])
        try:
            p = subprocess.run([sys.executable, "-I", "-c", _SCANNER], input=json.dumps(
                {"pattern": pattern, "files": files, "max": MAX_SEARCH_HITS}), capture_output=True, text=True,
                timeout=SEARCH_TIMEOUT_S, env={})
        except subprocess.TimeoutExpired:
            raise ToolError(f"search {pattern!r} ran past its time limit of {SEARCH_TIMEOUT_S:.0f} s (a pattern "
                            f"that backtracks without end?); simplify it") from None
        if p.returncode != 0:
            raise ToolError(f"search {pattern!r} failed: {p.stderr.strip()[-300:]}")
        hits = json.loads(p.stdout)
        if not hits:
            return "no matches"
        more = f"\n... stopped at {MAX_SEARCH_HITS} hits; narrow the search" if len(hits) >= MAX_SEARCH_HITS else ""
        return "\n".join(hits) + more

    def _walk(self, base: Path):
        """The regular files under `base`, never through a symlink and never into .git."""
        for d, dirs, names in os.walk(base, followlinks=False):
            dirs[:] = sorted(x for x in dirs if x != ".git" and not os.path.islink(os.path.join(d, x)))
            for n in sorted(names):
                f = Path(d) / n
                if not f.is_symlink() and f.is_file():
                    yield f

    def tool_edit_file(self, path: str, old_text: str, new_text: str) -> str:
        p = confine(self.root, path, for_write=True)
        if not p.is_file():
            raise ToolError(f"{path}: no such file (use write_file to create one)")
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            raise ToolError(f"{path}: not a text file (not UTF-8); edit_file changes text files only") from None
        n = text.count(old_text) if old_text else 0
        if n != 1:
            raise ToolError(f"{path}: old_text occurs {n} times; it must occur exactly once")
        self._write(p, text.replace(old_text, new_text, 1))
        return f"edited {path} ({len(old_text)} -> {len(new_text)} characters)"

    def tool_write_file(self, path: str, content: str) -> str:
        p = confine(self.root, path, for_write=True)
        if p.is_dir():
            raise ToolError(f"{path}: is a folder, not a file")
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
        return self.hooks.run_correctness(self.declared)

    def tool_run_microbenchmark(self) -> str:
        return self.hooks.run_microbenchmark(self.declared)

    # ---- kernels

    def tool_declare_kernels(self, adds: list | None = None, removes: list | None = None,
                             tests: list | None = None) -> str:
        adds, removes, tests = list(adds or []), list(removes or []), list(tests or [])
        for what, names in (("adds", adds), ("removes", removes), ("tests", tests)):
            if len(names) > MAX_DECLARED:
                raise ToolError(f"declare_kernels: {what} names {len(names)} items; at most {MAX_DECLARED}")
        for n in adds + removes:
            if not _KERNEL_NAME.fullmatch(n) or n.lower() == "none":
                raise ToolError(f"declare_kernels: kernel name {n!r}: one kernel, aten op or module path (letters, "
                                f"digits, _ : . * @ [ ] < > + -; no comma, space or newline)")
        if adds and not tests:
            raise ToolError("declare_kernels: every added kernel needs its kernel test: pass tests "
                            "(test_<op>.py in the worktree)")
        rels = []
        for t in tests:
            p = confine(self.root, t)
            if not (p.name.startswith("test_") and p.suffix == ".py"):
                raise ToolError(f"declare_kernels: {t}: a kernel test is a file named test_<op>.py")
            if not p.is_file():
                raise ToolError(f"declare_kernels: {t}: no such file (write the test first)")
            rel = p.relative_to(self.root).as_posix()
            if not _KERNEL_NAME.fullmatch(rel.replace("/", "")):
                raise ToolError(f"declare_kernels: {t}: the path must have no comma, space or newline")
            rels.append(rel)
        self.declared = Declaration(tuple(dict.fromkeys(adds)), tuple(dict.fromkeys(removes)),
                                    tuple(dict.fromkeys(rels)))
        d = self.declared
        return (f"declared: adds {', '.join(d.adds) or 'none'}; removes {', '.join(d.removes) or 'none'}; "
                f"kernel tests {', '.join(d.tests) or 'none'}. The validator checks these from now on (a new "
                f"declare_kernels call replaces them).")

    def tool_run_kernel_test(self, path: str | None = None) -> str:
        if not self.declared.tests:
            raise ToolError("run_kernel_test: no kernel test is declared; call declare_kernels with tests first")
        if path is None:
            return self.hooks.run_kernel_test(list(self.declared.tests))
        rel = confine(self.root, path).relative_to(self.root).as_posix()
        if rel not in self.declared.tests:
            raise ToolError(f"run_kernel_test: {path} is not a declared kernel test "
                            f"(declared: {', '.join(self.declared.tests)})")
        return self.hooks.run_kernel_test([rel])

    def tool_read_profile(self, top: int = 30) -> str:
        return self.hooks.read_profile(int(top))

    def tool_read_lessons(self, pattern: str | None = None, query: str | None = None) -> str:
        return self.hooks.read_lessons(pattern, query)

    def tool_read_store(self, pattern: str | None = None, entry_id: str | None = None) -> str:
        return self.hooks.read_store(pattern, entry_id)
