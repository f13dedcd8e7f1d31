"""Learning: after validation, turn outcomes into knowledge the next run starts from.

- An accepted candidate becomes a kernel_store entry (entry.yaml, patch.diff, the kernel sources it
  adds, bench.json with the numbers that accepted it) with provenance "generated" by its generator in
  this run, and a *pattern* lesson.
- Every rejected attempt becomes a *caveat* lesson whose body gives its root cause, taken from the
  verdict's reason and numbers.
- Retrieval by pattern (opportunity kind), engine and hardware feeds the next run's matching and the
  agent's prompt (``prompt_context``).

Formats are the store helper's (bot/knowledge on branch `store`, DESIGN "Formats"); where that
package is importable its loaders are used for reading, else the small readers below.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bot.paths import REPO_ROOT

STORE_DIR = REPO_ROOT / "kernel_store"
LESSONS_DIR = REPO_ROOT / "lessons"


@dataclass
class Outcome:
    """One validated attempt, whatever generated it."""
    candidate_id: str
    kind: str  # opportunity kind (pattern)
    generator: str  # e.g. agent/fuse, compile-region, variant-search
    run_id: str
    status: str  # accepted | rejected | held | error
    reason: str
    numbers: dict
    device: str  # what measured it: cpu | cuda
    hardware: str  # cpu | h200 | ...
    engine: str  # engine name: diffusers | sglang
    engine_source: str
    base_sha: str
    commit_sha: str
    title: str
    patch: str  # unified diff against base_sha
    changed_files: list[str] = field(default_factory=list)
    added_files: dict[str, str] = field(default_factory=dict)  # path -> content of files the patch adds
    workload: str = ""
    shapes: list[dict] = field(default_factory=list)
    dtype: str = ""
    adds_kernels: list[str] = field(default_factory=list)
    removes_kernels: list[str] = field(default_factory=list)
    validated_by: str = ""
    entry_id: str = ""  # the kernel_store entry this candidate replays (Optbot-Entry), if any
    verdict: dict = field(default_factory=dict)  # the validator's whole Verdict (bot/validate/verdict.py) as JSON
    config: str = ""  # variant search: the config the commit sets (Optbot-Config)
    command: str = ""  # the command of the run, for provenance


@dataclass
class Learned:
    entry_dir: Path | None
    lesson_path: Path | None
    history: Path | None = None  # bench.json of a replayed entry that got this run's verdict


def hardware_name(device: str, device_name: str = "") -> str:
    if not device.startswith("cuda"):
        return "cpu"
    m = re.search(r"\b([A-Z]\d{2,3}[A-Z]?)\b", device_name or "")
    return m[1].lower() if m else (re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "cuda")


def _slug(*parts: str) -> str:
    s = "-".join(p for p in parts if p)
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", s.lower())).strip("-")[:90]


def _run_tag(run_id: str) -> str:
    """The unique tail of a run id (bot/paths.new_run_dir: <date>-<time>-<kind>-<uuid6>)."""
    return run_id.rsplit("-", 1)[-1][:12] or "run"


# Root causes: a verdict reason's first word -> why it failed, in words a reader (and the agent) can act on.
ROOT_CAUSES = {
    "correctness": "the candidate computes something different from the base: its outputs left the tolerance",
    "crashed": "the candidate's code raised or killed the process (see the log tail)",
    "timeout": "the candidate ran past the job's time limit (a hang, or far slower work)",
    "slower": "the candidate is correct but slower than the base",
    "no change": "the candidate is correct but its speed is inside the measurement noise",
    "not engaged": "the candidate's kernels did not run inside the step (dead code or wrong call path)",
    "implausible": "the speedup is beyond what the hardware allows; held for a person",
}


def root_cause(reason: str) -> str:
    r = reason.lower().replace("-", " ")  # verdict reasons spell "no-change", "not-engaged"
    for key, why in ROOT_CAUSES.items():
        if r.startswith(key) or f"{key}:" in r:
            return why
    return "see the verdict's reason"


def learn(outcome: Outcome, *, store_dir: Path | None = None, lessons_dir: Path | None = None) -> Learned:
    store_dir = Path(store_dir or STORE_DIR)
    lessons_dir = Path(lessons_dir or LESSONS_DIR)
    entry_dir = None
    if outcome.entry_id and (store_dir / outcome.entry_id / "entry.yaml").is_file():
        # A stored entry, replayed (or re-tuned): its verdict joins the entry's history rather than
        # becoming a second copy of the same patch. Only a failure is news worth a lesson.
        if outcome.generator == "variant-search":
            adopt_variant(outcome, store_dir / outcome.entry_id)
        history = record_history(outcome, store_dir / outcome.entry_id)
        lesson = None if outcome.status == "accepted" else write_outcome_lesson(outcome, lessons_dir, outcome.entry_id)
        return Learned(None, lesson, history)
    if outcome.status == "accepted":
        entry_dir = write_entry(outcome, store_dir)
    lesson = write_outcome_lesson(outcome, lessons_dir, entry_dir.name if entry_dir else "")
    return Learned(entry_dir, lesson)


def check_lesson(entry, workload: str, hardware: str, w: dict, command: str, lessons_dir: Path | None = None) -> Path | None:
    """A store entry re-validated on a GPU (`store check --record`, `store record-bench`): a rejection
    becomes a caveat lesson, one file per entry, workload and hardware, rewritten by each record;
    an acceptance removes that caveat (the knowledge it held is out of date)."""
    from bot.knowledge.lessons import write_lesson

    lessons_dir = Path(lessons_dir or LESSONS_DIR)
    slug = _slug(entry.id, "on", hardware, workload)
    file = lessons_dir / f"{slug}.md"
    if w.get("status") == "accepted":
        if file.is_file():
            file.unlink()
        return None
    eager = (w.get("speed") or {}).get("eager") or {}
    graph = (w.get("speed") or {}).get("graph") or {}
    worst = w.get("worst_output") or {}

    def ms(x):
        return "n/a" if x is None else f"{x:.1f}"

    speed = (f"eager {eager.get('speedup')}x (base {ms(eager.get('base_step_ms'))} -> {ms(eager.get('patched_step_ms'))} ms "
             f"per step, A/A noise {eager.get('noise_pct')}%)" if eager else "no speed measured")
    if graph.get("speedup"):
        speed += f", CUDA graph {graph['speedup']}x"
    reason = f"{w.get('reason') or w.get('status')}: {w.get('summary', '')}"
    body = (f"# {entry.id} on {hardware} ({workload}): {w.get('reason') or w.get('status')}\n\n"
            f"Tried: the entry's patch on the {w.get('preset')} preset ({w.get('dtype')}), base "
            f"{(w.get('base_sha') or '')[:12]}, re-validated by `{command}`.\n\n"
            f"Happened: {w.get('status')} ({w.get('reason')}): {speed}; worst output rel L2 {worst.get('rel_l2')}.\n\n"
            f"Root cause: {root_cause(reason)}. Replay skips this entry on {hardware} at this base while the "
            f"patch, torch and triton are unchanged (bench.json gpu.validation; `optimize --revalidate` measures "
            f"again).\n")
    applies = {"pattern": entry.pattern, "engine": entry.engine.name, "hardware": hardware}
    evidence = [f"entry:{entry.id}", f"kernel_store/{entry.id}/bench.json"]
    return write_lesson(lessons_dir, slug, "caveat", applies, evidence, "high", body)


def read_bench(entry_dir: Path) -> dict:
    """An entry's bench.json (a new one names the entry)."""
    f = entry_dir / "bench.json"
    return json.loads(f.read_text()) if f.is_file() else {"entry": entry_dir.name}


