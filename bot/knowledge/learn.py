"""Learning: after validation, turn outcomes into knowledge the next run starts from.

- An accepted candidate becomes a kernel_store entry (entry.yaml, patch.diff, the kernel sources it
  adds, bench.json with the numbers that accepted it) with provenance "generated" by its generator in
  this run, and a *pattern* lesson.
- Every rejected attempt becomes a *caveat* lesson whose body gives its root cause, taken from the
  verdict's reason and numbers.
- A replayed (or re-tuned) store entry gets this run's verdict in its bench.json instead: its
  history, the GPU verdict the next run may reuse, an adopted variant.

The formats are bot/knowledge's: entries (store.py), bench.json (records.py), lessons (lessons.py);
where they are written is location.py's decision (a None folder below means its default).
"""
from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bot.errors import ConfigError
from bot.knowledge.lessons import write_lesson
from bot.knowledge.location import locate
from bot.knowledge.review import entry_patch
from bot.knowledge.store import UNDER_COMPILE_REFERENCE, load_entry, set_status
from bot.knowledge.records import (Bench, HistoryRow, ValidationRecord, VariantSearch, WorkloadVerdict, bench_file,
                                   load_bench, now, patch_file_sha256, read_bench, record_search, save_bench)
from bot.validate.verdict import vs_base


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
    # a generator that writes its entry before validation (the template generator): the entry's
    # folder name, its status (candidate), config space and files beside the kernel (its test)
    entry_name: str = ""
    entry_status: str = ""
    config_space: dict = field(default_factory=dict)
    extra_files: dict[str, str] = field(default_factory=dict)  # file name -> content


@dataclass
class Learned:
    entry_dir: Path | None
    lesson_path: Path | None
    history: Path | None = None  # bench.json of a replayed entry that got this run's verdict


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
    if store_dir is None or lessons_dir is None:
        k = locate()
        store_dir, lessons_dir = store_dir or k.kernel_store, lessons_dir or k.lessons
    store_dir, lessons_dir = Path(store_dir), Path(lessons_dir)
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


def check_lesson(entry, workload: str, hardware: str, w: WorkloadVerdict, command: str,
                 lessons_dir: Path | None = None) -> Path | None:
    """A store entry re-validated on a GPU (`store check --record`, `store record-bench`): a rejection
    becomes a caveat lesson, one file per entry, workload and hardware, rewritten by each record;
    an acceptance removes that caveat (the knowledge it held is out of date)."""
    lessons_dir = Path(lessons_dir or locate().lessons)
    slug = _slug(entry.id, "on", hardware, workload)
    file = lessons_dir / f"{slug}.md"
    if w.status == "accepted":
        if file.is_file():
            file.unlink()
        return None
    eager = w.speed.get("eager")

    def ms(x):
        return "n/a" if x is None else f"{x:.1f}"

    speed = (f"eager {eager.speedup}x (base {ms(eager.base_step_ms)} -> {ms(eager.patched_step_ms)} ms "
             f"per step, A/A noise {eager.noise_pct}%)" if eager else "no speed measured")
    for mode, sp in w.speed.items():  # every other production mode the verdict timed
        if mode != "eager" and (sp.speedup or sp.outcome in ("failed", "n/a")):
            speed += f", {mode} " + (f"{sp.speedup}x" + vs_base(sp.base_mode)
                                     if sp.speedup else f"{sp.outcome} ({(sp.note or '')[:120]})")
    reason = f"{w.reason or w.status}: {w.summary or ''}"
    worst = w.worst_output.rel_l2 if w.worst_output else None
    body = (f"# {entry.id} on {hardware} ({workload}): {w.reason or w.status}\n\n"
            f"Tried: the entry's patch on the {w.preset} preset ({w.dtype}), base "
            f"{(w.base_sha or '')[:12]}, re-validated by `{command}`.\n\n"
            f"Happened: {w.status} ({w.reason}): {speed}; worst output rel L2 {worst}.\n\n"
            f"Root cause: {root_cause(reason)}. Replay skips this entry on {hardware} at this base while the "
            f"patch, torch and triton are unchanged (bench.json gpu.validation; `optimize --revalidate` measures "
            f"again).\n")
    applies = {"pattern": entry.pattern, "engine": entry.engine.name, "hardware": hardware}
    evidence = [f"entry:{entry.id}", f"kernel_store/{entry.id}/bench.json"]
    return write_lesson(lessons_dir, slug, "caveat", applies, evidence, "high", body)


