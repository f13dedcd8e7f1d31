"""Fixtures of the analysis tests (helpers live in toy_helpers.py: a module named conftest is
ambiguous when several test folders have one)."""
from __future__ import annotations

import pytest

from tests.analyze.toy_helpers import run_toy


@pytest.fixture
def toy(tmp_path):
    def _run(model, passes, only=None, profile_extra=None):
        return run_toy(model, passes, tmp_path, only, profile_extra)
    return _run
