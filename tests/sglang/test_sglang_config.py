"""Selecting the SGLang engine: workload files, adapter choice, the light dependency set's one list."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from bot.errors import ConfigError
from bot.workload import load_workload, parse_workload
from runner import engines
from runner.job import Job

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("wl,cls", [("flux2", "dits.flux_2.Flux2Transformer2DModel"),
                                    ("qwen-image", "dits.qwen_image.QwenImageTransformer2DModel")])
def test_workloads_define_the_sglang_engine(wl, cls):
    w = load_workload(wl)
    s = w.engine("sglang")
    assert s.source == "pypi-wheel:sglang==0.5.23" and s.import_root == "python" and s.adapter == "sglang"
    assert s.model_class == f"sglang.multimodal_gen.runtime.models.{cls}"
    assert w.engine(None).name == "diffusers" and w.engine(None).adapter == "plain"


def test_unknown_adapter_names_file_key_and_choices(tmp_path):
    d = yaml.safe_load((ROOT / "workloads" / "flux2.yaml").read_text())
    d["engines"]["sglang"]["adapter"] = "vllm"
    with pytest.raises(ConfigError) as e:
        parse_workload(d, tmp_path / "x.yaml")
    msg = str(e.value)
    assert "x.yaml" in msg and "engines.sglang.adapter" in msg and "'vllm'" in msg and "plain" in msg


def _job(wl: str, model_class: str, **params) -> Job:
    return Job(kind="step", workload=load_workload(wl).to_json(), preset="tiny", device="cpu", dtype="float32",
               engine_root="", engine_sha="", model_class=model_class, shapes=[], params=params)


def test_the_runner_picks_the_adapter_of_the_engine_it_runs():
    w = load_workload("qwen-image")
    assert engines.adapter_name(_job("qwen-image", w.engine("sglang").model_class)) == "sglang"
    assert engines.adapter_name(_job("qwen-image", w.engine("diffusers").model_class)) == "plain"
    assert engines.adapter_name(_job("qwen-image", "my.fork.Model")) == "plain"
    assert engines.adapter_name(_job("qwen-image", "my.fork.Model", adapter="sglang")) == "sglang"
    with pytest.raises(KeyError, match="unknown engine adapter"):
        engines.get("vllm")


def test_light_set_is_one_list_in_requirements_extra_and_adapter_check():
    req = [ln.strip() for ln in (ROOT / "requirements-sglang.txt").read_text().splitlines()
           if ln.strip() and not ln.startswith("#")]
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sglang"]
    assert req == extra
    assert not any(re.match(r"(torch|sglang|sgl-kernel|flashinfer)\b", r) for r in req)  # never a CUDA stack
    from runner.engines.sglang import LIGHT_SET

    names = {re.split(r"[=<>]", r)[0].lower() for r in req}
    assert names <= {d.lower() for d in LIGHT_SET.values()}
