"""`optbot bench` on CPU: rows, reference comparison in a separate process, device labels."""
from __future__ import annotations

import json

from tests.test_cli_profile import optbot


def test_bench_cpu_rows_and_correctness(diffusers_engine, tmp_path):
    out = tmp_path / "b.json"
    r = optbot("bench", "flux2", "--candidate", diffusers_engine.base_sha, "--modes", "eager,graph", "--iters", "2",
               "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    b = json.loads(out.read_text())
    assert b["device"] == "cpu" and b["env"]["device_kind"] == "cpu"
    rows = {(x["variant"], x["mode"]): x for x in b["rows"]}
    assert rows[("upstream", "eager")]["correctness"] == "reference"
    cand = rows[("candidate", "eager")]
    assert cand["correct"] is True and cand["comparison"]["noise_pred"]["rel_l2"] == 0.0  # same commit: bit-identical
    assert "needs a CUDA device" in rows[("upstream", "graph")]["error"]
    assert b["roofline_ms"] > 0 and "measured in this run (cpu)" in b["roofline_basis"]
    assert "measured on cpu" in r.stdout


