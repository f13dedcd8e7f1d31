"""kernel_store/<entry>/bench.json, typed: every reader and writer of the file goes through here.

    {"entry": ID,
     "correctness": {"cpu" | "cuda": KernelTests, "cpu_validation": ValidationRecord},
     "gpu": {"validation": ValidationRecord, "validation_elsewhere": {HARDWARE: ValidationRecord},
             "micro": MicroRecord, "micro_elsewhere": {HARDWARE: MicroRecord}, "end_to_end": {...},
             "variant_search": {HARDWARE: VariantSearch}, "ablation": {WORKLOAD: AblationRecord},
             "stack_checks": {WORKLOAD: [StackCheckRecord, ...]}},
     "history": [HistoryRow, ...]}

plus, in an entry the learn step generated, the verdict that made it (Bench.validated_by ...
run_id). docs/store.md says who writes which part.

The format is the JSON the commands always wrote; this module only types it (the typed-record
machinery is bot/knowledge/record_base.py): a file loaded and dumped unchanged is byte-identical,
and an old record still matches.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.errors import ConfigError
from bot.hardware import hardware_name
from bot.knowledge.record_base import _opt, _Record


# ------------------------------------------------------------------------------------------------
# the validator's verdict on an entry, per workload (gpu.validation, correctness.cpu_validation)


@dataclass
class WorstOutput(_Record):
    label: str | None = None
    output: str | None = None
    rel_l2: float | None = None
    max_abs: float | None = None


@dataclass
class ModeSpeed(_Record):
    """One production mode's end-to-end numbers: process medians of each side, copied from the verdict."""
    device: str | None = None
    base_step_ms: float | None = None
    patched_step_ms: float | None = None
    passes: int = 1
    base_per_pass_ms: float | None = None
    patched_per_pass_ms: float | None = None
    speedup: float | None = None
    noise_pct: float | None = None
    outcome: str | None = None
    base_process_ms: list[float] = field(default_factory=list)
    patched_process_ms: list[float] = field(default_factory=list)
    trials_per_process: int | None = None
    note: str | None = None
    base_mode: str | None = _opt()  # the base's mode the speedup is against (outcome "enabled": the base cannot run this one)


@dataclass
class WorkloadVerdict(_Record):
    """The numbers of one verdict (bot/validate/verdict.Verdict) on one workload."""
    status: str | None = None  # accepted | rejected | held
    reason: str | None = None
    summary: str | None = None
    preset: str | None = None
    dtype: str | None = None
    base_sha: str | None = None
    candidate_sha: str | None = None
    seeds: list[int] | None = None
    shapes: list[str] | None = None
    rule: str | None = None
    worst_output: WorstOutput | None = None
    speed: dict[str, ModeSpeed] = field(default_factory=dict)  # production mode (eager, graph, compile, compile+graph) -> numbers
    env: dict[str, Any] | None = None  # the verdict's environment: device_name, torch, triton, ...
    seconds: float | None = None
    patch_sha256: str | None = _opt()  # of the patch.diff the verdict was made on (bot/knowledge/known.py)
    patch_sha256_from: str | None = _opt()  # set when the hash was taken at record time, not check time

    @classmethod
    def from_verdict(cls, verdict: dict) -> "WorkloadVerdict":
        """From a Verdict as JSON (Verdict.to_json()): copied, not computed, except each side's
        median over its processes and the worst output."""
        speed = {}
        for sp in verdict.get("speed") or []:
            b, c = sp.get("base_ms") or [], sp.get("candidate_ms") or []
            passes = sp.get("passes") or 1
            speed[sp["mode"]] = ModeSpeed(
                device=sp.get("device"), base_step_ms=statistics.median(b) if b else None,
                patched_step_ms=statistics.median(c) if c else None, passes=passes,
                base_per_pass_ms=statistics.median(b) / passes if b else None,
                patched_per_pass_ms=statistics.median(c) / passes if c else None,
                speedup=sp.get("speedup"), noise_pct=sp.get("noise_pct"), outcome=sp.get("outcome"),
                base_process_ms=list(b), patched_process_ms=list(c), trials_per_process=sp.get("n"),
                note=sp.get("note"), base_mode=sp.get("base_mode") or None)
        corr = verdict.get("correctness") or {}
        ranked = [ch for ch in corr.get("checks", []) if ch.get("rel_l2") is not None]
        worst = max(ranked, key=lambda ch: ch["rel_l2"]) if ranked else None
        return cls(status=verdict.get("status"), reason=verdict.get("reason"), summary=verdict.get("summary"),
                   preset=verdict.get("preset"), dtype=verdict.get("dtype"), base_sha=verdict.get("base_sha"),
                   candidate_sha=verdict.get("candidate_sha"), seeds=corr.get("seeds"), shapes=corr.get("shapes"),
                   rule=corr.get("rule"),
                   worst_output=WorstOutput(worst.get("label"), worst.get("output"), worst.get("rel_l2"),
                                            worst.get("max_abs")) if worst else None,
                   speed=speed, env=verdict.get("env"), seconds=verdict.get("seconds"))


