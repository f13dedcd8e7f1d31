"""`optbot store check`: re-validate kernel_store entries.

For each entry, in order (each check returns a reason, not a bare bool):
  schema      entry.yaml parses (load_store raises ConfigError naming file and field otherwise)
  sources     every kernel source in the entry is byte-identical to the file patch.diff adds to the
              engine, so the kernel that is tested is the kernel the engine runs
  patch       patch.diff applies with `git apply --3way` to the engine at its base sha (or, given
              --engine/--ref, at that engine's tip: `engine_tip`), in a real worktree
              (bot/engine.add_worktree), and is committed there with the Optbot-* trailers
  kernels     each test_<op>.py runs as a `kernel_test` runner job (its own process, no secrets):
              reference vs kernel on randomized inputs; on CPU with TRITON_INTERPRET=1 and the
              Triton path required; on CUDA also a microbenchmark (A/B interleaved, A/A noise)
  validate    the full validator (bot.validate) on the replayed commit, per workload the entry names:
              on CPU correctness + engagement (tiny preset); on CUDA also end-to-end speed (full preset)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from bot.engine import EngineCheckout, checkout_engine, resolve_source
from bot.errors import OptbotError
from bot.generate.replay import apply_entry
from bot.jobs import run_job
from bot.knowledge.store import Entry, added_file_content, patch_added_files, set_status
from runner.job import Job


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not run (skipped, with the reason)
    reason: str
    details: dict = field(default_factory=dict)


@dataclass
class EntryCheck:
    entry_id: str
    device: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    def to_json(self) -> dict:
        return {"entry_id": self.entry_id, "device": self.device, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def _workload_of(entry: Entry):
    """The first workload the entry names whose file defines the entry's engine (None: none does)."""
    from bot.workload import load_workload

    for name in entry.workloads:
        try:
            wl = load_workload(name)
        except OptbotError:
            continue
        if entry.engine.name in wl.engines:
            return wl
    return None


def import_root_for(entry: Entry) -> str:
    """The engine's import root, from the workload file that defines this engine (default: src)."""
    wl = _workload_of(entry)
    return wl.engines[entry.engine.name].import_root if wl else "src"


@dataclass(frozen=True)
class Tip:
    """The engine an entry is checked against instead of its recorded base (`store check --engine
    --ref`), or why the entry is not checked against it (another engine's entry)."""
    checkout: EngineCheckout | None
    skipped: str = ""


def engine_tip(entry: Entry, engine: str | None, ref: str | None, _cache: dict | None = None) -> Tip:
    """--engine NAME|NAME=PATH|URL|PATH|URL and --ref REF, read as every workload command reads them
    (bot/engine.resolve_source; a bare PATH or URL is the workload's default engine): the entry's
    patch is applied to that repository at REF (default: the engine's ref in the workload, else
    HEAD). An entry of another engine than the one named is skipped, with the reason."""
    wl = _workload_of(entry)
    engines = wl.engines if wl else {}
    name, source = resolve_source(entry.engine.source, engine, engines)
    named = entry.engine.name if engine is None else (name if name in engines else (wl.default_engine if wl else ""))
    if named != entry.engine.name:
        return Tip(None, f"an entry of engine {entry.engine.name}; --engine {engine} is "
                         f"{named or 'an engine no workload of the entry defines'}")
    spec = engines.get(entry.engine.name)
    want = ref or (spec.ref if spec else None)
    key = (source, want, import_root_for(entry))
    cache = {} if _cache is None else _cache
    if key not in cache:
        cache[key] = checkout_engine(source, want, key[2], entry.engine.name)
    return Tip(cache[key])


def check_sources(entry: Entry) -> Check:
    patch = entry.patch_path.read_text()
    added = patch_added_files(patch)
    problems, matched = [], []
    for src in entry.kernel_files():
        targets = [p for p in added if Path(p).name == src.name]
        if not targets:
            problems.append(f"{src.name} is not a file patch.diff adds")
            continue
        content = added_file_content(patch, targets[0])
        if content != src.read_text():
            problems.append(f"{src.name} differs from {targets[0]} in patch.diff")
        else:
            matched.append(f"{src.name} == {targets[0]}")
    if problems:
        return Check("sources", False, "; ".join(problems))
    return Check("sources", True, ", ".join(matched) or "no kernel sources (patch-only entry)")


