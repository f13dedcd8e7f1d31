"""`optbot store check`: re-validate kernel_store entries.

For each entry, in order (each check returns a reason, not a bare bool):
  schema      entry.yaml parses (load_store raises ConfigError naming file and field otherwise)
  sources     every kernel source in the entry is byte-identical to the file patch.diff adds to the
              engine, so the kernel that is tested is the kernel the engine runs
  patch       patch.diff applies with `git apply --3way` to the engine at its base sha, in a real
              worktree (bot/engine.add_worktree), and is committed there with the Optbot-* trailers
  kernels     each test_<op>.py runs as a `kernel_test` runner job (its own process, no secrets):
              reference vs kernel on randomized inputs; on CPU with TRITON_INTERPRET=1 and the
              Triton path required; on CUDA also a microbenchmark (A/B interleaved, A/A noise)
  validate    the full validator (bot.validate) on the replayed commit, per workload the entry names:
              on CPU correctness + engagement (tiny preset); on CUDA also end-to-end speed (full preset)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from bot.engine import checkout_engine
from bot.errors import OptbotError
from bot.generate.replay import apply_entry
from bot.jobs import run_job
from bot.knowledge.store import Entry, added_file_content, patch_added_files
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


def import_root_for(entry: Entry) -> str:
    """The engine's import root, from the workload file that defines this engine (default: src)."""
    from bot.workload import load_workload

    for name in entry.workloads:
        try:
            wl = load_workload(name)
        except OptbotError:
            continue
        spec = wl.engines.get(entry.engine.name)
        if spec is not None:
            return spec.import_root
    return "src"


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


def run_kernel_tests(entry: Entry, engine_root: str, engine_sha: str, device: str, work_dir: Path,
                     timeout_s: float = 900, params: dict | None = None) -> list[Check]:
    out = []
    for test in entry.test_files():
        job = Job(kind="kernel_test", workload={}, preset="", device=device, dtype="", engine_root=engine_root,
                  engine_sha=engine_sha, model_class="", shapes=[], out_dir=str(work_dir),
                  params={"test_file": str(test.resolve()), **(params or {})})
        res = run_job(job, work_dir, timeout_s=timeout_s, name=f"{entry.id}-{test.stem}")
        if not res.ok:
            out.append(Check(f"kernels:{test.name}", False, f"kernel_test job {res.reason()}",
                             {"log": res.log_path, "log_tail": res.log_tail[-1500:]}))
            continue
        r = res.result
        bad = [c for c in r["cases"] if not c["passed"]]
        worst = max((c["max_abs"] or 0.0 for c in r["cases"]), default=0.0)
        paths = sorted({str(c["path"]) for c in r["cases"]})
        if bad:
            c = bad[0]
            reason = f"{len(bad)}/{len(r['cases'])} cases failed; first: shape {c['shape']} {c['dtype']} seed {c['seed']}: {c['reason']}"
        else:
            reason = (f"{len(r['cases'])} cases passed on {device}"
                      + (" (TRITON_INTERPRET=1)" if r.get("interpret") else "") + f", kernel path {'/'.join(paths)}, "
                      f"worst max abs {worst:.3g}")
        if r.get("micro"):
            reason += "; micro: " + ", ".join(f"{m['shape']} {m['speedup']:.2f}x" for m in r["micro"] if m.get("speedup"))
        out.append(Check(f"kernels:{test.name}", not bad, reason, r))
    if not out:
        out.append(Check("kernels", None, "no test_<op>.py in the entry (patch-only entry)"))
    return out