@dataclass
class ValidationRecord(_Record):
    """One recording of verdicts (a store check, a record-bench, an optimize run's learn step)."""
    command: str | None = None
    run_id: str | None = _opt()  # the optimize run that measured it
    recorded_at: str | None = None
    device: str | None = None
    source: str | None = _opt()  # the results file record-bench read
    workloads: dict[str, WorkloadVerdict] = field(default_factory=dict)

    def hardware(self) -> str:
        return _hardware_of(self.device, [w.env for w in self.workloads.values()])


# ------------------------------------------------------------------------------------------------
# kernel tests (correctness.cpu|cuda, gpu.micro): the runner's per-test results, kept as reported


@dataclass
class KernelTests(_Record):
    command: str | None = None
    date: str | None = None
    tests: dict[str, dict] = field(default_factory=dict)  # test_<op>.py -> passed, interpret, cases, micro, env


@dataclass
class MicroRecord(_Record):
    source: str | None = None
    command: str | None = None
    recorded_at: str | None = None
    device: str | None = None
    tests: dict[str, dict] = field(default_factory=dict)  # test_<op>.py -> micro, env, passed

    def hardware(self) -> str:
        return _hardware_of(self.device, [t.get("env") for t in self.tests.values() if isinstance(t, dict)])


@dataclass
class CorrectnessRecord(_Record):
    cpu: KernelTests | None = _opt()
    cuda: KernelTests | None = _opt()
    cpu_validation: ValidationRecord | None = _opt()


# ------------------------------------------------------------------------------------------------
# what optimize runs learned: variant searches, the stack's leave-one-out, the history of verdicts


@dataclass
class VariantSearch(_Record):
    """A finished variant search on one hardware, tied to the entry's patch as it was after it."""
    run_id: str | None = None
    config: str | None = None
    status: str | None = None  # accepted | rejected | kept
    reason: str | None = None
    adopted: bool = False
    torch: str | None = None
    triton: str | None = None
    patch_sha256: str | None = None
    date: str | None = None


@dataclass
class AblationRecordRow(_Record):
    entry: str | None = None
    without_ms: float | None = None
    contribution_ms: float | None = None
    contribution_pct: float | None = None


@dataclass
class StackKey(_Record):
    """What a record of a stack (its leave-one-out, its correctness check) holds for exactly that stack:
    its diff (sha256 of `git diff base head`), base, preset, dtype, hardware, torch and triton
    (bot/knowledge/known.stack_key; the workload is the key it is filed under)."""
    stack_sha256: str | None = None
    base_sha: str | None = None
    preset: str | None = None
    dtype: str | None = None
    hardware: str | None = None
    torch: str | None = None
    triton: str | None = None


