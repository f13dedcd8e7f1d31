"""kernel_store/<entry-id>/: one reusable optimization per folder (docs/store.md).

    entry.yaml     what it is and where it applies (parsed into Entry below)
    patch.diff     against the engine at engine.base_sha; applies with `git apply --3way`
    <op>.py        kernel sources: Triton kernel(s) + torch reference (byte-identical to the file
                   the patch adds to the engine, so the tested kernel is the one the engine runs)
    test_<op>.py   the kernel test contract: reference(*inputs), kernel(*inputs),
                   make_inputs(shape, dtype, device, seed), SHAPES, CASES [(dtype, atol, rtol)]
    production     (in entry.yaml) the engine pull requests that merged it: [{repo, pr, merge_sha,
                   merged_at}], written by `optbot lessons review` (bot/knowledge/review.py)
    bench.json     micro and end-to-end numbers with their environment (only measured numbers;
                   typed in records.py)

Where the store is comes from location.py: a `root` of None below means its kernel_store.
"""
from __future__ import annotations

import hashlib

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bot.errors import ConfigError, OptbotError
from bot.knowledge import OPPORTUNITY_KINDS
from bot.knowledge.location import locate
from bot.knowledge.records import Bench, bench_file, load_bench
from runner.job import PRECISIONS

# retired: the nightly `store check --propose` found that the entry no longer applies to the engine's
# tip, or no longer wins there and has no config space to re-tune (docs/store.md); replay skips it
# and says why (entry.yaml `retired:`).
STATUSES = ("candidate", "validated-cpu", "validated-gpu", "rejected", "retired")
UNUSABLE = ("rejected", "retired")  # statuses replay, the agent's knowledge and find_entries leave out
PROVENANCE_KINDS = ("authored", "generated")
DTYPES = PRECISIONS  # an entry may be for a quantized precision (bfloat16+fp8): what an FP8 run learns
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class PatchedSite:
    file: str  # path inside the engine repository
    function: str  # function / method (Class.method) the patch changes


@dataclass(frozen=True)
class EngineRef:
    name: str  # engine name as the workloads spell it: diffusers | sglang
    source: str  # e.g. pypi-sdist:diffusers==0.42.1
    base_sha: str  # the commit patch.diff was made against
    patches: tuple[PatchedSite, ...]


@dataclass(frozen=True)
class Provenance:
    kind: str  # authored | generated
    author: str = ""  # a person (authored)
    agent: str = ""  # generator/agent name (generated)
    run_id: str = ""  # the optbot run that produced it (generated)
    date: str = ""


@dataclass(frozen=True)
class Production:
    """A merged pull request of the bot that carried this entry: it is in that engine's code."""
    repo: str  # owner/name
    pr: int
    merge_sha: str
    merged_at: str  # ISO 8601, as GitHub reports it


@dataclass(frozen=True)
class Retirement:
    """Why an entry was retired (entry.yaml `retired:`, required with status: retired)."""
    reason: str  # e.g. "patch does not apply at 1a2b3c4d5e6f: conflicts in src/.../transformer_flux2.py"
    engine_sha: str = ""  # the engine commit it was checked against
    date: str = ""
    by: str = ""  # the command that retired it


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    pattern: str  # opportunity kind
    engine: EngineRef
    workloads: tuple[str, ...]
    shapes: tuple[dict, ...]  # workload shapes it was made for ({} = the workload's own)
    hardware: tuple[str, ...]  # e.g. ("cpu", "h200"): where it is meant to run
    dtypes: tuple[str, ...]
    status: str
    provenance: Provenance
    adds_kernels: tuple[str, ...]  # names the validator's engagement check looks for in the profile
    removes_kernels: tuple[str, ...]  # names that must be gone from the patched step's profile
    config_space: dict[str, list] = field(default_factory=dict)  # Triton configs for variant search
    description: str = ""
    path: Path = Path()
    production: tuple[Production, ...] = ()
    retired: Retirement | None = None
    # entries whose changes this one includes (entry.yaml `supersedes:`): their patches conflict with
    # this one, so replay offers them only when this one is not offered (docs/store.md)
    supersedes: tuple[str, ...] = ()
    # production modes the upstream engine cannot run at the entry's precision and the patch makes run
    # (entry.yaml `enables:`): replay offers such an entry wherever the run checks one of those modes at
    # one of its dtypes, with no profile finding (a step that fails to compile has none to show); the
    # validator decides (a mode that fails for the base and runs for the candidate: docs/validate.md)
    enables: tuple[str, ...] = ()

    @property
    def patch_path(self) -> Path:
        return self.path / "patch.diff"

    @property
    def bench_path(self) -> Path:
        return bench_file(self.path)

    def test_files(self) -> list[Path]:
        return sorted(self.path.glob("test_*.py"))

    def kernel_files(self) -> list[Path]:
        return sorted(p for p in self.path.glob("*.py") if not p.name.startswith("test_"))

    def bench(self) -> Bench:
        """bench.json (records.py); an empty one naming the entry when the file does not exist yet."""
        return load_bench(self.path)

    def matches(self, kind: str | None, engine: str | None = None, hardware: str | None = None) -> bool:
        return ((kind is None or self.pattern == kind) and (engine is None or self.engine.name == engine)
                and (hardware is None or hardware in self.hardware or "any" in self.hardware))


