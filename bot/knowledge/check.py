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
  validate    the full validator on the replayed commit (see _full_validation: one call site)
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


def _full_validation(entry: Entry, worktree: str, commit_sha: str, device: str) -> Check:
    """THE call site for the full validator (issue 3, bot.validate). Until it is wired in, it is
    reported as not run; the lead wires `bot.validate` here when it lands on main."""
    try:
        import bot.validate  # noqa: F401
    except ImportError:
        return Check("validate", None, "full validation not run: bot.validate is not available")
    return Check("validate", None, "full validation not wired yet (bot.validate exists: wire it in bot/knowledge/check.py)")


def check_entry(entry: Entry, device: str, work_dir: Path, run_kernels: bool = True,
                kernel_params: dict | None = None) -> EntryCheck:
    result = EntryCheck(entry.id, device, [Check("schema", True, f"{entry.path / 'entry.yaml'} parses")])
    result.checks.append(check_sources(entry))
    import_root = import_root_for(entry)
    try:
        checkout = checkout_engine(entry.engine.source, entry.engine.base_sha, import_root, entry.engine.name)
    except OptbotError as e:
        result.checks.append(Check("patch", False, f"engine {entry.engine.source} @ {entry.engine.base_sha[:12]}: {e}"))
        return result
    rr = apply_entry(checkout, entry, name=f"check-{entry.id}")
    result.checks.append(Check("patch", rr.status == "applied", rr.reason,
                               {"worktree": rr.worktree, "conflicts": rr.conflicts}))
    if rr.status != "applied":
        return result
    engine_root = str(Path(rr.worktree) / import_root)
    if run_kernels:
        result.checks.extend(run_kernel_tests(entry, engine_root, rr.candidate.commit_sha, device,
                                              work_dir / entry.id, params=kernel_params))
    result.checks.append(_full_validation(entry, rr.worktree, rr.candidate.commit_sha, device))
    return result