@dataclass
class AblationRecord(StackKey):
    """A stack's leave-one-out on one workload, kept in each member entry (bot/knowledge/known.known_ablation)."""
    run_id: str | None = None
    command: str | None = None
    mode: str | None = None
    rounds: int | None = None
    device: str | None = None
    base_ms: float | None = None
    stack_ms: float | None = None
    noise_pct: float | None = None
    rows: list[AblationRecordRow] = field(default_factory=list)
    recorded_at: str | None = None


@dataclass
class StackCheckRecord(StackKey):
    """A stack of accepted entries checked whole for correctness (every production mode) and
    engagement, kept in each member entry (bot/knowledge/known.known_stack_check): combine's search
    for the members that break a stack whose members each passed alone (bot/steps/combine.py)."""
    entries: list[str] = field(default_factory=list)
    added: str | None = None  # the entry whose addition the check decided ("" or None: the whole stack)
    status: str | None = None  # accepted | rejected | held: the validator's, correctness and engagement only
    reason: str | None = None
    summary: str | None = None
    run_id: str | None = None
    command: str | None = None
    recorded_at: str | None = None


@dataclass
class HistoryRow(_Record):
    """One optimize run's verdict on a replayed entry (a replayed entry never becomes a second entry)."""
    run_id: str | None = None
    generator: str | None = None
    status: str | None = None
    reason: str | None = None
    device: str | None = None
    hardware: str | None = None
    workload: str | None = None
    dtype: str | None = None
    base_sha: str | None = None
    engine_sha: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)
    validated_by: str | None = None
    date: str | None = None


@dataclass
class Gpu(_Record):
    # the latest recordings, and per other GPU model its own latest (an H100 check keeps the H200's)
    validation: ValidationRecord | None = _opt()
    validation_elsewhere: dict[str, ValidationRecord] = _opt(factory=dict)
    micro: MicroRecord | None = _opt()
    micro_elsewhere: dict[str, MicroRecord] = _opt(factory=dict)
    end_to_end: dict[str, Any] | None = _opt()  # `store bench` results as record-bench copied them
    variant_search: dict[str, VariantSearch] = _opt(factory=dict)  # hardware -> search
    ablation: dict[str, AblationRecord] = _opt(factory=dict)  # workload -> leave-one-out
    stack_checks: dict[str, list[StackCheckRecord]] = _opt(factory=dict)  # workload -> the stacks checked

    def set_validation(self, rec: ValidationRecord) -> None:
        self.validation = _displace(self.validation, rec, self.validation_elsewhere)

    def validation_on(self, hardware: str) -> ValidationRecord | None:
        return _on(self.validation, self.validation_elsewhere, hardware)

    def set_micro(self, rec: MicroRecord) -> None:
        self.micro = _displace(self.micro, rec, self.micro_elsewhere)

    def micro_on(self, hardware: str) -> MicroRecord | None:  # replay's step-aside decision reads it
        return _on(self.micro, self.micro_elsewhere, hardware)


def _hardware_of(device: str | None, envs: list) -> str:
    """hardware_name of the first recorded device name ("h200", "h100"; "cuda" where none)."""
    return hardware_name(device or "cuda", next((e["device_name"] for e in envs if e and e.get("device_name")), ""))


def _displace(latest, rec, elsewhere: dict):
    """`rec` becomes the latest recording; the one it replaces moves to `elsewhere` when made on other
    hardware, and a recording on `rec`'s hardware (latest or in `elsewhere`) is superseded."""
    elsewhere.pop(rec.hardware(), None)
    if latest is not None and latest.hardware() != rec.hardware():
        elsewhere[latest.hardware()] = latest
    return rec


def _on(latest, elsewhere: dict, hardware: str):  # the latest recording made on `hardware`, or None
    return latest if latest is not None and latest.hardware() == hardware else elsewhere.get(hardware)


