"""The optimize run's validate step on a candidate the store already knows: the recorded verdict is
its verdict, with the recorded numbers and where they came from (bot/optimize/stages.reused_verdict)."""
from __future__ import annotations

import dataclasses
import shutil

import pytest

from bot.knowledge.known import known_verdict
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry
from bot.optimize.stages import reused_verdict
from tests.knowledge.verdicts import ENV, record_verdict


def test_reused_verdict_carries_the_recorded_numbers(tmp_path):
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", tmp_path / "store" / "flux2-swiglu")
    entry = get_entry("flux2-swiglu", tmp_path / "store")
    record_verdict(entry)
    k, why = known_verdict(entry, "flux2", "h200", "b" * 40, "full", "bfloat16", ENV)
    assert k is not None, why
    v = reused_verdict("replay-flux2-swiglu", dataclasses.asdict(k))
    assert v.status == "accepted" and v.reason.startswith("reused:") and v.raw["reused"] is True
    assert v.base_eager.median_ms == pytest.approx(551.05) and v.cand_eager.median_ms == pytest.approx(531.65)
    assert v.base_eager.device_name == "NVIDIA H200" and v.speedup == pytest.approx(551.05 / 531.65)