def write_bench(entry_dir: Path, bench: dict) -> Path:
    f = entry_dir / "bench.json"
    f.write_text(json.dumps(bench, indent=2, default=str) + "\n")
    return f


def adopt_variant(o: Outcome, entry_dir: Path) -> None:
    """A tuned config found by variant search (a commit = the entry's patch with new kernel defaults).
    Accepted on a GPU: the entry adopts it (patch.diff and its kernel sources become the variant's),
    so the next run replays the tuned entry; either way the search is recorded per hardware against
    the entry's patch (`gpu.variant_search`), so the next run does not search the same space again."""
    if not o.device.startswith("cuda"):
        return
    bench = read_bench(entry_dir)
    adopted = o.status == "accepted" and bool(o.patch.strip())
    if adopted:
        sources = {p.name for p in entry_dir.glob("*.py") if not p.name.startswith("test_")}
        for path, content in o.added_files.items():
            if Path(path).name in sources:  # the tested kernel source must stay the file the patch adds
                (entry_dir / Path(path).name).write_text(content)
        (entry_dir / "patch.diff").write_text(o.patch if o.patch.endswith("\n") else o.patch + "\n")
    env = o.verdict.get("env") or {}
    record_search(entry_dir, o.hardware, {"run_id": o.run_id, "config": o.config, "status": o.status,
                                          "reason": o.reason, "adopted": adopted, "torch": env.get("torch"),
                                          "triton": env.get("triton")}, bench)


