"""The plain adapter: a diffusers-style model class (diffusers, or a fork of it).

Built as ``cls(**preset config)`` with the seeded state dict (runner/weights.py), or
``cls.from_pretrained(path)`` for real weights; called as ``model(**kw)[0]`` with the workload's
inputs unchanged.
"""
from __future__ import annotations

from runner.weights import build_model as _build_seeded


def prepare(job) -> None:
    """Nothing to set up: the class runs on plain torch."""


def build_model(cls, job, preset: dict, dtype):
    return _build_seeded(cls, preset["config"], job.device, dtype, job.weight_seed, preset.get("weights", "seeded"))


def make_calls(model, passes: list[dict], job) -> list:
    return [(lambda kw=kw: model(**kw)[0]) for kw in passes]
