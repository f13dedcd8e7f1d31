"""What the store already knows about an entry on this hardware: its recorded GPU verdict.

`store check --device cuda --record` (or `store record-bench`) keeps, per workload, the validator's
verdict on the entry's replayed commit in bench.json `gpu.validation` (the latest recording; one
per other GPU model in `gpu.validation_elsewhere`). A later run may use that
verdict instead of measuring again only when everything that determined it is unchanged:

  the patch         sha256 of patch.diff recorded with the verdict == the file now
  the engine base   the verdict's base sha == this run's base sha
  the workload      same workload, preset and dtype
  the machine       same hardware name (e.g. h200), torch and triton versions
  the rule          at a quantized precision, judged against the unquantized model too

Anything else, or no record, means unknown: the candidate is validated as usual. The stack that a
run delivers is always validated fresh, on new seeds (bot/steps/combine.py).

The stack's leave-one-out ablation is an attribution (which entry gives how much), not the run's
number. A run that measured one records it in every member entry's bench.json `gpu.ablation`
(bot/knowledge/records.record_ablation); a later run whose stack has the same diff (sha256 of `git diff base
head`), base, workload, preset, dtype, hardware, torch and triton reuses it (known_ablation).

A stack whose members each passed alone can still fail whole; combine then checks stacks of them for
correctness only (no timing) to find the members that break it. Each check is kept in the members'
bench.json `gpu.stack_checks` (records.record_stack_check) and a later run's check of a stack with
the same diff and the same keys takes it (known_stack_check): a check decides only what is left out,
never a number that is delivered, and the stack that is delivered is validated fresh.
"""
from __future__ import annotations

from dataclasses import dataclass

from bot.hardware import hardware_name
from bot.knowledge.records import patch_file_sha256
from bot.knowledge.store import Entry
from bot.tolerance import NO_FARTHER_WORDS
from runner.job import split_precision


def patch_sha256(entry: Entry) -> str:
    return patch_file_sha256(entry.patch_path)


@dataclass
class KnownVerdict:
    entry_id: str
    workload: str
    status: str  # accepted | rejected | held
    reason: str | None
    summary: str
    speedup: float | None  # eager
    recorded_at: str
    command: str
    numbers: dict  # the recorded per-workload record (bench.json gpu.validation.workloads[wl]) as JSON

    def line(self) -> str:
        sp = f"{self.speedup:.3f}x eager" if self.speedup else "no speed"
        return (f"{self.status}" + (f" ({self.reason})" if self.reason else "") + f", {sp}, recorded "
                f"{self.recorded_at} by `{self.command}`")


def known_verdict(entry: Entry, workload: str, hardware: str, base_sha: str, preset: str, dtype: str,
                  env: dict | None = None) -> tuple[KnownVerdict | None, str]:
    """(the recorded verdict, "") when it applies unchanged to this run, else (None, why not)."""
    gpu = entry.bench().gpu
    rec = gpu.validation_on(hardware) if gpu else None
    w = rec.workloads.get(workload) if rec else None
    if not w:
        return None, f"no GPU verdict recorded on {hardware}"
    renv = w.env or {}
    checks = [
        ("patch", w.patch_sha256, patch_sha256(entry)),
        ("base", w.base_sha, base_sha),
        ("preset", w.preset, preset),
        ("dtype", w.dtype, dtype),
        ("hardware", hardware_name("cuda", renv.get("device_name", "")), hardware),
    ]
    if env:
        checks += [("torch", renv.get("torch"), env.get("torch")), ("triton", renv.get("triton"), env.get("triton"))]
    for what, have, want in checks:
        if have != want:
            return None, f"recorded verdict is for another {what} ({have} vs {want})"
    # A rejection recorded before a mode only the candidate could run was timed against what a user of
    # the base runs instead (bot/validate/speed._enabled, 2026-12-05) left that mode out of the decision;
    # today's rule might accept it, so it is measured again (a mode timed under the rule names base_mode).
    unjudged = [m for m, sp in w.speed.items() if sp.outcome == "n/a" and sp.patched_process_ms
                and not sp.base_process_ms and not sp.base_mode]
    if w.status != "accepted" and unjudged:
        return None, (f"recorded rejection predates the rule for a mode only the candidate runs ({unjudged[0]}: "
                      f"the base cannot): measured again")
    # A quantized precision's verdict from before its second condition (no farther from the unquantized
    # model than the quantized base, 2026-12-06; bot/tolerance.py) was judged by another rule.
    if split_precision(dtype)[1] and NO_FARTHER_WORDS not in (w.rule or ""):
        return None, "recorded verdict predates the rule against the unquantized model: measured again"
    eager = w.speed.get("eager")
    return KnownVerdict(entry.id, workload, w.status or "held", w.reason, w.summary or "",
                        eager.speedup if eager else None, rec.recorded_at or "", rec.command or "", w.to_json()), ""


def stack_key(stack_sha256: str, base_sha: str, preset: str, dtype: str, hardware: str, env: dict | None) -> dict:
    """The fields of records.StackKey a recorded stack result must hold to apply to this stack."""
    env = env or {}
    return {"stack_sha256": stack_sha256, "base_sha": base_sha, "preset": preset, "dtype": dtype,
            "hardware": hardware, "torch": env.get("torch"), "triton": env.get("triton")}


def known_ablation(entries: list[Entry], workload: str, stack_sha256: str, hardware: str, base_sha: str,
                   preset: str, dtype: str, env: dict | None, rounds: int) -> tuple[dict | None, str]:
    """(the recorded leave-one-out of this exact stack as JSON, "") when every member entry holds it
    and it applies unchanged (at least `rounds` rounds), else (None, why not)."""
    if not entries:
        return None, "no member entries"
    want = stack_key(stack_sha256, base_sha, preset, dtype, hardware, env)
    found = None
    for e in entries:
        gpu = e.bench().gpu
        rec = gpu.ablation.get(workload) if gpu else None
        if rec is None:
            return None, f"{e.id}: no leave-one-out recorded for {workload}"
        for k, v in want.items():
            if getattr(rec, k) != v:
                return None, (f"{e.id}: recorded leave-one-out is for another {k.replace('_sha256', '')} "
                              f"({getattr(rec, k)} vs {v})")
        if (rec.rounds or 0) < rounds:
            return None, f"{e.id}: recorded leave-one-out has {rec.rounds} rounds, {rounds} asked"
        found = found or rec
    if {r.entry for r in found.rows} != {e.id for e in entries}:
        return None, "recorded leave-one-out rows name other entries than this stack's"
    return found.to_json(), ""


def known_stack_check(entries: list[Entry], workload: str, stack_sha256: str, hardware: str, base_sha: str,
                      preset: str, dtype: str, env: dict | None):
    """The recorded check (records.StackCheckRecord) of exactly this stack, when one of its member
    entries holds one for the same diff, base, workload, preset, dtype, hardware, torch and triton
    whose members are exactly these entries; else None."""
    want = stack_key(stack_sha256, base_sha, preset, dtype, hardware, env)
    ids = sorted(e.id for e in entries)
    for e in entries:
        gpu = e.bench().gpu
        for rec in reversed(gpu.stack_checks.get(workload, []) if gpu else []):
            if all(getattr(rec, k) == v for k, v in want.items()) and sorted(rec.entries) == ids:
                return rec
    return None