def micro_text(m: dict) -> str:
    """One microbenchmark row: speed against the eager reference, and against the reference as
    inductor compiles it (the bar under torch.compile) where that was timed."""
    text = f"{m['shape']} {m['speedup']:.2f}x"
    if m.get("vs_compiled"):
        text += f" ({m['vs_compiled']:.2f}x vs compiled)"
    elif m.get("compile_error"):
        text += " (reference does not compile)"
    return text


def run_kernel_tests(entry: Entry, engine_root: str, engine_sha: str, device: str, work_dir: Path,
                     timeout_s: float = 900, params: dict | None = None) -> list[Check]:
    out = [run_kernel_test(test, engine_root, engine_sha, device, work_dir, timeout_s, params, f"{entry.id}-{test.stem}")
           for test in entry.test_files()]
    if not out:
        out.append(Check("kernels", None, "no test_<op>.py in the entry (patch-only entry)"))
    return out


def run_kernel_test(test: Path, engine_root: str, engine_sha: str, device: str, work_dir: Path,
                    timeout_s: float = 900, params: dict | None = None, name: str = "") -> Check:
    """One test_<op>.py as a `kernel_test` runner job (the store's and the agent's one way to run a
    kernel test): pass/fail with the first failing case or the worst error, and on CUDA the
    microbenchmark's speedups."""
    job = Job(kind="kernel_test", workload={}, preset="", device=device, dtype="", engine_root=engine_root,
              engine_sha=engine_sha, model_class="", shapes=[], out_dir=str(work_dir),
              params={"test_file": str(Path(test).resolve()), **(params or {})})
    res = run_job(job, work_dir, timeout_s=timeout_s, name=name or Path(test).stem)
    label = f"kernels:{Path(test).name}"
    if not res.ok:
        return Check(label, False, f"kernel_test job {res.reason()}",
                     {"log": res.log_path, "log_tail": res.log_tail[-1500:]})
    r = res.result
    bad = [c for c in r["cases"] if not c["passed"]]
    worst = max((c["max_abs"] or 0.0 for c in r["cases"]), default=0.0)
    paths = sorted({str(c["path"]) for c in r["cases"]})
    if bad:
        c = bad[0]
        reason = (f"{len(bad)}/{len(r['cases'])} cases failed; first: {c.get('mode', 'eager')} shape {c['shape']} "
                  f"{c['dtype']} seed {c['seed']}: {c['reason']}")
    else:
        modes = sorted({c.get("mode", "eager") for c in r["cases"]}, key=lambda m: (m != "eager", m))
        reason = (f"{len(r['cases'])} cases passed on {device} ({', '.join(modes)})"
                  + (" (TRITON_INTERPRET=1)" if r.get("interpret") else "") + f", kernel path {'/'.join(paths)}, "
                  f"worst max abs {worst:.3g}")
    if r.get("micro"):
        reason += "; micro: " + ", ".join(micro_text(m) for m in r["micro"] if m.get("speedup"))
    return Check(label, not bad, reason, r)


