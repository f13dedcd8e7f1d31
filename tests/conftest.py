"""Shared fixtures. Tests run on CPU, on the tiny presets, with real git repositories and real
runner subprocesses.

OPTBOT_HOME for the test session is $OPTBOT_TEST_HOME, else ~/.cache/optbot-test: the diffusers
source distribution is downloaded (or copied from ~/.cache/optbot/downloads) once and the engine
repository materialized once, then reused across sessions.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TEST_HOME = Path(os.environ.get("OPTBOT_TEST_HOME", Path.home() / ".cache" / "optbot-test"))
os.environ["OPTBOT_HOME"] = str(TEST_HOME)
os.environ.setdefault("OPTBOT_RUNS_DIR", str(TEST_HOME / "runs"))


def _seed_downloads() -> None:
    """Release archives (diffusers sdist, sglang wheel) already in the user's cache are copied into
    the test home instead of being downloaded again."""
    dl = TEST_HOME / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    user = Path.home() / ".cache" / "optbot" / "downloads"
    if user.is_dir():
        for f in [*user.glob("*.tar.gz"), *user.glob("*.whl")]:
            if not (dl / f.name).exists():
                shutil.copy(f, dl / f.name)


_seed_downloads()


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu are skipped, with the reason said, where torch sees no CUDA device."""
    if not any("gpu" in it.keywords for it in items):
        return
    from bot.target import cuda_available

    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (runs on the H200 via benchmarks/h200.sh)")
    for it in items:
        if "gpu" in it.keywords:
            it.add_marker(skip)


@pytest.fixture(scope="session")
def diffusers_engine():
    """The default engine: the diffusers 0.42.1 repository, materialized once."""
    from bot.engine import checkout_engine

    return checkout_engine("pypi-sdist:diffusers==0.42.1", None, "src", "diffusers")


@pytest.fixture(scope="session")
def base_worktree(diffusers_engine):
    from bot.engine import add_worktree

    return add_worktree(diffusers_engine, f"test-base-{diffusers_engine.base_sha[:12]}")


@pytest.fixture
def cli_runner():
    from click.testing import CliRunner

    return CliRunner()
