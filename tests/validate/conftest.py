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
