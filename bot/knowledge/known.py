"""What the store already knows about an entry on this hardware: its recorded GPU verdict.

`store check --device cuda --record` (or `store record-bench`) keeps, per workload, the validator's
verdict on the entry's replayed commit in bench.json `gpu.validation`. A later run may use that
verdict instead of measuring again only when everything that determined it is unchanged:

  the patch         sha256 of patch.diff recorded with the verdict == the file now
  the engine base   the verdict's base sha == this run's base sha
  the workload      same workload, preset and dtype
  the machine       same hardware name (e.g. h200), torch and triton versions

Anything else, or no record, means unknown: the candidate is validated as usual. The stack that a
run delivers is always validated fresh, on new seeds (bot/steps/combine.py).

The stack's leave-one-out ablation is an attribution (which entry gives how much), not the run's
number. A run that measured one records it in every member entry's bench.json `gpu.ablation`
(bot/learn.record_ablation); a later run whose stack has the same diff (sha256 of `git diff base
head`), base, workload, preset, dtype, hardware, torch and triton reuses it (known_ablation).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from bot.knowledge.store import Entry


def patch_file_sha256(path: Path) -> str:
    """The key a recorded verdict or variant search is tied to: the bytes of an entry's patch.diff."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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
    numbers: dict  # the recorded per-workload record (bench.json gpu.validation.workloads[wl])

    def line(self) -> str:
        sp = f"{self.speedup:.3f}x eager" if self.speedup else "no speed"
        return (f"{self.status}" + (f" ({self.reason})" if self.reason else "") + f", {sp}, recorded "
                f"{self.recorded_at} by `{self.command}`")


def known_verdict(entry: Entry, workload: str, hardware: str, base_sha: str, preset: str, dtype: str,
                  env: dict | None = None) -> tuple[KnownVerdict | None, str]:
    """(the recorded verdict, "") when it applies unchanged to this run, else (None, why not)."""
    from bot.knowledge.learn import hardware_name

    rec = (entry.bench().get("gpu") or {}).get("validation") or {}
    w = (rec.get("workloads") or {}).get(workload)
    if not w:
        return None, "no GPU verdict recorded"
    renv = w.get("env") or {}
    checks = [
        ("patch", w.get("patch_sha256"), patch_sha256(entry)),
        ("base", w.get("base_sha"), base_sha),
        ("preset", w.get("preset"), preset),
        ("dtype", w.get("dtype"), dtype),
        ("hardware", hardware_name("cuda", renv.get("device_name", "")), hardware),
    ]
    if env:
        checks += [("torch", renv.get("torch"), env.get("torch")), ("triton", renv.get("triton"), env.get("triton"))]
    for what, have, want in checks:
        if have != want:
            return None, f"recorded verdict is for another {what} ({have} vs {want})"
    eager = (w.get("speed") or {}).get("eager") or {}
    return KnownVerdict(entry.id, workload, w.get("status", "held"), w.get("reason"), w.get("summary", ""),
                        eager.get("speedup"), rec.get("recorded_at", ""), rec.get("command", ""), w), ""


def validation_numbers(verdict: dict) -> dict:
    """The end-to-end numbers of one verdict (bot/verdict.Verdict as JSON), copied, not computed:
    per mode the process medians of each side, their speedup and A/A noise; the worst output."""
    import statistics

    speed = {}
    for sp in verdict.get("speed") or []:
        b, c = sp.get("base_ms") or [], sp.get("candidate_ms") or []
        passes = sp.get("passes") or 1
        speed[sp["mode"]] = {
            "device": sp.get("device"), "base_step_ms": statistics.median(b) if b else None,
            "patched_step_ms": statistics.median(c) if c else None, "passes": passes,
            "base_per_pass_ms": statistics.median(b) / passes if b else None,
            "patched_per_pass_ms": statistics.median(c) / passes if c else None,
            "speedup": sp.get("speedup"), "noise_pct": sp.get("noise_pct"), "outcome": sp.get("outcome"),
            "base_process_ms": b, "patched_process_ms": c, "trials_per_process": sp.get("n"), "note": sp.get("note")}
    corr = verdict.get("correctness") or {}
    ranked = [ch for ch in corr.get("checks", []) if ch.get("rel_l2") is not None]
    worst = max(ranked, key=lambda ch: ch["rel_l2"]) if ranked else None
    return {"status": verdict.get("status"), "reason": verdict.get("reason"), "summary": verdict.get("summary"),
            "preset": verdict.get("preset"), "dtype": verdict.get("dtype"), "base_sha": verdict.get("base_sha"),
            "candidate_sha": verdict.get("candidate_sha"), "seeds": corr.get("seeds"), "shapes": corr.get("shapes"),
            "rule": corr.get("rule"), "worst_output": {"label": worst.get("label"), "output": worst.get("output"),
                                                       "rel_l2": worst.get("rel_l2"), "max_abs": worst.get("max_abs")}
            if worst else None, "speed": speed, "env": verdict.get("env"), "seconds": verdict.get("seconds")}


def known_ablation(entries: list[Entry], workload: str, stack_sha256: str, hardware: str, base_sha: str,
                   preset: str, dtype: str, env: dict | None, rounds: int) -> tuple[dict | None, str]:
    """(the recorded leave-one-out of this exact stack, "") when every member entry holds it and it
    applies unchanged (at least `rounds` rounds), else (None, why not)."""
    if not entries:
        return None, "no member entries"
    env = env or {}
    want = {"stack_sha256": stack_sha256, "base_sha": base_sha, "preset": preset, "dtype": dtype,
            "hardware": hardware, "torch": env.get("torch"), "triton": env.get("triton")}
    found = None
    for e in entries:
        rec = (((e.bench().get("gpu") or {}).get("ablation") or {}).get(workload)) or {}
        if not rec:
            return None, f"{e.id}: no leave-one-out recorded for {workload}"
        for k, v in want.items():
            if rec.get(k) != v:
                return None, f"{e.id}: recorded leave-one-out is for another {k.replace('_sha256', '')} ({rec.get(k)} vs {v})"
        if (rec.get("rounds") or 0) < rounds:
            return None, f"{e.id}: recorded leave-one-out has {rec.get('rounds')} rounds, {rounds} asked"
        found = found or rec
    ids = {e.id for e in entries}
    if {r.get("entry") for r in found.get("rows", [])} != ids:
        return None, "recorded leave-one-out rows name other entries than this stack's"
    return found, ""
