"""`optbot bench` on CPU: rows, reference comparison in a separate process, device labels."""
from __future__ import annotations

import json

import torch

from runner.kinds.bench_compare import compare_tensors
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


def test_compare_tensors_reasons():
    ref = torch.randn(4, 5, dtype=torch.float64)
    tol = {"rel_l2": 1e-3, "atol": 1e-3, "rtol": 1e-3}
    assert compare_tensors(ref.clone(), ref, tol)["ok"]
    bad = ref.clone()
    bad[2, 3] += 1.0
    res = compare_tensors(bad, ref, tol)
    assert not res["ok"] and res["where"] == [2, 3] and "rel L2" in res["reason"]
    nan = ref.clone()
    nan[1, 1] = float("nan")
    res = compare_tensors(nan, ref, tol)
    assert not res["ok"] and "non-finite" in res["reason"] and "[1, 1]" in res["reason"]
    assert not compare_tensors(ref[:2], ref, tol)["ok"]
    assert compare_tensors(ref.clone(), ref, None)["reason"] == "bit-exact"
    assert not compare_tensors(ref + 1e-12, ref, None)["ok"]