# ---------------------------------------------------------------------------------------------
# parsing helpers: every error names the file and the dotted field


def _req(d: dict, key: str, file: Path, prefix: str = "", typ=str, expected: str = "") -> Any:
    dotted = f"{prefix}{key}"
    if key not in d or d[key] is None:
        raise ConfigError(file, dotted, None, f"{expected or typ.__name__} (field is required)")
    v = d[key]
    if typ is not None and not isinstance(v, typ):
        raise ConfigError(file, dotted, v, expected or typ.__name__)
    return v


def _str_list(d: dict, key: str, file: Path, prefix: str = "", required: bool = True, choices=None) -> tuple[str, ...]:
    dotted = f"{prefix}{key}"
    v = d.get(key)
    if v is None:
        if required:
            raise ConfigError(file, dotted, None, "a list of strings (field is required)")
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(file, dotted, v, "a list of strings")
    if choices is not None:
        for x in v:
            if x not in choices:
                raise ConfigError(file, dotted, x, f"one of {', '.join(choices)}")
    return tuple(v)


def _choice(d: dict, key: str, file: Path, choices, prefix: str = "") -> str:
    v = _req(d, key, file, prefix, str, f"one of {', '.join(choices)}")
    if v not in choices:
        raise ConfigError(file, f"{prefix}{key}", v, f"one of {', '.join(choices)}")
    return v


def parse_entry(data: Any, file: Path) -> Entry:
    if not isinstance(data, dict):
        raise ConfigError(file, "(top level)", type(data).__name__, "a mapping of entry fields")
    known = {"id", "title", "pattern", "engine", "workloads", "shapes", "hardware", "dtype", "status",
             "provenance", "kernels", "config_space", "description", "production", "retired", "supersedes",
             "enables"}
    for k in data:
        if k not in known:
            raise ConfigError(file, str(k), data[k], f"a known field ({', '.join(sorted(known))})")
    eid = _req(data, "id", file)
    if not ID_RE.match(eid):
        raise ConfigError(file, "id", eid, "lowercase letters, digits, '.', '_' or '-'")
    if file.parent.name != eid:
        raise ConfigError(file, "id", eid, f"the folder name {file.parent.name!r}")
    pattern = _choice(data, "pattern", file, OPPORTUNITY_KINDS)
    eng = _req(data, "engine", file, typ=dict, expected="a mapping with name, source, base_sha, patches")
    patches_raw = _req(eng, "patches", file, "engine.", list, "a list of {file, function}")
    if not patches_raw:
        raise ConfigError(file, "engine.patches", patches_raw, "at least one {file, function}")
    sites = []
    for i, p in enumerate(patches_raw):
        pre = f"engine.patches[{i}]."
        if not isinstance(p, dict):
            raise ConfigError(file, pre[:-1], p, "a mapping {file, function}")
        sites.append(PatchedSite(_req(p, "file", file, pre), _req(p, "function", file, pre)))
    base_sha = _req(eng, "base_sha", file, "engine.")
    if not re.fullmatch(r"[0-9a-f]{7,40}", base_sha):
        raise ConfigError(file, "engine.base_sha", base_sha, "a git commit sha (hex)")
    engine = EngineRef(_req(eng, "name", file, "engine."), _req(eng, "source", file, "engine."), base_sha, tuple(sites))
    shapes = data.get("shapes") or []
    if not isinstance(shapes, list) or not all(isinstance(s, dict) for s in shapes):
        raise ConfigError(file, "shapes", shapes, "a list of shape mappings ({resolution, text_tokens, batch})")
    prov = _req(data, "provenance", file, typ=dict, expected="a mapping with kind (authored | generated)")
    pkind = _choice(prov, "kind", file, PROVENANCE_KINDS, "provenance.")
    provenance = Provenance(pkind, str(prov.get("author", "")), str(prov.get("agent", "")),
                            str(prov.get("run_id", "")), str(prov.get("date", "")))
    if pkind == "authored" and not provenance.author:
        raise ConfigError(file, "provenance.author", None, "the person who wrote it (authored entries)")
    if pkind == "generated" and not provenance.run_id:
        raise ConfigError(file, "provenance.run_id", None, "the run id that generated it (generated entries)")
    kernels = data.get("kernels") or {}
    if not isinstance(kernels, dict):
        raise ConfigError(file, "kernels", kernels, "a mapping {adds: [...], removes: [...]}")
    cs = data.get("config_space") or {}
    if not isinstance(cs, dict) or not all(isinstance(v, list) and v for v in cs.values()):
        raise ConfigError(file, "config_space", cs, "a mapping name -> non-empty list of values")
    status = _choice(data, "status", file, STATUSES)
    retired = None
    if status == "retired" or data.get("retired") is not None:
        r = _req(data, "retired", file, typ=dict, expected="a mapping {reason, engine_sha, date, by} (status: retired)")
        retired = Retirement(_req(r, "reason", file, "retired."), str(r.get("engine_sha", "")),
                             str(r.get("date", "")), str(r.get("by", "")))
        if status != "retired":
            raise ConfigError(file, "status", status, "retired (the entry has a `retired:` reason)")
    return Entry(
        production=_production(data.get("production"), file),
        id=eid, title=str(data.get("title", eid)), pattern=pattern, engine=engine,
        workloads=_str_list(data, "workloads", file), shapes=tuple(shapes),
        hardware=_str_list(data, "hardware", file), dtypes=_str_list(data, "dtype", file, choices=DTYPES),
        status=status, provenance=provenance,
        adds_kernels=_str_list(kernels, "adds", file, "kernels.", required=False),
        removes_kernels=_str_list(kernels, "removes", file, "kernels.", required=False),
        config_space=cs, description=str(data.get("description", "")).strip(), path=file.parent,
        retired=retired, supersedes=_supersedes(data, eid, file), enables=_enables(data, file),
    )


def _enables(data: dict, file: Path) -> tuple[str, ...]:
    from runner.job import parse_mode

    modes = _str_list(data, "enables", file, required=False)
    for i, m in enumerate(modes):
        try:
            parse_mode(m)
        except ValueError as e:
            raise ConfigError(file, f"enables[{i}]", m, str(e).split(": ", 1)[1]) from None
        if m == "eager":
            raise ConfigError(file, f"enables[{i}]", m, "a mode other than eager (the base always runs eager: "
                                                        "nothing to enable there)")
    return modes


def _supersedes(data: dict, eid: str, file: Path) -> tuple[str, ...]:
    ids = _str_list(data, "supersedes", file, required=False)
    for i, other in enumerate(ids):
        if not ID_RE.match(other) or other == eid:
            raise ConfigError(file, f"supersedes[{i}]", other, "the id of another entry (not this one)")
    return ids


def _production(v: Any, file: Path) -> tuple[Production, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(p, dict) for p in v):
        raise ConfigError(file, "production", v, "a list of {repo, pr, merge_sha, merged_at}")
    out = []
    for i, p in enumerate(v):
        pre = f"production[{i}]."
        repo = _req(p, "repo", file, pre)
        if not re.fullmatch(r"[A-Za-z0-9-]+/[A-Za-z0-9._-]+", repo):
            raise ConfigError(file, pre + "repo", repo, "owner/name")
        pr = _req(p, "pr", file, pre, int, "a pull request number")
        sha = _req(p, "merge_sha", file, pre)
        if not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise ConfigError(file, pre + "merge_sha", sha, "a git commit sha (40 hex)")
        out.append(Production(repo, pr, sha, str(_req(p, "merged_at", file, pre))))
    return tuple(out)


def load_entry(folder: Path) -> Entry:
    folder = Path(folder)
    file = folder / "entry.yaml"
    if not file.is_file():
        raise ConfigError(file, "(file)", None, "an entry.yaml in every kernel_store/<entry-id>/ folder")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(file, "(yaml)", str(e).splitlines()[0], "valid YAML") from None
    entry = parse_entry(data, file)
    if not entry.patch_path.is_file():
        raise ConfigError(entry.patch_path, "(file)", None, "patch.diff next to entry.yaml")
    return entry


def _root(root: Path | None) -> Path:
    return Path(root) if root is not None else locate().kernel_store


def load_store(root: Path | None = None) -> list[Entry]:
    root = _root(root)
    if not root.is_dir():
        return []
    entries = [load_entry(d) for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith((".", "_"))]
    # a superseded id need not be here (a knowledge repository may hold some of the entries); two that
    # are here cannot supersede each other (neither would be offered)
    by_id = {e.id: e for e in entries}
    for e in entries:
        for i, other in enumerate(e.supersedes):
            if other in by_id and e.id in by_id[other].supersedes:
                raise ConfigError(e.path / "entry.yaml", f"supersedes[{i}]", other,
                                  f"an entry that does not itself supersede {e.id}")
    return entries


def get_entry(entry_id: str, root: Path | None = None) -> Entry:
    root = _root(root)
    folder = root / entry_id
    if not folder.is_dir():
        known = [e.id for e in load_store(root)]
        raise OptbotError(f"kernel store {root}: no entry {entry_id!r} (entries: {', '.join(known) or 'none'})")
    return load_entry(folder)