def _full_validation(entry: Entry, checkout, commit_sha: str, device: str, work_dir: Path,
                     preset: str | None = None, log=None, base_sha: str | None = None) -> list[Check]:
    """THE call site of the full validator (bot.validate, DESIGN decision 6) for a replayed entry:
    one verdict per workload the entry names, base = the entry's engine base sha (or the tip). On CPU the verdict
    is correctness and engagement (speed needs a GPU, DESIGN decision 7); on CUDA also end-to-end
    speed in every production mode, with the validator's gates (slower / no-change reject)."""
    from bot.target import Target
    from bot.validate import Options, shared_seeds, validate
    from bot.workload import load_workload

    on_cuda = device.startswith("cuda")
    if not on_cuda and entry.hardware and "cpu" not in entry.hardware:
        # e.g. an attention-backend choice that only CUDA tensors take: on CPU it is dead code, and
        # the validator would rightly call it "not engaged"
        return [Check("validate", None, f"not run on cpu: the entry targets {', '.join(entry.hardware)} only "
                                        f"(what it changes runs there alone)")]
    out = []
    for wl_name in entry.workloads or ():
        try:
            wl = load_workload(wl_name)
        except OptbotError as e:
            out.append(Check(f"validate:{wl_name}", False, f"workload {wl_name}: {e}"))
            continue
        spec = wl.engines.get(entry.engine.name) or wl.engine(None)
        p = preset or ("full" if on_cuda else "tiny")
        target = Target(wl, checkout.name, spec.model_class, checkout, p, device, _entry_precision(entry, wl.dtype_for(device)))
        # the entry's kernel tests come from the store being checked, not the default one; the
        # check's entries share seeds and so one base outcome per base and workload (docs/validate.md,
        # "One base a run": several FP8 entries on one base ran the base and its reference each)
        seeds, weight_seed = shared_seeds(work_dir)
        opts = Options(speed=on_cuda, run_dir=work_dir / entry.id / f"validate-{wl_name}", log=log,
                       kernel_store=entry.path.parent, seeds=seeds, weight_seed=weight_seed,
                       cache_dir=work_dir / "base-cache")
        try:
            v = validate(target, commit_sha, base_sha or entry.engine.base_sha, opts)
        except OptbotError as e:
            out.append(Check(f"validate:{wl_name}", False, f"validation could not run: {e}"))
            continue
        reason = f"{v.status}" + (f" ({v.reason})" if v.reason else "") + f": {v.summary} [{p} preset, {device}]"
        out.append(Check(f"validate:{wl_name}", v.status == "accepted", reason, v.to_json()))
    if not out:
        out.append(Check("validate", None, "the entry names no workload to validate on"))
    return out


def _entry_precision(entry: Entry, dtype: str) -> str:
    """The precision to validate an entry at: the device's dtype, or its quantized variant when the
    entry is for quantized precisions only (an FP8 entry acts on float8 linears: unquantized, it
    would rightly be "not engaged"; docs/fp8.md)."""
    if not entry.dtypes or any("+" not in d for d in entry.dtypes):
        return dtype
    from runner.job import precision, split_precision

    return precision(dtype, split_precision(entry.dtypes[0])[1])


@dataclass
class Prepared:
    """An entry after its cheap checks, ready for the kernel tests and the validator."""
    result: EntryCheck
    checkout: object = None  # bot.engine.EngineCheckout, when the engine materialized
    commit_sha: str = ""  # the replayed commit, when the patch applied
    engine_root: str = ""
    base_sha: str = ""  # what the patch was applied to and is validated against: the entry's base, or the tip


def prepare_entry(entry: Entry, device: str, tip: Tip | None = None) -> Prepared:
    """schema, sources, patch: sequential and cheap (git worktrees of one repository are not
    created concurrently). With a tip (engine_tip), the patch goes onto the tip and the validator's
    base is the tip; a skipped tip is one check that did not run."""
    result = EntryCheck(entry.id, device, [Check("schema", True, f"{entry.path / 'entry.yaml'} parses")])
    if tip is not None and tip.checkout is None:
        result.checks.append(Check("engine", None, f"not checked: {tip.skipped}"))
        return Prepared(result)
    result.checks.append(check_sources(entry))
    import_root = import_root_for(entry)
    if tip is not None:
        checkout = tip.checkout
    else:
        try:
            checkout = checkout_engine(entry.engine.source, entry.engine.base_sha, import_root, entry.engine.name)
        except OptbotError as e:
            result.checks.append(Check("patch", False, f"engine {entry.engine.source} @ {entry.engine.base_sha[:12]}: {e}",
                                       {"status": "error"}))
            return Prepared(result)
    base = checkout.base_sha
    rr = apply_entry(checkout, entry, name=f"check-{entry.id}")
    from bot.knowledge.known import patch_sha256

    result.checks.append(Check("patch", rr.status == "applied", rr.reason,
                               {"status": rr.status, "worktree": rr.worktree, "conflicts": rr.conflicts,
                                "patch_sha256": patch_sha256(entry), "engine": checkout.name, "at": base,
                                "tip": tip is not None}))
    if rr.status != "applied":
        return Prepared(result, checkout, base_sha=base)
    from bot.engine import add_worktree

    add_worktree(checkout, f"base-{base[:12]}", base)  # the validator's base side
    return Prepared(result, checkout, rr.candidate.commit_sha, str(Path(rr.worktree) / import_root), base)


