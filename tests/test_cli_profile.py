"""`optbot profile` as a user runs it: a real subprocess, real exit codes, no tracebacks on errors."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def optbot(*args, cwd=None, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "bot", *args], capture_output=True, text=True, cwd=cwd or ROOT,
                          env=env, timeout=timeout)


@pytest.mark.parametrize("wl", ["flux2", "qwen-image"])
def test_profile_prints_table_and_writes_json_md_png(diffusers_engine, tmp_path, wl):
    out = tmp_path / f"{wl}.json"
    r = optbot("profile", wl, "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "time by category (cpu)" in r.stdout and "measured on: cpu" in r.stdout
    assert "transformer_blocks." in r.stdout  # module attribution in the table
    p = json.loads(out.read_text())
    assert {"total_ms", "categories", "kernels", "device", "env"} <= set(p)
    assert p["device"] == "cpu" and p["env"]["device_kind"] == "cpu"
    assert set(p["categories"]) == {"gemm", "attention", "normalization", "elementwise", "copy", "quantization", "other"}
    assert p["categories"]["gemm"] > 0 and p["categories"]["attention"] > 0
    k = p["kernels"][0]
    assert {"name", "category", "module", "calls", "ms"} <= set(k)
    assert p["roofline"]["linear_tflop"] > 0 and p["roofline"]["attention_tflop"] > 0
    assert out.with_suffix(".md").read_text().startswith(f"# optbot profile: {wl}")
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert p["passes"] == (2 if wl == "qwen-image" else 1)


def _assert_clean_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    for n in needles:
        assert n in r.stderr, r.stderr


def test_unknown_workload():
    _assert_clean_error(optbot("profile", "sdxl"), "unknown workload 'sdxl'", "flux2")


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: bad\nfamily: [flux2\n")
    _assert_clean_error(optbot("profile", str(p)), "malformed YAML", "line", str(p))


def test_missing_engine_ref(diffusers_engine):
    _assert_clean_error(optbot("profile", "flux2", "--ref", "no-such-ref"), "ref 'no-such-ref' not found")


def test_model_class_not_found(diffusers_engine, tmp_path):
    d = yaml.safe_load((ROOT / "workloads" / "flux2.yaml").read_text())
    d["engines"]["diffusers"]["model_class"] = "diffusers.models.transformers.transformer_flux2.Flux9Model"
    p = tmp_path / "flux9.yaml"
    p.write_text(yaml.safe_dump(d))
    _assert_clean_error(optbot("profile", str(p)), "engines.diffusers.model_class", "Flux9Model")


def test_bad_device_and_no_cuda():
    _assert_clean_error(optbot("profile", "flux2", "--device", "tpu"), "--device")
    r = optbot("profile", "flux2", "--device", "cuda")
    if r.returncode == 2:  # on a CPU machine
        assert "no CUDA device" in r.stderr and "Traceback" not in r.stderr


def test_help_teaches():
    r = optbot("profile", "--help")
    assert r.returncode == 0 and "Examples" in r.stdout and "--preset" in r.stdout and "--engine" in r.stdout


def test_profile_in_a_compile_mode(diffusers_engine, tmp_path):
    """--mode compile: the step is timed and profiled compiled (inductor's kernels, on CPU its C++
    ones), and the report says which mode and recipe; the eager FLOPs are the same work."""
    out = tmp_path / "c.json"
    r = optbot("profile", "flux2", "--mode", "compile", "--iters", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "mode: compile (regional (compile_repeated_blocks))" in r.stdout
    p = json.loads(out.read_text())
    assert p["mode"] == "compile" and p["compiled"].startswith("regional")
    assert "- mode: compile (regional" in out.with_suffix(".md").read_text()
    assert p["roofline"]["linear_tflop"] > 0
    # inductor's kernels carry no op shapes: the memory-bound bytes are a lower bound, no rate is made of
    # them (an H100 FP8 profile printed "~0 GB ... achieved n/a%" as if it were a figure)
    assert "lower bound" in p["roofline"]["memory_bound_basis"] and p["roofline"]["memory_bound_gbps_achieved"] is None
    assert "lower bound" in r.stdout
    # inductor's generated code ran (on CPU its regions show as such), and every block's work is
    # attributed to the compiled block as a whole: no module inside a block ran eagerly
    assert any(k["name"].startswith("Torch-Compiled Region") for k in p["kernels"]), [k["name"] for k in p["kernels"][:10]]
    in_blocks = [k["module"] for k in p["kernels"] if "transformer_blocks" in k["module"]]
    assert in_blocks and all(re.fullmatch(r"(single_)?transformer_blocks\.\d+", m) for m in in_blocks), in_blocks


def test_unknown_mode():
    _assert_clean_error(optbot("profile", "flux2", "--mode", "compile:fast"), "unknown mode 'compile:fast'", "--mode")
