"""Fixtures of the SGLang engine tests.

The sglang 0.5.23 wheel is taken from ~/.cache/optbot/downloads when it is there (tests/conftest.py
copies it into the test OPTBOT_HOME like the diffusers sdist), else downloaded once by the engine code. Tests
that run SGLang's models need its light dependency set (requirements-sglang.txt); without it they
are skipped with that reason. CI installs it (pip install -e '.[test,sglang]').
"""
from __future__ import annotations


import pytest

SGLANG_SOURCE = "pypi-wheel:sglang==0.5.23"


@pytest.fixture(scope="session")
def sglang_engine():
    """The sglang 0.5.23 repository, materialized once from its wheel."""
    from bot.engine import checkout_engine

    return checkout_engine(SGLANG_SOURCE, None, "python", "sglang")