def stack_lesson(added: str, others: list[str], kind: str, engine: str, workload: str, hardware: str, reason: str,
                 summary: str, run_id: str, lessons_dir: Path | None = None) -> Path:
    """A caveat lesson for a member that passed alone and broke a stack (combine's stack check,
    bot/steps/combine.py): which members it broke with, where, and how. One file per member,
    workload and hardware, rewritten by each run that finds it again."""
    lessons_dir = Path(lessons_dir or locate().lessons)
    from bot.knowledge import OPPORTUNITY_KINDS
    body = (f"# {added} breaks a stack on {hardware} ({workload}): {reason}\n\n"
            f"Tried: {added}, accepted alone, stacked onto {' + '.join(others)} (each accepted alone too), the stack "
            f"checked for correctness in every production mode by run {run_id}.\n\n"
            f"Happened: {reason}: {summary[:600]}\n\n"
            f"Root cause: not established by the check; the two changes interact (each was correct alone in every "
            f"mode). combine left {added} out of the stack, and a later run over the same stack takes the recorded "
            f"check instead of making it (bench.json gpu.stack_checks; `optimize --revalidate` checks again).\n")
    applies = {"pattern": kind if kind in OPPORTUNITY_KINDS else "any", "engine": engine, "hardware": hardware}
    evidence = [f"run:{run_id}"] + [f"entry:{e}" for e in [added, *others]]
    return write_lesson(lessons_dir, _slug(added, "in-a-stack-on", hardware, workload), "caveat", applies, evidence,
                        "high", body)


def stepped_aside(o: Outcome, entry_dir: Path) -> bool:
    """Whether the validated commit had the entry's kernels step aside under torch.compile where
    the entry's own patch does not (bot/generate/replay.under_compile): a choice for one hardware's
    recorded microbenchmark or one run's quantized precision, so it is neither the entry's verdict nor
    a source the entry adopts."""
    own = entry_dir / "patch.diff"
    return UNDER_COMPILE_REFERENCE in o.patch and not (own.is_file() and UNDER_COMPILE_REFERENCE in own.read_text())


def adopt_variant(o: Outcome, entry_dir: Path) -> None:
    """A tuned config found by variant search (a commit = the entry's patch with new kernel defaults).
    Accepted on a GPU: the entry adopts it (patch.diff and its kernel sources become the variant's),
    so the next run replays the tuned entry; either way the search is recorded per hardware against
    the entry's patch (`gpu.variant_search`), so the next run does not search the same space again."""
    if not o.device.startswith("cuda"):
        return
    bench = load_bench(entry_dir)
    adopted = o.status == "accepted" and bool(o.patch.strip()) and not stepped_aside(o, entry_dir)
    if adopted:
        sources = {p.name for p in entry_dir.glob("*.py") if not p.name.startswith("test_")}
        for path, content in o.added_files.items():
            if Path(path).name in sources:  # the tested kernel source must stay the file the patch adds
                (entry_dir / Path(path).name).write_text(content)
        (entry_dir / "patch.diff").write_text(entry_patch(o.patch))
    env = o.verdict.get("env") or {}
    record_search(entry_dir, o.hardware, VariantSearch(run_id=o.run_id, config=o.config, status=o.status,
                                                       reason=o.reason, adopted=adopted, torch=env.get("torch"),
                                                       triton=env.get("triton")), bench)


def record_gpu_verdict(o: Outcome, entry_dir: Path, bench: Bench) -> None:
    """A verdict measured on a GPU goes into bench.json `gpu.validation` in the format `store check
    --record` writes, so the next run can reuse it (bot/knowledge/known.py) when nothing changed.
    A rejected variant's verdict is about another patch than the entry's: not recorded there."""
    if not (o.device.startswith("cuda") and o.verdict.get("status") and o.workload):
        return
    if o.generator == "variant-search" and o.status != "accepted":
        return
    if stepped_aside(o, entry_dir):
        return  # another patch than the entry's (its kernels stepped aside under compile)
    vs = bench.gpu.variant_search.get(o.hardware) if bench.gpu else None
    if o.generator == "replay" and vs is not None and vs.run_id == o.run_id and vs.adopted:
        return  # this run's tuned variant replaced the patch the plain replay was validated on
    w = WorkloadVerdict.from_verdict(o.verdict)
    w.patch_sha256 = patch_file_sha256(entry_dir / "patch.diff")
    bench.gpu_section().set_validation(ValidationRecord(
        command=o.command or f"optbot optimize (run {o.run_id})", run_id=o.run_id, recorded_at=now(),
        device=o.device, workloads={o.workload: w}))
    if w.status == "accepted" and load_entry(entry_dir).status in ("candidate", "validated-cpu"):
        set_status(entry_dir, "validated-gpu")  # as `store check --record` does: the same validation


