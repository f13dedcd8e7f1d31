"""The validate step on a candidate the store already knows (bot/steps/validate.reused_verdict): the
recorded verdict is its verdict, with the recorded numbers and where they came from."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

from bot.generate.candidate import Candidate
from bot.knowledge.known import known_verdict
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry
from bot.run.context import Budget, RunOptions, RunContext
from bot.run.state import Results
from bot.steps.validate import reused_verdict
from tests.knowledge.verdicts import ENV, record_verdict


def test_reused_verdict_carries_the_recorded_numbers(tmp_path):
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", tmp_path / "store" / "flux2-swiglu")
    entry = get_entry("flux2-swiglu", tmp_path / "store")
    record_verdict(entry)
    known, why = known_verdict(entry, "flux2", "h200", "b" * 40, "full", "bfloat16", ENV)
    assert known is not None, why
    ctx = RunContext("r", tmp_path, RunOptions("flux2"), Budget(), Results(), log=lambda m: None)
    ctx._target = SimpleNamespace(device="cuda", dtype="bfloat16", preset="full", workload=SimpleNamespace(name="flux2"),
                                  checkout=SimpleNamespace(base_sha="b" * 40))
    c = Candidate("replay-flux2-swiglu", "o1", "fuse-elementwise-chain", "replay", "", "c" * 40,
                  trailers={"Optbot-Entry": "flux2-swiglu"})
    v = reused_verdict(ctx, c, known)
    assert v.status == "accepted" and v.summary.startswith("reused:") and "flux2-swiglu" in v.reused_from
    eager = v.speed[0]
    assert (eager.mode, eager.base_ms, eager.candidate_ms, eager.speedup) == ("eager", [551.9, 550.2], [530.6, 532.7], 1.036)
    assert v.env["device_name"] == "NVIDIA H200" and v.correctness.seeds == [5, 9, 11]