@dataclass
class Bench(_Record):
    entry: str | None = _opt()
    # an entry the learn step generated: the verdict that made it
    validated_by: str | None = _opt()
    device: str | None = _opt()
    hardware: str | None = _opt()
    verdict: str | None = _opt()
    reason: str | None = _opt()
    numbers: dict[str, Any] | None = _opt()
    engine_sha: str | None = _opt()
    base_sha: str | None = _opt()
    run_id: str | None = _opt()
    correctness: CorrectnessRecord | None = _opt()
    gpu: Gpu | None = _opt()
    history: list[HistoryRow] = _opt(factory=list)

    def gpu_section(self) -> Gpu:
        """bench.gpu, made when the file has none yet."""
        if self.gpu is None:
            self.gpu = Gpu()
        return self.gpu

    def correctness_section(self) -> CorrectnessRecord:
        if self.correctness is None:
            self.correctness = CorrectnessRecord()
        return self.correctness

    def dumps(self) -> str:
        # default=str: a Path among a run's numbers is written as its text, as it always was
        return json.dumps(self.to_json(), indent=2, default=str) + "\n"


# ------------------------------------------------------------------------------------------------
# files


def bench_file(entry_dir: Path) -> Path:
    return Path(entry_dir) / "bench.json"


def read_bench(file: Path) -> Bench | None:
    """A bench.json, or None when there is none; a malformed one is a ConfigError naming the key."""
    file = Path(file)
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(file, "(json)", str(e), "valid JSON") from None
    return Bench.from_json(data, file)


def load_bench(entry_dir: Path) -> Bench:
    """An entry's bench.json; a new one names the entry."""
    return read_bench(bench_file(entry_dir)) or Bench(entry=Path(entry_dir).name)


def save_bench(entry_dir: Path, bench: Bench) -> Path:
    (f := bench_file(entry_dir)).write_text(bench.dumps())
    return f


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def patch_file_sha256(path: Path) -> str:
    """The key a recorded verdict or variant search is tied to: the bytes of an entry's patch.diff."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------
# writers of one part (the learn step's and the optimize steps')


def record_search(entry_dir: Path, hardware: str, search: VariantSearch, bench: Bench | None = None) -> Path:
    """A finished variant search of the entry on `hardware` into `gpu.variant_search`, tied to the
    entry's patch as it is now (after any adoption): a later run with the same patch, torch and
    triton does not search again (bot/knowledge/recall.searched)."""
    search.patch_sha256 = patch_file_sha256(Path(entry_dir) / "patch.diff")
    search.date = now()
    bench = load_bench(entry_dir) if bench is None else bench
    bench.gpu_section().variant_search[hardware] = search
    return save_bench(entry_dir, bench)


def record_ablation(entry_dir: Path, workload: str, ablation: AblationRecord) -> Path:
    """The stack's leave-one-out, measured on a GPU, into the member entry's `gpu.ablation[workload]`
    (the whole stack's rows, so any member answers for it)."""
    ablation.recorded_at = now()
    bench = load_bench(entry_dir)
    bench.gpu_section().ablation[workload] = ablation
    return save_bench(entry_dir, bench)


STACK_CHECKS_KEPT = 16  # per workload and entry: the newest, one per stack


def record_stack_check(entry_dir: Path, workload: str, check: StackCheckRecord) -> Path:
    """A stack's correctness check into the member entry's `gpu.stack_checks[workload]`, replacing
    an earlier check of the same stack on the same hardware."""
    check.recorded_at = now()
    bench = load_bench(entry_dir)
    kept = [c for c in bench.gpu_section().stack_checks.get(workload, [])
            if (c.stack_sha256, c.hardware) != (check.stack_sha256, check.hardware)]
    bench.gpu_section().stack_checks[workload] = (kept + [check])[-STACK_CHECKS_KEPT:]
    return save_bench(entry_dir, bench)