def finish_entry(entry: Entry, prep: Prepared, device: str, work_dir: Path, run_kernels: bool = True,
                 kernel_params: dict | None = None, run_validation: bool = True, preset: str | None = None,
                 log=None) -> EntryCheck:
    """kernel tests and the full validation, on `device` (one lane of `store check --gpus N`)."""
    result = prep.result
    result.device = device
    if not prep.commit_sha:
        return result
    if run_kernels:
        # a folder of their own: the kernel tests' process may write all of it, and the validation's
        # (outputs, kept processes of an earlier attempt: bot/validate/attempt.py) is beside it, not in it
        result.checks.extend(run_kernel_tests(entry, prep.engine_root, prep.commit_sha, device,
                                              work_dir / entry.id / "kernel-tests", params=kernel_params))
    if run_validation:
        result.checks.extend(_full_validation(entry, prep.checkout, prep.commit_sha, device, work_dir, preset, log,
                                              prep.base_sha))
    return result


def check_entry(entry: Entry, device: str, work_dir: Path, run_kernels: bool = True,
                kernel_params: dict | None = None, run_validation: bool = True, preset: str | None = None,
                log=None) -> EntryCheck:
    return finish_entry(entry, prepare_entry(entry, device), device, work_dir, run_kernels, kernel_params,
                        run_validation, preset, log)


# ------------------------------------------------------------------------------------------------
# recording a check into the entry (store check --record, store record-bench, store check --propose)


def record_validation(entry: Entry, result: dict, command: str, source: str | None = None,
                      lessons_dir: Path | None = None, log=print) -> bool:
    """The validator's verdicts into bench.json: on CUDA under gpu.validation (end-to-end speed with
    its environment), on CPU under correctness.cpu_validation (correctness and engagement only).
    `result` is EntryCheck.to_json() or the same read from a store-check JSON file."""
    from bot.knowledge.known import patch_sha256
    from bot.knowledge.records import ValidationRecord, WorkloadVerdict, now, save_bench

    checks = result["checks"]
    verdicts = {c["name"].split(":", 1)[1]: WorkloadVerdict.from_verdict(c["details"]) for c in checks
                if c["name"].startswith("validate:") and (c.get("details") or {}).get("status")}
    if not verdicts:
        return False
    # the patch the verdict was made on, so a later run reuses it only for the same patch
    # (bot/knowledge/known.py); results from before store check recorded it get today's file's hash
    checked = next((c["details"].get("patch_sha256") for c in checks if c["name"] == "patch"), None)
    for v in verdicts.values():
        v.patch_sha256 = checked or patch_sha256(entry)
        if not checked:
            v.patch_sha256_from = "record time (the check's JSON did not carry it)"
    bench = entry.bench()
    rec = ValidationRecord(command=command, recorded_at=now(), device=result["device"], source=source,
                           workloads=verdicts)
    if result["device"].startswith("cuda"):
        bench.gpu_section().set_validation(rec)
        if all(v.status == "accepted" for v in verdicts.values()):
            set_status(entry.path, "validated-gpu")
        from bot.hardware import hardware_name
        from bot.knowledge.learn import check_lesson

        for wl, v in verdicts.items():  # a GPU rejection is a caveat lesson; an acceptance clears it
            hw = hardware_name("cuda", (v.env or {}).get("device_name", ""))
            lesson = check_lesson(entry, wl, hw, v, rec.command, lessons_dir)
            if lesson:
                log(f"lesson {lesson}")
    else:
        bench.correctness_section().cpu_validation = rec
    bench.entry = bench.entry or entry.id  # learn's generated entries may not name it yet
    save_bench(entry.path, bench)
    return True