def record_history(o: Outcome, entry_dir: Path) -> Path:
    """Append this run's verdict on a stored entry to its bench.json `history` (one row per run and
    generator: a resumed run rewrites its own row)."""
    bench = load_bench(entry_dir)
    rows = [r for r in bench.history if not (r.run_id == o.run_id and r.generator == o.generator)]
    rows.append(HistoryRow(run_id=o.run_id, generator=o.generator, status=o.status, reason=o.reason, device=o.device,
                           hardware=o.hardware, workload=o.workload, dtype=o.dtype, base_sha=o.base_sha,
                           engine_sha=o.commit_sha, numbers=o.numbers, validated_by=o.validated_by, date=now()))
    bench.history = rows
    record_gpu_verdict(o, entry_dir, bench)
    return save_bench(entry_dir, bench)


def generated_name(o: Outcome, store_dir: Path) -> str:
    """A generated entry's name says what it changes: the workload and the kernels it adds
    (`_fused_swiglu_kernel` -> flux2-fused-swiglu), else its title (`optbot: merge the Q/K/V
    projections` -> flux2-merge-the-q-k-v-projections), not the opportunity's kind. An entry of that
    name from another commit keeps its name; this one gets the run and commit appended."""
    kernels = [re.sub(r"_kernel$", "", k).strip("_") for k in o.adds_kernels if k]
    what = kernels or [" ".join(re.sub(r"^optbot:\s*", "", o.title).split()[:8])]
    name = _slug(o.workload or "gen", *what)[:70].strip("-")
    if (store_dir / name).exists():
        try:
            b = read_bench(bench_file(store_dir / name))
        except ConfigError:
            b = None
        if b is None or b.engine_sha != o.commit_sha:  # not this commit's entry (or not a generated one)
            name = _slug(name, _run_tag(o.run_id), o.commit_sha[:8])
    return name


def write_entry(o: Outcome, store_dir: Path) -> Path:
    eid = o.entry_name or generated_name(o, store_dir)
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
        "status": o.entry_status or ("validated-gpu" if on_gpu else "validated-cpu"),
        "provenance": {"kind": "generated", "agent": o.generator, "run_id": o.run_id,
                       "date": time.strftime("%Y-%m-%d", time.gmtime())},
        "kernels": {"adds": o.adds_kernels, "removes": o.removes_kernels},
        "description": f"Generated by {o.generator} in run {o.run_id} (engine commit {o.commit_sha[:12]}); "
                       f"validated on {o.device}: {o.reason}",
    }
    if o.config_space:
        entry["config_space"] = o.config_space
    (d / "entry.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))
    (d / "patch.diff").write_text(entry_patch(o.patch))
    for path, content in o.added_files.items():
        if path.endswith(".py") and Path(path).name != "__init__.py":
            (d / Path(path).name).write_text(content)
    for name, content in o.extra_files.items():
        (d / name).write_text(content)
    bench = Bench(validated_by=o.validated_by, device=o.device, hardware=o.hardware, verdict=o.status,
                  reason=o.reason, numbers=o.numbers, engine_sha=o.commit_sha, base_sha=o.base_sha, run_id=o.run_id)
    record_gpu_verdict(o, d, bench)
    save_bench(d, bench)
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
    return write_lesson(lessons_dir, slug, kind, applies, evidence, confidence, body, signature=outcome_signature(o, entry_id))


def outcome_signature(o: Outcome, entry_id: str = "") -> str:
    """What makes two runs' outcomes one lesson: the same change (the entry, else its title with
    shas and numbers taken out) by the same generator, for the same opportunity kind, engine,
    workload and hardware, with the same result (accepted, or the rejection's reason code)."""
    what = entry_id or re.sub(r"\b[0-9a-f]{7,40}\b|\d+(\.\d+)?", "#", o.title.lower()).strip()
    result = "accepted" if o.status == "accepted" else f"{o.status}:{(o.reason or '').split(':')[0].strip()[:40]}"
    return "|".join([o.generator, o.kind, o.engine, o.workload, o.hardware, what, result])
