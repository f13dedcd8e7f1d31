"""The knowledge loop's numbers (benchmarks/gpu_loop.sh, issue 18), from the two runs' `--json`
results: each run's gain and GPU time, run 2 against run 1, and for every candidate of both runs the
analyzer's estimate against what was realized (alone: its own verdict; in the stack: its
leave-one-out contribution).

    python3 benchmarks/loop_summary.py RUN1.json RUN2.json      # markdown on stdout

Gains are eager ms/step from the validator's interleaved timing (median of the process medians):
the mode every workload runs. A run 2 that reused a verdict or a leave-one-out says so in `how`.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def eager_gain(verdict: dict | None) -> float | None:
    """base - candidate, eager ms/step, from a Verdict's `speed` rows."""
    for s in (verdict or {}).get("speed") or []:
        if s.get("mode") == "eager" and s.get("base_ms") and s.get("candidate_ms"):
            return statistics.median(s["base_ms"]) - statistics.median(s["candidate_ms"])
    return None


def run_row(d: dict) -> dict:
    comb = d.get("combine") or {}
    st_file = Path(d.get("run_dir", "")) / "state.json"
    steps = json.loads(st_file.read_text()).get("steps", {}) if st_file.is_file() else {}
    return {"run_id": d["run_id"], "gain": eager_gain(comb.get("stack_verdict")) or 0.0, "gpu_s": d.get("gpu_s") or 0.0,
            "per_step": {k: v.get("gpu_s", 0) for k, v in steps.items() if v.get("gpu_s")},
            "stack_status": (comb.get("stack_verdict") or {}).get("status", "none")}


def candidate_rows(d: dict) -> list[dict]:
    comb = d.get("combine") or {}
    verdicts = (d.get("validate") or {}).get("verdicts") or {}
    sha_of = {c["candidate_id"]: c["sha"] for c in comb.get("commits") or []}
    ab = comb.get("ablation") or {}
    contrib = {r["sha"]: r.get("contribution_ms") for r in ab.get("rows") or []}
    single = len(sha_of) == 1 and not contrib  # one commit: the stack's verdict is its contribution
    rows = []
    for c in (d.get("generate") or {}).get("candidates") or []:
        v = verdicts.get(c["id"])
        loo = contrib.get(sha_of.get(c["id"], ""))
        if loo is None and single and c["id"] in sha_of:
            loo = eager_gain(comb.get("stack_verdict"))
        how = []
        if v and v.get("reused_from"):
            how.append("verdict reused")
        if comb.get("ablation_known_from") and c["id"] in sha_of:
            how.append("leave-one-out known")
        rows.append({"id": c["id"], "kind": c.get("kind", ""), "estimate": c.get("estimated_gain_ms"),
                     "status": (v or {}).get("status", "not validated"), "alone": eager_gain(v),
                     "in_stack": loo, "how": ", ".join(how)})
    return rows


def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def render(runs: list[dict]) -> str:
    out = ["| run | id | stack | gain ms/step (eager) | GPU-s | GPU-s per step |", "|---|---|---|---:|---:|---|"]
    rows = [run_row(d) for d in runs]
    for i, r in enumerate(rows, 1):
        per = ", ".join(f"{k} {v:.0f}" for k, v in r["per_step"].items())
        out.append(f"| {i} | {r['run_id']} | {r['stack_status']} | {r['gain']:.1f} | {r['gpu_s']:.1f} | {per} |")
    if len(rows) == 2 and rows[0]["gain"] > 0 and rows[0]["gpu_s"] > 0:
        g, t = rows[1]["gain"] / rows[0]["gain"], rows[1]["gpu_s"] / rows[0]["gpu_s"]
        out += ["", f"run 2 reached {100 * g:.1f}% of run 1's gain in {100 * t:.1f}% of its GPU time "
                    f"(issue 18 asks >= 95% in <= 25%)"]
    out += ["", "| run | candidate | kind | estimate ms | verdict | alone ms | in the stack ms (leave-one-out) | "
                "realized / estimate | how |", "|---|---|---|---:|---|---:|---:|---:|---|"]
    for i, d in enumerate(runs, 1):
        for c in candidate_rows(d):
            real = c["in_stack"] if c["in_stack"] is not None else c["alone"]
            ratio = f"{real / c['estimate']:.2f}" if real is not None and c["estimate"] else "-"
            out.append(f"| {i} | {c['id']} | {c['kind']} | {_ms(c['estimate'])} | {c['status']} | {_ms(c['alone'])} | "
                       f"{_ms(c['in_stack'])} | {ratio} | {c['how']} |")
    return "\n".join(out)


if __name__ == "__main__":
    found = [Path(a) for a in sys.argv[1:] if Path(a).is_file()]
    for a in sys.argv[1:]:
        if not Path(a).is_file():
            print(f"{a}: no result (the run did not finish)")
    print(render([json.loads(f.read_text()) for f in found]))
