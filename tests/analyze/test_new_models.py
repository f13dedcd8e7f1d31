"""Three models nobody here tuned for, brought up by their workload files alone (issue 17):
`optbot analyze` on the tiny presets (CPU) of Wan 2.1 (5-D video latents), SD3.5 Large (pooled
text) and Lumina-Image 2.0 (grouped-query attention, a padded text mask made by a hook). Every
CFG-invariant finding is checked against the values of both passes (the graph's fingerprints)."""
from __future__ import annotations

import json

import pytest

from tests.analyze.test_workloads import _analyze, _find


def _cfg_checked(a):
    cfg = _find(a, "cfg-invariant-cache")
    assert cfg, "each of these models recomputes timestep-only work in its second CFG pass"
    for o in cfg:
        assert "prompt" not in o["facts"]["depends_on"] and "text_mask" not in o["facts"]["depends_on"]
        n, _, rest = o["facts"]["values_checked"].partition(" of ")
        assert rest.startswith(f"{n} ops' outputs equal pass 1's"), o["facts"]  # all of them, checked
        assert "refuted_ops" not in o["facts"]
    return cfg


def _graph(a):
    return json.loads(open(a["meta"]["graph_file"]).read())


@pytest.mark.slow
def test_wan_video_model(diffusers_engine, cli_runner, tmp_path):
    a = _analyze(cli_runner, tmp_path, "wan2.1")
    g = _graph(a)
    lat = [i for i in g["inputs"] if i["key"] == "hidden_states"]
    assert len(g["values"][lat[0]["value"]]["shape"]) == 5 and g["passes"] == 2
    cfg = _cfg_checked(a)
    # the 3-D patch embedding of the latents is the same in both passes
    assert any(o["location"]["module_pattern"] == "patch_embedding" and "conv3d" in o["summary"] for o in cfg)
    assert _find(a, "attention-waste", "qk-norm", pattern="blocks.*.attn1")
    assert _find(a, "merge-siblings", pattern="blocks.*.attn1.to_q")


@pytest.mark.slow
def test_sd3_pooled_text_model(diffusers_engine, cli_runner, tmp_path):
    a = _analyze(cli_runner, tmp_path, "sd3.5-large")
    g = _graph(a)
    pooled = {i["pass"]: i["digest"] for i in g["inputs"] if i["key"] == "pooled_projections"}
    assert set(pooled) == {0, 1} and pooled[0] != pooled[1]  # redrawn for the unconditional pass
    cfg = _cfg_checked(a)
    # timestep embedding recomputed; the pooled-text half of the same module is not cacheable
    assert any(o["location"]["module_pattern"] == "time_text_embed" for o in cfg)
    assert _find(a, "merge-siblings", pattern="transformer_blocks.*.attn.add_q_proj")


@pytest.mark.slow
def test_lumina2_gqa_and_padded_mask(diffusers_engine, cli_runner, tmp_path):
    a = _analyze(cli_runner, tmp_path, "lumina2")
    g = _graph(a)
    assert [h["how"] for h in g["host_reads"]] == ["tolist", "tolist"]  # prompt lengths off the mask
    _cfg_checked(a)
    # grouped-query attention: Q is wider than K and V, and K/V are repeated to Q's heads
    qkv = _find(a, "merge-siblings", pattern="layers.*.attn.to_q")
    assert qkv and "N = 64+32+32" in qkv[0]["summary"]
    assert any("repeat" in o["summary"] for o in _find(a, "attention-waste", "qkv-layout-copies"))
    # the mask masks padding: not waste; and positions built from the prompt's length are not constants
    assert not _find(a, "attention-waste", "mask-masks-nothing")
    assert not _find(a, "hoist-constant", "load-time", pattern="rope_embedder")


def _variant(tmp_path, name, mutate):
    import yaml

    from bot.workload import load_workload

    import shutil
    from pathlib import Path

    src = Path(load_workload(name).file)
    d = yaml.safe_load(src.read_text())
    if d.get("hooks"):
        shutil.copy(src.parent / d["hooks"], tmp_path / d["hooks"])
    mutate(d)
    p = tmp_path / f"{name}-variant.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


@pytest.mark.parametrize("name,mutate,key,says", [
    # SD3's forward takes no img_shapes (a Qwen-Image input)
    ("sd3.5-large", lambda d: d["inputs"]["forward"].update(img_shapes={"make": "literal", "value": "[(1, 2, 2)]"}),
     "inputs.forward.img_shapes", "takes no argument 'img_shapes'"),
    # Lumina2's forward requires the mask
    ("lumina2", lambda d: d["inputs"]["forward"].pop("encoder_attention_mask"),
     "inputs.forward", "requires 'encoder_attention_mask'"),
    # a config key the class does not take, with the name it probably meant
    ("wan2.1", lambda d: d["presets"]["tiny"]["config"].update(num_attention_head=2),
     "presets.tiny.config.num_attention_head", "did you mean 'num_attention_heads'"),
])
def test_inputs_and_config_the_model_cannot_take_stop_before_any_runner(diffusers_engine, tmp_path, name, mutate,
                                                                        key, says):
    import subprocess
    import sys

    p = _variant(tmp_path, name, mutate)
    res = subprocess.run([sys.executable, "-m", "bot", "analyze", str(p), "--preset", "tiny", "--device", "cpu"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2, out
    assert str(p) in out and f"key '{key}'" in out and says in out
    assert "profiling" not in out and "Traceback" not in out  # no runner started


def test_a_captured_step_that_is_not_the_declared_one_is_an_error(tmp_path):
    """check_passes: one captured pass where the workload declares true CFG, and two passes whose
    inputs are identical (cfg: same everywhere would make every value look prompt-independent)."""
    import dataclasses

    import torch
    from torch import nn

    from bot.analyze.graph import Graph
    from bot.errors import OptbotError
    from bot.steps.analyze import check_passes
    from bot.workload import load_workload
    from runner.graph_capture import capture
    from tests.analyze.toy_helpers import HERE, ROLES

    m = nn.Linear(4, 4)
    x, w1, w2 = torch.randn(1, 4), torch.randn(1, 4), torch.randn(1, 4)

    def graph(*passes):
        def step():
            with torch.inference_mode():
                return [m(x + w) for w in passes]

        class Wrap(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, pixels, words):
                return self.m(pixels + words)

        wrap = Wrap()

        def wstep():
            with torch.inference_mode():
                return [wrap(pixels=x, words=w) for w in passes]

        return Graph.from_json({**capture(wrap, wstep, str(HERE), ROLES).to_json(), "device": "cpu", "probes": []})

    wl = load_workload("qwen-image")
    check_passes(wl, graph(w1, w2))  # two passes, prompts differ: fine
    with pytest.raises(OptbotError, match=r"key 'step.cfg'.*declares 2 forward pass\(es\).*ran the model's forward 1"):
        check_passes(wl, graph(w1))
    with pytest.raises(OptbotError, match=r"key 'inputs.forward'.*identical inputs"):
        check_passes(wl, graph(w1, w1))
    one = dataclasses.replace(wl, step=dataclasses.replace(wl.step, cfg="none"))
    check_passes(one, graph(w1))
