"""Workload files: both shipped workloads parse, and every kind of mistake is named precisely."""
from __future__ import annotations

import dataclasses

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from bot.errors import ConfigError, OptbotError
from bot.workload import load_workload, parse_workload_file

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name,passes,engine_cls", [
    ("flux2", 1, "Flux2Transformer2DModel"),
    ("qwen-image", 2, "QwenImageTransformer2DModel"),
])
def test_shipped_workloads_parse(name, passes, engine_cls):
    wl = load_workload(name)
    assert wl.name == name
    assert wl.step.passes == passes
    assert wl.engine(None).model_class.endswith(engine_cls)
    full = wl.preset("full")
    assert full.shapes.resolution == (1024, 1024) and full.shapes.text_tokens == 512 and full.shapes.batch == 1
    assert full.shapes.image_tokens(wl.latent_downsample) == 4096
    assert wl.dtype_for("cuda") == "bfloat16" and wl.dtype_for("cpu") == "float32"
    assert set(wl.tolerance) >= {"float32", "bfloat16"}
    assert full.extra_shapes, "validation needs a shape nobody tuned for"


def _param_count(name: str, preset: str) -> int:
    """Builds the model on the meta device: exact parameter count, no memory."""
    import importlib

    import torch

    wl = load_workload(name)
    mod, _, cls = wl.engine(None).model_class.rpartition(".")
    with torch.device("meta"):
        model = getattr(importlib.import_module(mod), cls)(**wl.preset(preset).config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,billions", [("flux2", 32.2), ("qwen-image", 20.4)])
def test_full_presets_have_the_real_models_size(name, billions):
    assert round(_param_count(name, "full") / 1e9, 1) == billions


@pytest.mark.parametrize("name", ["flux2", "qwen-image"])
def test_tiny_presets_stay_under_50M(name):
    n = _param_count(name, "tiny")
    assert 100_000 < n <= 50_000_000


def test_full_preset_dimensions_match_the_issue():
    f = load_workload("flux2").preset("full").config
    assert (f["num_layers"], f["num_single_layers"], f["num_attention_heads"], f["attention_head_dim"],
            f["joint_attention_dim"], f["in_channels"]) == (8, 48, 48, 128, 15360, 128)
    q = load_workload("qwen-image").preset("full").config
    assert (q["num_layers"], q["num_attention_heads"], q["attention_head_dim"], q["joint_attention_dim"],
            q["in_channels"]) == (60, 24, 128, 3584, 64)


def _write(tmp_path: Path, data) -> Path:
    p = tmp_path / "wl.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def _base() -> dict:
    return yaml.safe_load((ROOT / "workloads" / "flux2.yaml").read_text())


@pytest.mark.parametrize("mutate,key,expect", [
    (lambda d: d.update(family="flux2"), "family", "inputs:"),
    (lambda d: d.pop("inputs"), "inputs", "missing"),
    (lambda d: d["step"].update(cfg="maybe"), "step.cfg", "one of"),
    (lambda d: d["step"].update(timestep=500.0), "step.timestep", "timestep_scale: 1000"),
    (lambda d: d["step"].update(timestep_scale=0), "step.timestep_scale", "positive"),
    (lambda d: d["step"].update(text_mask="all-ones"), "step.text_mask", "one of the keys"),
    (lambda d: d["step"].update(combine="guided"), "step.combine", "true-cfg"),
    # CFG declared but nothing differs between the passes: both passes would be the same
    (lambda d: d["step"].update(cfg="true-cfg"), "step.cfg", "cfg: redraw"),
    # an input that differs in an unconditional pass that does not exist
    (lambda d: d["inputs"]["forward"]["encoder_hidden_states"].update(cfg="redraw"),
     "inputs.forward.encoder_hidden_states.cfg", "no unconditional pass"),
    (lambda d: d["inputs"].update(outputs={}), "inputs.outputs", "dims, forward"),
    (lambda d: d["inputs"]["forward"]["hidden_states"].update(make="gaussian"), "inputs.forward.hidden_states.make", "randn"),
    (lambda d: d["inputs"]["forward"]["hidden_states"].update(shape=["batch", "hh * w", 16]),
     "inputs.forward.hidden_states.shape[1]", "unknown: hh"),
    (lambda d: d["inputs"]["forward"]["hidden_states"].update(shape=["batch", "__import__('os')", 16]),
     "inputs.forward.hidden_states.shape[1]", "Call is not allowed"),
    (lambda d: d["inputs"]["forward"]["hidden_states"].update(shape=["batch", "h * w", "config.in_chanels"]),
     "inputs.forward.hidden_states.shape[2]", "config.in_chanels: no such key"),
    (lambda d: d["inputs"]["forward"]["hidden_states"].update(shape=["batch", "h - 100", 16]),
     "inputs.forward.hidden_states.shape[1]", "positive integer"),
    (lambda d: d["inputs"]["forward"]["hidden_states"].update(dtype="int64"), "inputs.forward.hidden_states.dtype", "floating"),
    (lambda d: d["inputs"]["forward"]["hidden_states"].update(cfg="other"), "inputs.forward.hidden_states.cfg", "same, redraw"),
    (lambda d: d["inputs"]["forward"]["hidden_states"].update(make="hook", function="f"), "inputs.forward.hidden_states.make", "hooks"),
    (lambda d: d["inputs"]["forward"]["img_ids"].pop("axes"), "inputs.forward.img_ids.axes", "axis sizes"),
    (lambda d: d["inputs"]["dims"].update(batch="2"), "inputs.dims.batch", "a new name"),
    (lambda d: d["inputs"]["dims"].update(z="q + 1"), "inputs.dims.z", "unknown: q"),
    (lambda d: d.update(hooks="missing_hooks.py"), "hooks", "does not exist"),
    (lambda d: d["presets"]["tiny"]["shapes"].update(fps=24), "presets.tiny.shapes.fps", "frames"),
    (lambda d: d["presets"]["tiny"]["shapes"].update(resolution=[250, 256]), "presets.tiny.shapes.resolution", "multiples"),
    (lambda d: d["presets"]["tiny"]["shapes"].update(text_tokens="many"), "presets.tiny.shapes.text_tokens", "an integer"),
    (lambda d: d["presets"].update(huge=d["presets"]["tiny"]), "presets.huge", "preset named"),
    (lambda d: d["dtype"].update(cuda="float8"), "dtype.cuda", "one of"),
    (lambda d: d["correctness"]["tolerance"].pop("bfloat16"), "correctness.tolerance.bfloat16", "tolerance for bfloat16"),
    # a quantized precision's tolerance: a known recipe, and the evidence it was derived from
    (lambda d: d["correctness"]["tolerance"].update({"bfloat16+int4": {"rel_l2": 0.1, "atol": 1, "rtol": 1, "evidence": "x"}}),
     "correctness.tolerance.bfloat16+int4", "+RECIPE"),
    (lambda d: d["correctness"]["tolerance"].update({"bfloat16+fp8": {"rel_l2": 0.1, "atol": 1, "rtol": 1}}),
     "correctness.tolerance.bfloat16+fp8.evidence", "recipe's own error"),
    (lambda d: d["engines"]["diffusers"].update(model_class="NoDots"), "engines.diffusers.model_class", "dotted path"),
    (lambda d: d.update(colour="blue"), "colour", "known keys"),
    (lambda d: d.update(default_engine="vllm"), "default_engine", "one of"),
    (lambda d: d.update(production_modes=["eager", "compyle"]), "production_modes[1]", "compile[:RECIPE][+graph]"),
    (lambda d: d.update(production_modes=["compile+graph"]), "production_modes", "includes eager"),
])
def test_bad_values_name_file_key_value_and_expectation(tmp_path, mutate, key, expect):
    d = _base()
    mutate(d)
    p = _write(tmp_path, d)
    with pytest.raises(ConfigError) as ei:
        parse_workload_file(p)
    msg = str(ei.value)
    assert str(p) in msg and f"key '{key}'" in msg and expect in msg


def test_production_modes_default_to_all_four_and_decide_the_validators_cuda_modes(tmp_path):
    from tests.validate.conftest import scratch_context

    assert load_workload("flux2").production_modes == ("eager", "graph", "compile", "compile+graph")
    d = _base()
    d["production_modes"] = ["eager", "compile:max-autotune+graph"]
    wl = parse_workload_file(_write(tmp_path, d))
    assert wl.production_modes == ("eager", "compile:max-autotune+graph")
    ctx = scratch_context(tmp_path, "cuda")
    ctx.target = dataclasses.replace(ctx.target, workload=wl)
    assert ctx.modes == ("eager", "compile:max-autotune+graph")
    assert scratch_context(tmp_path, "cpu").modes == ("eager",)  # CPU: eager unless Options.modes


def test_malformed_yaml_reports_line(tmp_path):
    p = _write(tmp_path, "name: x\nfamily: [flux2\nstep: {}\n")
    with pytest.raises(OptbotError) as ei:
        parse_workload_file(p)
    assert "malformed YAML" in str(ei.value) and "line" in str(ei.value) and str(p) in str(ei.value)


def test_unknown_workload_lists_known_ones():
    with pytest.raises(OptbotError) as ei:
        load_workload("sdxl")
    assert "flux2" in str(ei.value) and "qwen-image" in str(ei.value)


def test_a_shape_is_the_json_a_job_carries_and_a_result_echoes():
    from bot.workload import Shape

    pr = load_workload("flux2").preset("tiny")
    assert pr.shapes.to_json() == {"resolution": [256, 256], "text_tokens": 32, "batch": 1}
    assert [s.to_json() for s in pr.extra_shapes][0] == {"resolution": [176, 240], "text_tokens": 19, "batch": 1}
    for s in (pr.shapes, *pr.extra_shapes):
        back = Shape.from_json(json.loads(json.dumps(s.to_json())))
        assert back == s and back.label() == s.label()  # the resolution comes back a tuple


@pytest.mark.parametrize("name", ["flux2", "qwen-image"])
def test_a_quantized_precision_has_its_own_tolerance_or_says_where_to_measure_it(tmp_path, name):
    wl = load_workload(name)
    assert wl.precision_for("cpu") == "float32" and wl.precision_for("cpu", "fp8") == "float32+fp8"
    assert wl.precision_for("cuda", "fp8") == "bfloat16+fp8"  # measured on the H200 (its evidence)
    for prec, unquantized, where in (("float32+fp8", "float32", "on CPU"), ("bfloat16+fp8", "bfloat16", "on the H200")):
        tol = wl.tolerance[prec]
        assert f"optbot bench {name}" in tol.evidence and "--quant fp8" in tol.evidence and where in tol.evidence
        assert 0 < tol.rel_l2 and tol.rel_l2 > wl.tolerance[unquantized].rel_l2 / 10
    d = yaml.safe_load((ROOT / "workloads" / f"{name}.yaml").read_text())
    del d["correctness"]["tolerance"]["bfloat16+fp8"]
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as ei:  # a workload not measured on a GPU: the file's error, naming the key
        parse_workload_file(p).precision_for("cuda", "fp8")
    assert "correctness.tolerance.bfloat16+fp8" in str(ei.value) and "--quant fp8 measures it" in str(ei.value)


def test_an_engine_with_its_own_fp8_path_has_its_own_bound(tmp_path):
    """SGLang's FP8 baseline is its own ModelOpt path, whose error against bf16 (0.0952 on the H200)
    is not torchao's (0.149): its candidates are judged by half of its own error, where the file gives
    one; another engine, or an unquantized precision, keeps the precision's bound. A per-engine bound
    without evidence is the file's error, naming the key."""
    wl = load_workload("flux2")
    assert wl.tolerance_for("bfloat16+fp8", "sglang").rel_l2 == 4.8e-2
    assert wl.tolerance_for("bfloat16+fp8", "diffusers") is wl.tolerance["bfloat16+fp8"]
    assert wl.tolerance_for("bfloat16", "sglang") is wl.tolerance["bfloat16"]
    assert wl.tolerance_for("float32+fp8", "sglang").rel_l2 < wl.tolerance["float32+fp8"].rel_l2
    assert "h200-sglang-fp8-20261206" in wl.tolerance_for("bfloat16+fp8", "sglang").evidence
    # what a runner job carries keeps the per-engine bounds
    assert wl.to_json()["tolerance"]["bfloat16+fp8"]["engines"]["sglang"]["rel_l2"] == 4.8e-2
    d = yaml.safe_load((ROOT / "workloads" / "flux2.yaml").read_text())
    del d["correctness"]["tolerance"]["bfloat16+fp8"]["engines"]["sglang"]["evidence"]
    p = tmp_path / "flux2.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as ei:
        parse_workload_file(p)
    assert "correctness.tolerance.bfloat16+fp8.engines.sglang.evidence" in str(ei.value)


def test_a_bound_across_modes_needs_its_evidence_and_is_never_tighter(tmp_path):
    """flux2's SGLang FP8 bound for a compiled step against an eager one (bot/tolerance.py
    across_modes) names the run that measured the trusted rewrite; without evidence, or tighter than
    the bound within a mode, the file is refused, naming the key."""
    wl = load_workload("flux2")
    t = wl.tolerance_for("bfloat16+fp8", "sglang")
    assert t.across_modes is not None and t.across_modes.rel_l2 >= t.rel_l2
    assert "h100-sglang-fp8-compile-20261206" in t.across_modes.evidence and "0.0827" in t.across_modes.evidence
    assert t.bound(across_modes=True)["rel_l2"] == t.across_modes.rel_l2 and t.bound()["rel_l2"] == t.rel_l2
    assert wl.tolerance["bfloat16"].bound(across_modes=True) == wl.tolerance["bfloat16"].bound()  # none declared
    for change, key in ((lambda a: a.pop("evidence"), "across_modes.evidence"),
                        (lambda a: a.update(rel_l2=1e-3), "across_modes.rel_l2")):
        d = yaml.safe_load((ROOT / "workloads" / "flux2.yaml").read_text())
        change(d["correctness"]["tolerance"]["bfloat16+fp8"]["engines"]["sglang"]["across_modes"])
        p = tmp_path / "flux2.yaml"
        p.write_text(yaml.safe_dump(d))
        with pytest.raises(ConfigError) as ei:
            parse_workload_file(p)
        assert f"correctness.tolerance.bfloat16+fp8.engines.sglang.{key}" in str(ei.value)
