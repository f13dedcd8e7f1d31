"""`optbot bench` on CPU: rows, reference comparison in a separate process, device labels."""
from __future__ import annotations

import json

from tests.test_cli_profile import ROOT, optbot


def test_bench_cpu_rows_and_correctness(diffusers_engine, tmp_path):
    out = tmp_path / "b.json"
    # the honest merged-QKV patch: a real candidate whose fp32 outputs are bit-identical on CPU
    patch = ROOT / "tests" / "validate" / "adversarial" / "honest_merge_qkv.patch"
    r = optbot("bench", "flux2", "--candidate", str(patch), "--modes", "eager,graph,compile,compile:whole",
               "--other-modes", "eager,compile", "--compile-backend", "aot_eager", "--iters", "2", "--json", str(out))
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
    # the compile recipes ran, correct, and the fastest correct one is the bar every row is set against
    compiled = [rows[("upstream", m)] for m in ("compile", "compile:whole")]
    assert all(x["correct"] and x["median_ms"] for x in compiled), compiled
    best = min(compiled, key=lambda x: x["median_ms"])
    assert (b["best_compile_mode"], b["best_compile_ms"]) == (best["mode"], best["median_ms"])
    assert rows[("candidate", "compile")]["correct"] is True
    assert rows[("candidate", "compile")]["vs_compile"] == best["median_ms"] / rows[("candidate", "compile")]["median_ms"]
    assert f"{best['mode']} at {best['median_ms']:.2f} ms/step" in out.with_suffix(".md").read_text()


def test_bench_keeps_the_rows_that_ran_when_a_mode_fails(diffusers_engine, tmp_path):
    """A candidate that breaks under torch.compile: its compile row carries the error, its eager row
    and every upstream row stay."""
    out = tmp_path / "b.json"
    patch = ROOT / "tests" / "validate" / "adversarial" / "compile_only_crash.patch"
    r = optbot("bench", "flux2", "--candidate", str(patch), "--modes", "eager,compile", "--other-modes",
               "eager,compile", "--compile-backend", "aot_eager", "--iters", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {(x["variant"], x["mode"]): x for x in json.loads(out.read_text())["rows"]}
    assert rows[("candidate", "eager")]["correct"] is True and rows[("candidate", "eager")]["median_ms"]
    assert rows[("candidate", "compile")]["error"] and rows[("candidate", "compile")]["median_ms"] is None
    assert rows[("upstream", "compile")]["median_ms"] and rows[("upstream", "compile")]["correct"] is True