def find_entries(kind: str | None, engine: str | None = None, hardware: str | None = None,
                 root: Path | None = None, include_rejected: bool = False) -> list[Entry]:
    """Retrieval by pattern, engine and hardware (the replay generator's and the agent's query);
    None asks nothing about that condition. Rejected and retired entries only when asked for."""
    return [e for e in load_store(root) if e.matches(kind, engine, hardware)
            and (include_rejected or e.status not in UNUSABLE)]


# A store kernel file's switch for torch.compile (docs/store.md): the line every kernel file holds,
# and the line the replay writes where the kernel should step aside for inductor.
UNDER_COMPILE_OP = 'UNDER_COMPILE = "op"'
UNDER_COMPILE_REFERENCE = 'UNDER_COMPILE = "reference"'


def patch_added_files(patch_text: str) -> list[str]:
    """Paths of the files a unified diff creates (``--- /dev/null``)."""
    out, prev_null = [], False
    for line in patch_text.splitlines():
        if line.startswith("--- "):
            prev_null = line.strip() == "--- /dev/null"
        elif line.startswith("+++ ") and prev_null:
            path = line[4:].strip()
            out.append(path[2:] if path.startswith("b/") else path)
            prev_null = False
    return out


def added_file_content(patch_text: str, path: str) -> str | None:
    """The full content of a file the patch creates, rebuilt from its '+' lines."""
    lines = patch_text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("+++ ") and line[4:].strip() in (f"b/{path}", path) and i and lines[i - 1].strip() == "--- /dev/null":
            body = []
            for ln in lines[i + 1:]:
                if ln.startswith("diff --git") or ln.startswith("--- "):
                    break
                if ln.startswith("+"):
                    body.append(ln[1:])
                elif ln.startswith("\\"):
                    if body:
                        body[-1] = body[-1].rstrip("\n")
            return "".join(body)
    return None


def replace_added_file(patch_text: str, path: str, content: str) -> str:
    """`patch_text` with the file it creates at `path` rewritten to `content`: the hunk's lines, its
    `@@ -0,0 +1,N @@` header and the `index` line's blob id (what `git diff` writes for that content),
    everything else byte for byte. A kernel source edited in its entry folder goes back into patch.diff
    this way (`optbot store sync-sources`; `store check` demands the two be identical)."""
    lines = patch_text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("+++ ") and line[4:].strip() in (f"b/{path}", path) and i and lines[i - 1].strip() == "--- /dev/null":
            end = i + 1
            while end < len(lines) and not lines[end].startswith("diff --git"):
                end += 1
            body = content.splitlines(keepends=True)
            hunk = [f"@@ -0,0 +1{'' if len(body) == 1 else f',{len(body)}'} @@\n"] if body else []
            hunk += ["+" + ln for ln in body]
            if body and not body[-1].endswith("\n"):
                hunk[-1] += "\n"
                hunk.append("\\ No newline at end of file\n")
            head = lines[:i + 1]
            for j in range(i - 1, max(i - 5, -1), -1):  # the index line of this file's header
                if head[j].startswith("index 0000000.."):
                    blob = hashlib.sha1(b"blob %d\0" % len(content.encode()) + content.encode()).hexdigest()
                    head[j] = re.sub(r"^index 0000000\.\.[0-9a-f]+", f"index 0000000..{blob[:7]}", head[j])
                    break
            return "".join(head + hunk + lines[end:])
    raise ValueError(f"the patch creates no file {path}")


def sync_sources(entry: "Entry") -> list[str]:
    """Write the entry's kernel sources back into its patch.diff (`optbot store sync-sources`): each
    file's new-file hunk rewritten from the folder's copy where they differ. Returns the files rewritten."""
    patch = entry.patch_path.read_text()
    added, changed = patch_added_files(patch), []
    for src in entry.kernel_files():
        targets = [p for p in added if Path(p).name == src.name]
        if not targets:
            raise ConfigError(entry.patch_path, "kernel sources", src.name,
                              "patch.diff adds no file of this name: add it to the patch by hand")
        content = src.read_text()
        if added_file_content(patch, targets[0]) != content:
            patch = replace_added_file(patch, targets[0], content)
            changed.append(src.name)
    if changed:
        entry.patch_path.write_text(patch)
    return changed


def set_status(entry_dir: Path, status: str) -> None:
    """Rewrite only the `status:` line of entry.yaml (the rest stays as the author wrote it)."""
    if status not in STATUSES:
        raise ValueError(f"entry status {status!r} not in {STATUSES}")
    f = Path(entry_dir) / "entry.yaml"
    f.write_text(re.sub(r"(?m)^status:.*$", f"status: {status}", f.read_text(), count=1))
