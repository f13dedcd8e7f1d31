"""benchmarks/loop_summary.py over real `optimize --json` results committed from the H200: the
gain comes from the stack's eager speed rows, a one-commit stack's contribution is the stack's
verdict, and a stack that was not ablated shows no contribution."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
R = ROOT / "benchmarks/results/h200-template-20261203"
sys.path.insert(0, str(ROOT / "benchmarks"))

import loop_summary  # noqa: E402


def _load(rel):
    return json.loads((R / rel).read_text())


def test_gain_estimates_and_contributions_from_real_runs():
    q = _load("qwen-image-grouped/optimize-qwen-image.json")
    s = _load("sd3.5-large-full/optimize-sd3.5-large.json")
    eager = next(x for x in q["combine"]["stack_verdict"]["speed"] if x["mode"] == "eager")
    want = statistics.median(eager["base_ms"]) - statistics.median(eager["candidate_ms"])
    assert abs(loop_summary.run_row(q)["gain"] - want) < 1e-9 and 17 < want < 18
    (row,) = loop_summary.candidate_rows(q)
    assert row["status"] == "accepted" and row["in_stack"] == loop_summary.eager_gain(q["combine"]["stack_verdict"])
    assert row["estimate"] == q["generate"]["candidates"][0]["estimated_gain_ms"]
    rows = loop_summary.candidate_rows(s)  # two commits, --ablation-rounds 0: no contribution known
    assert len(rows) == 2 and all(r["in_stack"] is None for r in rows)
    text = loop_summary.render([q, s])
    assert "run 2 reached" in text and "| 1 | template-fuse-norm-consumer-1c4f167429 |" in text
