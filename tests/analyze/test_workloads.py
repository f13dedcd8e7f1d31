"""Issue 4's done-when checks on the tiny presets (CPU): `optbot analyze` on the real FLUX.2 and
Qwen-Image DiTs of the diffusers engine. These tests may look at module names to check the
answer; the detectors never do."""
from __future__ import annotations

import json

import pytest

from bot.analyze.opportunity import KINDS


def _analyze(cli_runner, tmp_path, workload, extra=()):
    from bot.cli import cli

    out = tmp_path / f"{workload}.json"
    res = cli_runner.invoke(cli, ["analyze", workload, "--preset", "tiny", "--device", "cpu", "--iters", "1",
                                  "--json", str(out), "--top", "40", *extra])
    assert res.exit_code == 0, res.output
    a = json.loads(out.read_text())
    assert out.with_suffix(".md").is_file()
    assert a["profile"]["device"].startswith("cpu") and a["graph"]["device"] == "cpu"
    assert "profile measured on: cpu" in res.output
    return a


def _find(a, kind, detail=None, pattern=None, member=None, op=None):
    hits = []
    for o in a["opportunities"]:
        if o["kind"] != kind or (detail and o["detail"] != detail):
            continue
        if pattern and pattern not in o["location"]["module_pattern"]:
            continue
        if member and not any(m.endswith(member) for m in o["facts"].get("members", [])):
            continue
        if op and not any(op in x for x in o["ops"]):
            continue
        hits.append(o)
    return hits


@pytest.mark.slow
def test_flux2_tiny(diffusers_engine, cli_runner, tmp_path):
    a = _analyze(cli_runner, tmp_path, "flux2")
    # the separate Q/K/V projections of the double-stream blocks, and the text stream's added ones
    qkv = _find(a, "merge-siblings", member="attn.to_q")
    assert qkv and {m.rsplit(".", 1)[-1] for m in qkv[0]["facts"]["members"]} == {"to_q", "to_k", "to_v"}
    assert qkv[0]["location"]["instances"] == 2 and qkv[0]["location"]["module_pattern"] == "transformer_blocks.*.attn.to_q"
    added = _find(a, "merge-siblings", member="attn.add_q_proj")
    assert added and {m.rsplit(".", 1)[-1] for m in added[0]["facts"]["members"]} == {"add_q_proj", "add_k_proj", "add_v_proj"}
    # QK RMSNorm and RoPE as separate passes (double- and single-stream blocks)
    qk = _find(a, "attention-waste", "qk-norm-rope")
    pats = {o["location"]["module_pattern"] for o in qk}
    assert any(p.startswith("transformer_blocks.*") for p in pats) and any(p.startswith("single_transformer_blocks.*") for p in pats)
    # norm-and-modulation chains
    nm = _find(a, "fuse-norm-consumer")
    assert {"transformer_blocks.*.norm1", "transformer_blocks.*.norm2", "single_transformer_blocks.*.norm"} <= \
        {o["location"]["module_pattern"] for o in nm}
    assert all("mul" in o["facts"]["consumers"] and "add" in o["facts"]["consumers"] for o in nm
               if o["location"]["module_pattern"] == "transformer_blocks.*.norm1")
    # the SwiGLU intermediate
    glu = _find(a, "fuse-elementwise-chain", "gated-activation")
    assert any("ff" in o["location"]["module_pattern"] for o in glu)
    assert any(o["location"]["module_pattern"].startswith("single_transformer_blocks") for o in glu)
    # every opportunity carries what a later validation compares against
    for o in a["opportunities"]:
        assert o["kind"] in KINDS
        assert {"estimated_ms", "basis", "profile_device"} <= set(o["estimate"])
        assert o["gain_ms"] >= 0 and 0 < o["confidence"] <= 1
    gains = [o["gain_ms"] for o in a["opportunities"]]
    assert gains == sorted(gains, reverse=True)


@pytest.mark.slow
def test_qwen_image_tiny(diffusers_engine, cli_runner, tmp_path):
    a = _analyze(cli_runner, tmp_path, "qwen-image")
    # the timestep-only modulation recomputed in both CFG passes
    cfg = _find(a, "cfg-invariant-cache", op="img_mod")
    assert cfg and cfg[0]["location"]["instances"] == 3
    assert "prompt" not in cfg[0]["facts"]["depends_on"] and "timestep" in cfg[0]["facts"]["depends_on"]
    # no text mask reaches the model (the pipelines drop an all-ones one), so none is found to drop;
    # tests/analyze/test_detectors_synthetic.py finds one where a model is given it
    assert not _find(a, "attention-waste", "mask-masks-nothing")
    # norm-and-modulation chains
    nm = _find(a, "fuse-norm-consumer")
    assert {"transformer_blocks.*.img_norm1", "transformer_blocks.*.img_norm2", "transformer_blocks.*.txt_norm1",
            "transformer_blocks.*.txt_norm2"} <= {o["location"]["module_pattern"] for o in nm}
    # the bias adds: GEMM bias + gate + residual into the GEMM epilogue
    bias = _find(a, "absorb-bias", "gemm-epilogue")
    assert bias and any(o["facts"]["gemm_has_bias"] for o in bias)


def test_bad_profile_file_is_a_clear_error(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    r = subprocess.run([sys.executable, "-m", "bot", "analyze", "flux2", "--profile", str(bad)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert r.returncode == 2
    assert "p.json: not a profile JSON" in r.stderr and "Traceback" not in r.stderr
    bad.write_text(json.dumps({"kernels": []}))
    r = subprocess.run([sys.executable, "-m", "bot", "analyze", "flux2", "--profile", str(bad)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert r.returncode == 2 and "key 'total_ms' missing" in r.stderr


def test_bot_side_of_analyze_never_imports_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, importlib, bot.cli, bot.analyze.run, bot.analyze.detectors as d\n"
            "[importlib.import_module('bot.analyze.detectors.' + n) for n in d.ORDER]\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.stdout.strip() == "False", r.stderr