def _full_validation(entry: Entry, checkout, commit_sha: str, device: str, work_dir: Path,
                     preset: str | None = None, log=None) -> list[Check]:
    """THE call site of the full validator (bot.validate, DESIGN decision 6) for a replayed entry:
    one verdict per workload the entry names, base = the entry's engine base sha. On CPU the verdict
    is correctness and engagement (speed needs a GPU, DESIGN decision 7); on CUDA also end-to-end
    speed, eager and CUDA graph, with the validator's gates (slower / no-change reject)."""
    from bot.target import Target
    from bot.validate import Options, validate
    from bot.workload import load_workload

    on_cuda = device.startswith("cuda")
    out = []
    for wl_name in entry.workloads or ():
        try:
            wl = load_workload(wl_name)
        except OptbotError as e:
            out.append(Check(f"validate:{wl_name}", False, f"workload {wl_name}: {e}"))
            continue
        spec = wl.engines.get(entry.engine.name) or wl.engine(None)
        p = preset or ("full" if on_cuda else "tiny")
        target = Target(wl, checkout.name, spec.model_class, checkout, p, device, wl.dtype_for(device))
        # the entry's kernel tests come from the store being checked, not the default one
        opts = Options(speed=on_cuda, run_dir=work_dir / entry.id / f"validate-{wl_name}", log=log,
                       kernel_store=entry.path.parent)
        try:
            v = validate(target, commit_sha, entry.engine.base_sha, opts)
        except OptbotError as e:
            out.append(Check(f"validate:{wl_name}", False, f"validation could not run: {e}"))
            continue
        reason = f"{v.status}" + (f" ({v.reason})" if v.reason else "") + f": {v.summary} [{p} preset, {device}]"
        out.append(Check(f"validate:{wl_name}", v.status == "accepted", reason, v.to_json()))
    if not out:
        out.append(Check("validate", None, "the entry names no workload to validate on"))
    return out


@dataclass
class Prepared:
    """An entry after its cheap checks, ready for the kernel tests and the validator."""
    result: EntryCheck
    checkout: object = None  # bot.engine.EngineCheckout, when the engine materialized
    commit_sha: str = ""  # the replayed commit, when the patch applied
    engine_root: str = ""


def prepare_entry(entry: Entry, device: str) -> Prepared:
    """schema, sources, patch: sequential and cheap (git worktrees of one repository are not
    created concurrently)."""
    result = EntryCheck(entry.id, device, [Check("schema", True, f"{entry.path / 'entry.yaml'} parses")])
    result.checks.append(check_sources(entry))
    import_root = import_root_for(entry)
    try:
        checkout = checkout_engine(entry.engine.source, entry.engine.base_sha, import_root, entry.engine.name)
    except OptbotError as e:
        result.checks.append(Check("patch", False, f"engine {entry.engine.source} @ {entry.engine.base_sha[:12]}: {e}"))
        return Prepared(result)
    rr = apply_entry(checkout, entry, name=f"check-{entry.id}")
    from bot.knowledge.known import patch_sha256

    result.checks.append(Check("patch", rr.status == "applied", rr.reason,
                               {"worktree": rr.worktree, "conflicts": rr.conflicts,
                                "patch_sha256": patch_sha256(entry)}))
    if rr.status != "applied":
        return Prepared(result, checkout)
    from bot.engine import add_worktree

    add_worktree(checkout, f"base-{entry.engine.base_sha[:12]}", entry.engine.base_sha)  # the validator's base side
    return Prepared(result, checkout, rr.candidate.commit_sha, str(Path(rr.worktree) / import_root))


def finish_entry(entry: Entry, prep: Prepared, device: str, work_dir: Path, run_kernels: bool = True,
                 kernel_params: dict | None = None, run_validation: bool = True, preset: str | None = None,
                 log=None) -> EntryCheck:
    """kernel tests and the full validation, on `device` (one lane of `store check --gpus N`)."""
    result = prep.result
    result.device = device
    if not prep.commit_sha:
        return result
    if run_kernels:
        result.checks.extend(run_kernel_tests(entry, prep.engine_root, prep.commit_sha, device,
                                              work_dir / entry.id, params=kernel_params))
    if run_validation:
        result.checks.extend(_full_validation(entry, prep.checkout, prep.commit_sha, device, work_dir, preset, log))
    return result


def check_entry(entry: Entry, device: str, work_dir: Path, run_kernels: bool = True,
                kernel_params: dict | None = None, run_validation: bool = True, preset: str | None = None,
                log=None) -> EntryCheck:
    return finish_entry(entry, prepare_entry(entry, device), device, work_dir, run_kernels, kernel_params,
                        run_validation, preset, log)
