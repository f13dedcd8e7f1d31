"""Fixtures of the SGLang engine tests.

The sglang 0.5.23 wheel is taken from ~/.cache/optbot/downloads when it is there (copied into the
test OPTBOT_HOME like the diffusers sdist), else downloaded once by the engine code itself. Tests
that run SGLang's models need its light dependency set (requirements-sglang.txt); without it they
are skipped with that reason. CI installs it (pip install -e '.[test,sglang]').
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

TEST_HOME = Path(os.environ["OPTBOT_HOME"])  # set by tests/conftest.py for the test session

SGLANG_SOURCE = "pypi-wheel:sglang==0.5.23"


def _seed_wheel() -> None:
    dl = TEST_HOME / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    user = Path.home() / ".cache" / "optbot" / "downloads"
    if user.is_dir():
        for f in user.glob("sglang-0.5.23-*.whl"):
            if not (dl / f.name).exists():
                shutil.copy(f, dl / f.name)


_seed_wheel()


@pytest.fixture(scope="session")
def sglang_engine():
    """The sglang 0.5.23 repository, materialized once from its wheel."""
    from bot.engine import checkout_engine

    return checkout_engine(SGLANG_SOURCE, None, "python", "sglang")
