"""The typed verdict of a validation, with every number that justifies it.

status  accepted | rejected | held (a person decides: implausible results)
reason  None when accepted; else one of REASONS
Every part serializes to JSON (``to_json``) and prints as a plain-text report (``render``), and
each label says which device measured what (CPU timings never pass for GPU results).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("accepted", "rejected", "held")
REASONS = ("correctness", "slower", "no-change", "not-engaged", "crashed", "timeout", "implausible")


@dataclass
class OutputCheck:
    label: str  # shape and seed, e.g. "256x256/txt32/b1 seed 81723"
    output: str  # output name, e.g. noise_pred
    ok: bool
    reason: str  # "noise_pred: max abs 3.1e-06 at [0, 17, 5], rel L2 2e-07"
    max_abs: float | None = None
    at: list[int] | None = None
    rel_l2: float | None = None
    violations: int | None = None
    nonfinite: int | None = None
    # "" : against the base's output. "unquantized" (a quantized precision): against the unquantized
    # model's; rel_l2 is the candidate's distance from it and base_rel_l2 the quantized base's
    # (runner/kinds/compare.py `farther`)
    against: str = ""
    base_rel_l2: float | None = None


@dataclass
class Correctness:
    ok: bool
    seeds: list[int]
    shapes: list[str]
    rule: str  # "bit-exact" or "rel_l2 <= x and |d| <= atol + rtol*|ref| (float32)"
    checks: list[OutputCheck] = field(default_factory=list)
    inputs_modified: list[str] = field(default_factory=list)  # one line per modified input
    poison: str = ""
    kernels: list[dict] = field(default_factory=list)  # kernel_check results (per test module)

    def worst(self) -> OutputCheck | None:
        bad = [c for c in self.checks if not c.ok]
        if bad:
            return bad[0]
        ranked = [c for c in self.checks if c.rel_l2 is not None and not c.against]  # distances from the base
        return max(ranked, key=lambda c: c.rel_l2) if ranked else None


@dataclass
class Speed:
    mode: str  # a production mode (runner/modes.py): eager | graph | compile | compile+graph
    device: str  # cuda | cpu: the clock that measured this
    base_ms: list[float] = field(default_factory=list)  # per-step median of each base process
    candidate_ms: list[float] = field(default_factory=list)
    speedup: float | None = None  # base / candidate (mean of process medians)
    noise_pct: float | None = None  # A/A: the two base processes, and the spread within them
    # faster | slower | no-change | failed (the candidate only) | enabled (a graph mode the base cannot
    # capture, faster than the base's run without the graph: base_mode) | n/a (the base too, or not timed)
    outcome: str = "n/a"
    note: str = ""  # e.g. capture failure, "cpu: informational"
    base_mode: str = ""  # the base's mode the speedup is against, where not this mode (outcome "enabled")
    n: int = 0  # trials per process
    passes: int = 1  # forward passes per step (per-pass = step / passes)


def vs_base(base_mode: str | None) -> str:
    """The words every report, summary and lesson puts after a speedup against another mode of the
    base (outcome "enabled": ' vs the base's eager'); "" for a speedup against the same mode."""
    return f" vs the base's {base_mode}" if base_mode else ""


@dataclass
class Engagement:
    ok: bool
    reason: str
    declared_adds: list[str] = field(default_factory=list)
    declared_removes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # declared added, not seen in the step
    still_present: list[str] = field(default_factory=list)  # declared removed, still seen
    changed_ops: list[str] = field(default_factory=list)  # histogram differences (a sample)
    # ms per kernel category (runner/categorize.py) of one eager step under the profiler, each side, on the
    # validation's device: what the change moved, and for the stack what is left (bot/deliver/report.py)
    base_categories: dict[str, float] = field(default_factory=dict)
    candidate_categories: dict[str, float] = field(default_factory=dict)
    # every module pattern whose op/kernel counts differ between the two (runner/module_pattern.py; "" for
    # top level): the places the change acts on, measured; None in verdicts recorded before it was kept
    changed_modules: list[str] | None = None


@dataclass
class Verdict:
    status: str
    reason: str | None
    summary: str  # one line: why
    workload: str
    preset: str
    device: str
    dtype: str
    base_sha: str
    candidate_sha: str
    candidate: str  # what the user passed (ref or patch path)
    trailers: dict[str, list[str]] = field(default_factory=dict)
    correctness: Correctness | None = None
    engagement: Engagement | None = None
    speed: list[Speed] = field(default_factory=list)
    implausible: str = ""
    crash: dict[str, Any] = field(default_factory=dict)  # {"job", "status", "returncode", "log", "log_tail"}
    health: str = ""  # health probe after a GPU fault
    notes: list[str] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)
    run_dir: str = ""
    seconds: float = 0.0
    # set when this verdict was not measured now but taken from the store's record of the same patch,
    # base, workload, preset, dtype, hardware, torch and triton (bot/steps/validate.py): says which
    # record, so no reader takes it for a fresh measurement and learn does not record it again; a
    # stack of one commit carries its candidate's verdict with this saying so (bot/steps/combine.py)
    reused_from: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"verdict status {self.status!r} not in {STATUSES}")
        if self.reason is not None and self.reason not in REASONS:
            raise ValueError(f"verdict reason {self.reason!r} not in {REASONS}")

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    def speedup(self, mode: str = "eager") -> float | None:
        for s in self.speed:
            if s.mode == mode:
                return s.speedup
        return None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        """The Verdict `to_json` wrote (bot/jsonable.py, the run directory's one codec)."""
        from bot.jsonable import from_json
        return from_json(cls, d)

    # ----------------------------------------------------------------------------------------
    def render(self) -> str:
        head = self.status.upper() + (f" ({self.reason})" if self.reason else "")
        lines = [
            f"verdict: {head}: {self.summary}",
            f"  {self.workload} · preset {self.preset} · {self.device} · {self.dtype} · "
            f"base {self.base_sha[:12]} -> candidate {self.candidate_sha[:12]} ({self.candidate})",
        ]
        if self.env:
            lines.append(f"  measured on: {self.env.get('device_kind')} ({self.env.get('device_name')}) · "
                         f"torch {self.env.get('torch')} · triton {self.env.get('triton')}")
        if self.crash.get("mode"):  # the job finished; one production mode failed in it
            lines.append(f"  {self.crash.get('job')} job: {self.crash['mode']} failed for the candidate and ran for "
                         f"the base: {self.crash.get('error', '')[:300]}; log {self.crash.get('log')}")
        elif self.crash:
            lines.append(f"  {self.crash.get('job')} job: {self.crash.get('status')} "
                         f"(return code {self.crash.get('returncode')}); log {self.crash.get('log')}")
            tail = (self.crash.get("log_tail") or "").strip().splitlines()[-12:]
            lines += ["    | " + t for t in tail]
        if self.health:
            lines.append(f"  health probe: {self.health}")
        c = self.correctness
        if c is not None:
            lines.append(f"  correctness: {'PASS' if c.ok else 'FAIL'} · seeds {c.seeds} · shapes {c.shapes} · {c.rule}")
            for m in c.inputs_modified:
                lines.append(f"    input modified: {m}")
            ref = any(ch.against for ch in c.checks)  # a quantized precision: the base's own distance too
            rows = [["shape / seed", "output", "max abs", "at", "rel L2", *(["base's"] if ref else []), "ok"]]
            for ch in c.checks:
                rows.append([ch.label, ch.output, _g(ch.max_abs), str(ch.at or ""), _g(ch.rel_l2),
                             *([_g(ch.base_rel_l2) if ch.against else ""] if ref else []), "yes" if ch.ok else "NO"])
            if len(rows) > 1:
                lines += ["    " + r for r in _table(rows)]
            for ch in c.checks:
                if not ch.ok:
                    lines.append(f"    FAIL {ch.label}: {ch.reason}")
            for k in c.kernels:
                bad = [x for x in k.get("cases", []) if not x["ok"]]
                lines.append(f"    kernel {k.get('name')}: {len(k.get('cases', [])) - len(bad)}/{len(k.get('cases', []))} "
                             f"cases pass" + (f"; first failure {bad[0]['shape']} seed {bad[0]['seed']}: {bad[0]['reason']}" if bad else ""))
                micro = k.get("micro")
                if isinstance(micro, str):
                    lines.append(f"      micro: {micro}")
                elif isinstance(micro, dict):
                    lines.append("      micro (cuda, shape {}): {}".format(micro.get("shape"), "; ".join(
                        f"{n} {v['median_ms']:.4f} ms" if isinstance(v, dict) else f"{n}: {v}"
                        for n, v in micro.items() if n != "shape")))
        e = self.engagement
        if e is not None:
            lines.append(f"  engagement: {'PASS' if e.ok else 'FAIL'} · {e.reason}")
        if self.speed:
            rows = [["speed", "device", "base ms (per process)", "candidate ms", "speedup", "A/A noise", "outcome"]]
            for s in self.speed:
                rows.append([s.mode, s.device, " ".join(f"{x:.3f}" for x in s.base_ms),
                             " ".join(f"{x:.3f}" for x in s.candidate_ms),
                             f"{s.speedup:.3f}x" if s.speedup else "-",
                             f"{s.noise_pct:.2f}%" if s.noise_pct is not None else "-",
                             s.outcome + (f" ({s.note})" if s.note else "")])
            lines += ["  " + r for r in _table(rows)]
        if self.implausible:
            lines.append(f"  implausible: {self.implausible}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        if self.run_dir:
            lines.append(f"  run directory: {self.run_dir} ({self.seconds:.0f} s)")
        return "\n".join(lines)


def _g(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return out
