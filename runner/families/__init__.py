"""Model families: how to make seeded inputs for one step and call the model.

A family knows the forward signature of one kind of DiT (FLUX.2, Qwen-Image), not any engine's
internals. `make_passes` returns one kwargs dict per forward pass of the step; `combine` turns the
pass outputs into the step's outputs (e.g. the true-CFG combination).
"""
from __future__ import annotations

from runner.families import flux2, qwen_image

FAMILIES = {"flux2": flux2, "qwen-image": qwen_image}


def get(name: str):
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]