def record_search(entry_dir: Path, hardware: str, record: dict, bench: dict | None = None) -> Path:
    """A finished variant search of the entry on `hardware`, in bench.json `gpu.variant_search`, tied
    to the entry's patch as it is now (after any adoption): a later run with the same patch, torch
    and triton does not search again (bot/knowledge/recall.searched). `record`: run_id, config,
    status (accepted | rejected | kept), reason, adopted, torch, triton."""
    from bot.knowledge.known import patch_file_sha256

    bench = read_bench(entry_dir) if bench is None else bench
    bench.setdefault("gpu", {}).setdefault("variant_search", {})[hardware] = {
        **record, "patch_sha256": patch_file_sha256(entry_dir / "patch.diff"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return write_bench(entry_dir, bench)


def record_gpu_verdict(o: Outcome, entry_dir: Path, bench: dict) -> None:
    """A verdict measured on a GPU goes into bench.json `gpu.validation` in the format `store check
    --record` writes, so the next run can reuse it (bot/knowledge/known.py) when nothing changed.
    A rejected variant's verdict is about another patch than the entry's: not recorded there."""
    if not (o.device.startswith("cuda") and o.verdict.get("status") and o.workload):
        return
    if o.generator == "variant-search" and o.status != "accepted":
        return
    vs = ((bench.get("gpu") or {}).get("variant_search") or {}).get(o.hardware) or {}
    if o.generator == "replay" and vs.get("run_id") == o.run_id and vs.get("adopted"):
        return  # this run's tuned variant replaced the patch the plain replay was validated on
    from bot.knowledge.known import patch_file_sha256, validation_numbers

    w = validation_numbers(o.verdict)
    w["patch_sha256"] = patch_file_sha256(entry_dir / "patch.diff")
    bench.setdefault("gpu", {})["validation"] = {
        "command": o.command or f"optbot optimize (run {o.run_id})", "run_id": o.run_id,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": o.device,
        "workloads": {o.workload: w}}


def record_ablation(entry_dir: Path, workload: str, record: dict) -> Path:
    """The stack's leave-one-out, measured on a GPU, kept in each member entry's bench.json
    `gpu.ablation[workload]` (the whole stack's rows, so any member answers for it): a later run with
    the same stack reuses it (bot/knowledge/known.known_ablation)."""
    bench = read_bench(entry_dir)
    bench.setdefault("gpu", {}).setdefault("ablation", {})[workload] = {
        **record, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return write_bench(entry_dir, bench)


def record_history(o: Outcome, entry_dir: Path) -> Path:
    """Append this run's verdict on a stored entry to its bench.json `history` (one row per run and
    generator: a resumed run rewrites its own row)."""
    bench = read_bench(entry_dir)
    rows = [r for r in bench.get("history", []) if not (r.get("run_id") == o.run_id and r.get("generator") == o.generator)]
    rows.append({"run_id": o.run_id, "generator": o.generator, "status": o.status, "reason": o.reason,
                 "device": o.device, "hardware": o.hardware, "workload": o.workload, "dtype": o.dtype,
                 "base_sha": o.base_sha, "engine_sha": o.commit_sha, "numbers": o.numbers,
                 "validated_by": o.validated_by, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    bench["history"] = rows
    record_gpu_verdict(o, entry_dir, bench)
    return write_bench(entry_dir, bench)


def write_entry(o: Outcome, store_dir: Path) -> Path:
    eid = _slug("gen", o.kind, _run_tag(o.run_id), o.commit_sha[:8])
    d = store_dir / eid
    if d.exists():
        shutil.rmtree(d)  # the same commit learned twice (a resumed run): rewrite, never duplicate
    d.mkdir(parents=True)
    on_gpu = o.device.startswith("cuda")
    entry = {
        "id": eid,
        "title": o.title,
        "pattern": o.kind,
        "engine": {"name": o.engine, "source": o.engine_source, "base_sha": o.base_sha,
                   "patches": [{"file": f, "function": _functions_touched(o.patch, f)} for f in o.changed_files]
                   or [{"file": "(none)", "function": "(none)"}]},
        "workloads": [o.workload] if o.workload else [],
        "shapes": o.shapes,
        "hardware": [o.hardware],
        "dtype": [o.dtype] if o.dtype else [],
        "status": "validated-gpu" if on_gpu else "validated-cpu",
        "provenance": {"kind": "generated", "agent": o.generator, "run_id": o.run_id,
                       "date": time.strftime("%Y-%m-%d", time.gmtime())},
        "kernels": {"adds": o.adds_kernels, "removes": o.removes_kernels},
        "description": f"Generated by {o.generator} in run {o.run_id} (engine commit {o.commit_sha[:12]}); "
                       f"validated on {o.device}: {o.reason}",
    }
    (d / "entry.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))
    (d / "patch.diff").write_text(o.patch if o.patch.endswith("\n") else o.patch + "\n")
    for path, content in o.added_files.items():
        if path.endswith(".py"):
            (d / Path(path).name).write_text(content)
    bench = {"validated_by": o.validated_by, "device": o.device, "hardware": o.hardware, "verdict": o.status,
             "reason": o.reason, "numbers": o.numbers, "engine_sha": o.commit_sha, "base_sha": o.base_sha,
             "run_id": o.run_id}
    record_gpu_verdict(o, d, bench)
    write_bench(d, bench)
    return d


def _functions_touched(patch: str, file: str) -> str:
    """The function names git puts in the hunk headers of `file` (@@ ... @@ def name)."""
    names, in_file = [], False
    for line in patch.splitlines():
        if line.startswith("diff --git"):
            in_file = line.endswith(f" b/{file}")
        elif in_file and line.startswith("@@"):
            m = re.search(r"@@.*@@\s*(?:async\s+)?(?:def|class)\s+(\w+)", line)
            if m and m[1] not in names:
                names.append(m[1])
    return ", ".join(names) or "(module level)"


def write_outcome_lesson(o: Outcome, lessons_dir: Path, entry_id: str = "") -> Path:
    accepted = o.status == "accepted"
    kind = "pattern" if accepted else "caveat"
    slug = _slug(o.kind, kind, o.generator, _run_tag(o.run_id), o.commit_sha[:8])
    skip = {"log_tail", "run_dir", "candidate_sha", "commit", "reused_for"}  # paths and shas: in evidence / bench.json
    nums = ", ".join(f"{k}={v}" for k, v in o.numbers.items() if not isinstance(v, (list, dict)) and k not in skip)
    tried = f"{o.title} ({o.generator}; files: {', '.join(o.changed_files) or 'none'})"
    if accepted:
        body = (f"# Worked: {o.title}\n\n"
                f"Tried: {tried}.\n\n"
                f"Happened: accepted on {o.device} ({o.hardware}): {o.reason}." + (f" Numbers: {nums}." if nums else "") + "\n\n"
                f"Why it holds: validated by {o.validated_by or 'the validator'}; reusable as kernel_store entry "
                f"`{entry_id}`.\n")
        confidence = "medium" if o.device.startswith("cuda") else "low"
    else:
        failures = o.numbers.get("failures") or []
        detail = ("\n".join(f"- {f}" for f in failures[:5]) + "\n\n") if failures else ""
        body = (f"# Failed: {o.title}\n\n"
                f"Tried: {tried}.\n\n"
                f"Happened: {o.status} on {o.device} ({o.hardware}): {o.reason}." + (f" Numbers: {nums}." if nums else "") + "\n\n"
                + detail +
                f"Root cause: {root_cause(o.reason)}.\n")
        confidence = "medium"
    evidence = [f"run:{o.run_id}", f"commit:{o.commit_sha[:12]}"] + ([f"entry:{entry_id}"] if entry_id else [])
    applies = {"pattern": o.kind, "engine": o.engine, "hardware": o.hardware}
    lessons_dir.mkdir(parents=True, exist_ok=True)
    kn = _knowledge_lessons()
    if kn is not None and hasattr(kn, "write_lesson"):
        return kn.write_lesson(lessons_dir, slug, kind, applies, evidence, confidence, body)
    file = lessons_dir / f"{slug}.md"
    meta = {"kind": kind, "applies-to": applies, "evidence": evidence, "confidence": confidence}
    file.write_text("---\n" + yaml.safe_dump(meta, sort_keys=False).strip() + "\n---\n" + body.strip() + "\n")
    return file


# ------------------------------------------------------------------------------------------------
# retrieval


def _knowledge_lessons():
    try:
        from bot.knowledge import lessons  # type: ignore[import-not-found]  (branch `store`)
        return lessons
    except ImportError:
        return None


def _knowledge_store():
    try:
        from bot.knowledge import store  # type: ignore[import-not-found]
        return store
    except ImportError:
        return None


@dataclass
class LessonView:
    slug: str
    kind: str
    applies_to: dict
    confidence: str
    body: str

    @property
    def title(self) -> str:
        return self.body.strip().splitlines()[0].lstrip("# ").strip() if self.body.strip() else self.slug


@dataclass
class EntryView:
    id: str
    title: str
    pattern: str
    engine: str
    hardware: list[str]
    status: str
    provenance: str
    path: Path


def _read_lesson(p: Path) -> LessonView | None:
    m = re.match(r"^---\s*\n(.*?)\n---\s*\n?(.*)$", p.read_text(), re.S)
    if not m:
        return None
    try:
        meta = yaml.safe_load(m[1]) or {}
    except yaml.YAMLError:
        return None
    if not isinstance(meta, dict):
        return None
    return LessonView(p.stem, str(meta.get("kind", "")), dict(meta.get("applies-to") or {}),
                      str(meta.get("confidence", "")), m[2].strip())


def _applies(applies: dict, pattern, engine, hardware) -> bool:
    for key, want in (("pattern", pattern), ("engine", engine), ("hardware", hardware)):
        have = applies.get(key)
        if want is not None and have not in (None, "any", want):
            return False
    return True


def find_lessons(pattern: str | None = None, engine: str | None = None, hardware: str | None = None,
                 query: str = "", lessons_dir: Path | None = None) -> list[LessonView]:
    """Lessons that apply to (pattern, engine, hardware), best query match first; caveats before patterns
    at equal score, since a known failure is the costlier thing to repeat."""
    root = Path(lessons_dir or LESSONS_DIR)
    if not root.is_dir():
        return []
    words = [w for w in re.findall(r"[\w.+-]+", (query or "").lower()) if w]
    scored = []
    for p in sorted(root.glob("*.md")):
        if p.name.lower() == "readme.md":
            continue
        lv = _read_lesson(p)
        if lv is None or not _applies(lv.applies_to, pattern, engine, hardware):
            continue
        hay = (lv.body + " " + " ".join(map(str, lv.applies_to.values()))).lower()
        score = sum(hay.count(w) for w in words)
        if words and score == 0:
            continue
        scored.append((-score, 0 if lv.kind == "caveat" else 1, lv.slug, lv))
    return [t[-1] for t in sorted(scored, key=lambda t: t[:3])]


def find_entries(pattern: str | None = None, engine: str | None = None, hardware: str | None = None,
                 store_dir: Path | None = None) -> list[EntryView]:
    root = Path(store_dir or STORE_DIR)
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        f = d / "entry.yaml"
        if not f.is_file():
            continue
        try:
            e = yaml.safe_load(f.read_text()) or {}
        except yaml.YAMLError:
            continue
        eng = (e.get("engine") or {}).get("name", "")
        hw = e.get("hardware") or []
        hw = [hw] if isinstance(hw, str) else list(hw)
        if pattern is not None and e.get("pattern") != pattern:
            continue
        if engine is not None and eng != engine:
            continue
        if hardware is not None and hardware not in hw and "any" not in hw:
            continue
        if e.get("status") == "rejected":
            continue
        prov = e.get("provenance") or {}
        out.append(EntryView(str(e.get("id", d.name)), str(e.get("title", "")), str(e.get("pattern", "")), eng, hw,
                             str(e.get("status", "")), f"{prov.get('kind', '')} {prov.get('agent') or prov.get('author') or ''}".strip(), d))
    return out


def prompt_context(pattern: str | None, engine: str | None, hardware: str | None, *, lessons_dir: Path | None = None,
                   store_dir: Path | None = None, max_chars: int = 12_000) -> str:
    """The knowledge block of the agent's (cached) system prompt: matching lessons, then store entries."""
    parts = []
    lessons = find_lessons(pattern, engine, hardware, lessons_dir=lessons_dir)
    if lessons:
        parts.append("## Lessons from earlier runs (caveats first)")
        for lv in lessons:
            parts.append(f"### [{lv.kind}, confidence {lv.confidence}] {lv.slug}\n{lv.body}")
    entries = find_entries(pattern, engine, hardware, store_dir=store_dir)
    if entries:
        parts.append("## Kernel-store entries for this pattern (validated optimizations; read_store shows a patch)")
        for e in entries:
            parts.append(f"- {e.id}: {e.title} [{e.status}; {e.provenance}; hardware {', '.join(e.hardware)}]")
    text = "\n\n".join(parts) if parts else "No lessons or store entries match this pattern, engine and hardware yet."
    return text if len(text) <= max_chars else text[:max_chars] + "\n... (truncated; use read_lessons/read_store)"


def store_entry_text(entry_id: str, store_dir: Path | None = None, max_chars: int = 30_000) -> str:
    root = Path(store_dir or STORE_DIR)
    d = (root / entry_id).resolve()
    if root.resolve() not in d.parents or not (d / "entry.yaml").is_file():
        return f"no store entry {entry_id!r}"
    text = "entry.yaml:\n" + (d / "entry.yaml").read_text()
    if (d / "patch.diff").is_file():
        text += "\npatch.diff:\n" + (d / "patch.diff").read_text()
    return text[:max_chars]
