"""Fixtures of the generation tests (the agent's own are in agent/conftest.py)."""
from __future__ import annotations

collect_ignore = ["kernels"]  # kernel modules used as data by the variant-search tests
