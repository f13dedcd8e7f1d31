"""Declared forward inputs (runner/input_spec.py, runner/inputs.py): what the runner makes from a
workload file, checked against tensors built by hand."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from bot.errors import ConfigError
from bot.workload import load_workload, parse_workload_file
from runner import input_spec, inputs


def _passes(name: str, preset: str = "tiny", shape=None, seed: int = 3, **wl_changes):
    wl = load_workload(name)
    if wl_changes:
        wl = dataclasses.replace(wl, **wl_changes)
    j = wl.to_json()
    return inputs.make_passes(j, preset, shape or j["presets"][preset]["shapes"], seed, "cpu", torch.float32), j


def test_video_latents_are_5d_and_the_timestep_is_scaled():
    (cond, uncond), j = _passes("wan2.1")
    # frames 9 -> (9 - 1) // 4 + 1 = 3 latent frames; 64 x 96 pixels -> 8 x 12 latents
    assert tuple(cond["hidden_states"].shape) == (1, 4, 3, 8, 12)
    assert cond["timestep"].tolist() == [500.0]  # 0.5 of the schedule, on the 0-1000 scale
    assert tuple(cond["encoder_hidden_states"].shape) == (1, 16, 32)
    # the negative prompt differs; the latents and timestep are the same in both passes
    assert not torch.equal(cond["encoder_hidden_states"], uncond["encoder_hidden_states"])
    assert uncond["hidden_states"] is cond["hidden_states"] and uncond["timestep"] is cond["timestep"]
    assert cond["return_dict"] is False


def test_seeded_draws_follow_declaration_order_then_the_unconditional_pass():
    (cond, uncond), j = _passes("qwen-image", seed=11)
    g = torch.Generator().manual_seed(11)
    lat = torch.randn(1, 256, 16, generator=g)
    prompt = torch.randn(1, 32, 64, generator=g)
    negative = torch.randn(1, 32, 64, generator=g)
    assert torch.equal(cond["hidden_states"], lat)
    assert torch.equal(cond["encoder_hidden_states"], prompt)
    assert torch.equal(uncond["encoder_hidden_states"], negative)
    assert cond["img_shapes"] == [(1, 16, 16)]  # a literal expression: [(1, h, w)] * batch
    # no text mask: the pipelines drop an all-ones one before the model (workloads/qwen-image.yaml)
    assert "encoder_hidden_states_mask" not in cond and "encoder_hidden_states_mask" not in uncond


def test_batch_and_extra_shapes_reach_every_expression():
    shape = {"resolution": [176, 240], "text_tokens": 19, "batch": 2}
    (cond, _), _ = _passes("qwen-image", shape=shape)
    assert tuple(cond["hidden_states"].shape) == (2, 11 * 15, 16)
    assert cond["img_shapes"] == [(1, 11, 15)] * 2
    assert tuple(cond["timestep"].shape) == (2,)


def test_grid_ids_and_a_when_condition():
    (p,), j = _passes("flux2")
    ids = p["img_ids"]
    assert ids.dtype == torch.int64 and tuple(ids.shape) == (256, 4)
    assert ids[:, 1].max() == 15 and ids[:, 2].max() == 15 and ids[:, 0].max() == 0
    assert p["txt_ids"][:, 3].tolist() == list(range(32))
    assert p["guidance"].tolist() == [4.0]
    wl = load_workload("flux2")
    tiny = dataclasses.replace(wl.presets["tiny"], config={**wl.presets["tiny"].config, "guidance_embeds": False})
    (p2,), _ = _passes("flux2", presets={**wl.presets, "tiny": tiny})
    assert "guidance" not in p2  # when: config.guidance_embeds


def test_a_hook_makes_what_no_declaration_can():
    (cond, uncond), _ = _passes("lumina2")
    m0, m1 = cond["encoder_attention_mask"], uncond["encoder_attention_mask"]
    assert m0.dtype == torch.bool and tuple(m0.shape) == (1, 24)
    assert int(m0.sum()) == 18 and int(m1.sum()) == 6  # a padded prompt, a shorter negative prompt
    assert bool(m0[0, :18].all()) and not bool(m0[0, 18:].any())


def test_cfg_zeros_and_guided_combine(tmp_path):
    d = yaml.safe_load(Path(load_workload("sd3.5-large").file).read_text())
    d["inputs"]["forward"]["pooled_projections"]["cfg"] = "zeros"
    d["step"].update(combine="guided", guidance_scale=3.5)
    p = tmp_path / "sd3.yaml"
    p.write_text(yaml.safe_dump(d))
    j = parse_workload_file(p).to_json()
    cond, uncond = inputs.make_passes(j, "tiny", j["presets"]["tiny"]["shapes"], 0, "cpu", torch.float32)
    assert bool((uncond["pooled_projections"] == 0).all()) and bool((cond["pooled_projections"] != 0).any())
    c, u = torch.randn(2, 3), torch.randn(2, 3)
    out = inputs.combine([c, u], j["step"])
    assert set(out) == {"noise_pred"} and torch.allclose(out["noise_pred"], u + 3.5 * (c - u))
    assert set(inputs.combine([c, u], {"combine": "passes"})) == {"cond", "uncond"}


@pytest.mark.parametrize("text,why", [
    ("__import__('os').system('id')", "Call is not allowed"),
    ("().__class__", "attributes only as config"),
    ("[x for x in range(3)]", "not allowed"),
    ("config", "write config.<key>"),
    ("h[0]", "Subscript is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
])
def test_expressions_are_a_closed_language(text, why):
    with pytest.raises(input_spec.ExprError) as ei:
        input_spec.Expr.parse(text)
    assert why in str(ei.value)


def test_expression_evaluation():
    env = input_spec.Env({"batch": 2, "h": 4, "w": 6}, {"in_channels": 16, "guidance_embeds": True}, {"guidance": 4.0})
    ev = lambda t: input_spec.Expr.parse(t).eval(env)  # noqa: E731
    assert ev("h * w") == 24 and ev("(h - 1) // 4 + 1") == 1 and ev("config.in_channels * 2") == 32
    assert ev("[(1, h, w)] * batch") == [(1, 4, 6), (1, 4, 6)]
    assert ev("step.guidance if config.guidance_embeds else 0") == 4.0
    assert ev("h > 2 and not w < 3") is True
    with pytest.raises(input_spec.ExprError, match="unknown name 'd'"):
        ev("d + 1")
    with pytest.raises(input_spec.ExprError, match="config.out: no such key"):
        ev("config.out")


def test_a_dimension_expression_that_fails_at_one_preset_names_the_preset(tmp_path):
    d = yaml.safe_load(Path(load_workload("flux2").file).read_text())
    d["inputs"]["dims"]["h"] = "height // 16 - 15"  # -4 at the tiny preset's extra shape (176 px), fine elsewhere
    p = tmp_path / "f.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as ei:
        parse_workload_file(p)
    msg = str(ei.value)
    assert "inputs.forward.hidden_states.shape[1]" in msg and "preset tiny, shape 176x240" in msg and ", h=-4," in msg


def test_the_job_carries_the_declaration_as_text():
    j = load_workload("flux2").to_json()
    assert j["inputs"]["forward"]["hidden_states"]["shape"] == ["batch", "h * w", "config.in_channels"]
    assert input_spec.from_json(j["inputs"]).roles()["img_ids"] == "pos_ids"
