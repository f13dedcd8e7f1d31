"""Fixtures of the validator tests: the flux2 tiny target on CPU, one set of fresh seeds per test
session (random, never 0), and a cache of the base side's outputs shared by the adversarial cases
(same base sha, seeds and weights: the base runs once per session)."""
from __future__ import annotations

from pathlib import Path

import pytest

ADV = Path(__file__).resolve().parent / "adversarial"


@pytest.fixture(scope="session")
def session_seeds():
    from bot.validate import fresh_seeds

    return fresh_seeds(3), fresh_seeds(1)[0]


@pytest.fixture(scope="session")
def flux2_cpu(diffusers_engine):
    from bot.target import resolve_target

    return resolve_target("flux2", None, None, "tiny", "cpu")


@pytest.fixture(scope="session")
def base_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("base-cache")


def scratch_context(tmp_path, device: str = "cpu", **options):
    """A validation Context on a flux2 target whose engine is never run (for the units that only read it)."""
    from bot.engine import EngineCheckout
    from bot.target import Target
    from bot.validate.context import Context
    from bot.validate.validator import Options
    from bot.workload import load_workload

    wl = load_workload("flux2")
    target = Target(wl, "diffusers", "diffusers.M", EngineCheckout("diffusers", tmp_path, "a" * 40, "HEAD", "src"),
                    "tiny", device, wl.dtype_for(device))
    pr = wl.preset("tiny")
    return Context(target=target, opts=Options(**options), run_dir=tmp_path / "run", seeds=[11, 12], weight_seed=13,
                   shapes=[pr.shapes, *pr.extra_shapes], is_cuda=device.startswith("cuda"), warmup=1, iters=2)
