"""Fixtures of the SGLang engine tests.

The sglang 0.5.23 wheel is taken from ~/.cache/optbot/downloads when it is there (tests/conftest.py
copies it into the test OPTBOT_HOME like the diffusers sdist), else downloaded once by the engine code. Tests
that run SGLang's models need its light dependency set (requirements-sglang.txt); without it they
are skipped with that reason. CI installs it (pip install -e '.[test,sglang]').
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SGLANG_SOURCE = "pypi-wheel:sglang==0.5.23"


@pytest.fixture(scope="session")
def sglang_engine():
    """The sglang 0.5.23 repository, materialized once from its wheel."""
    from bot.engine import checkout_engine

    return checkout_engine(SGLANG_SOURCE, None, "python", "sglang")


def run_in_engine(code: str, python_dir: Path, **env: str) -> str:
    """`python -c code python_dir` in a child whose import path starts at an engine's python/ (the base's
    or a patched worktree's), then this repository (for runner's stand-ins); `env` added to the
    environment. Its stdout; a failing child fails the test with its stderr's end."""
    path = os.pathsep.join(filter(None, [str(python_dir), str(ROOT), os.environ.get("PYTHONPATH")]))
    p = subprocess.run([sys.executable, "-c", code, str(python_dir)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=path, **env), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout
