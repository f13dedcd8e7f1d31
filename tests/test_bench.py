"""`optbot bench` on CPU: rows, reference comparison in a separate process, device labels."""
from __future__ import annotations

import json

from tests.test_cli_profile import ROOT, optbot


def test_bench_cpu_rows_and_correctness(diffusers_engine, tmp_path):
    out = tmp_path / "b.json"
    # the honest merged-QKV patch: a real candidate whose fp32 outputs are bit-identical on CPU
    patch = ROOT / "tests" / "validate" / "adversarial" / "honest_merge_qkv.patch"
    r = optbot("bench", "flux2", "--candidate", str(patch), "--modes", "eager,graph", "--iters", "2",
               "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    b = json.loads(out.read_text())
    assert b["device"] == "cpu" and b["env"]["device_kind"] == "cpu"
    rows = {(x["variant"], x["mode"]): x for x in b["rows"]}
    assert rows[("upstream", "eager")]["correctness"] == "reference"
    cand = rows[("candidate", "eager")]
    assert cand["correct"] is True and cand["comparison"]["noise_pred"]["rel_l2"] == 0.0
    assert "needs a CUDA device" in rows[("upstream", "graph")]["error"]
    assert b["roofline_ms"] > 0 and "measured in this run (cpu)" in b["roofline_basis"]
    assert "measured on cpu" in r.stdout


