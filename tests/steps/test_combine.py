"""The optimize run's combine step and what the learn step records for it: a stack's measured
leave-one-out goes into its members' bench.json, and a later run over the same stack reuses it
instead of measuring (bot/knowledge/recall.py, bot/knowledge/known.known_ablation)."""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from types import SimpleNamespace

from bot.knowledge import recall
from bot.knowledge.location import SHIPPED_STORE
from bot.optimize.stages import (AblationRow, Budget, CandidateRecord, CombineResult, Options, RunContext, Stages,
                                 StackCommit)
from tests.knowledge.verdicts import ENV


def test_learn_records_the_measured_ablation_and_combine_reuses_it(tmp_path):
    """The glue: learn writes the combine step's measured leave-one-out into the members' bench.json
    (bot/knowledge/recall.record_stack_ablation, into the staging copy); a later run's ablate step
    over the same stack maps it onto its own commits instead of measuring. The numbers are test data."""
    root = tmp_path / "knowledge"
    for eid in ("flux2-swiglu", "flux2-qk-rmsnorm-rope"):
        shutil.copytree(SHIPPED_STORE / eid, root / "kernel_store" / eid)
    cands = {f"replay-{e}": CandidateRecord(f"replay-{e}", e, "0" * 40, "", "replay", "k", "o", "", {"Optbot-Entry": e})
             for e in ("flux2-swiglu", "flux2-qk-rmsnorm-rope")}
    key = recall.RunKey(root / "kernel_store", "flux2", "h200", "b" * 40, "full", "bfloat16", True, False, ENV)
    # this run's combine step result, as the step records it (the numbers are test data)
    combine = asdict(CombineResult(
        "done", "optbot/flux2/bbbbbbbbbbbb", "b" * 40, "1" * 40, [StackCommit(c, "1" * 40, c) for c in cands],
        ablation=[AblationRow("replay-flux2-swiglu", "swiglu", 495.0, 16.8, 3.4, "cuda"),
                  AblationRow("replay-flux2-qk-rmsnorm-rope", "qk", 534.9, 56.7, 10.6, "cuda")],
        stack_sha256="s" * 64, ablation_measured={"mode": "eager", "rounds": 1, "device": "cuda", "base_ms": 554.0,
                                                  "stack_ms": 478.2, "noise_pct": 0.6}))
    files = recall.record_stack_ablation(key, root, combine, cands, {}, "run-1", "optbot optimize flux2")
    assert sorted(files) == ["kernel_store/flux2-qk-rmsnorm-rope/bench.json", "kernel_store/flux2-swiglu/bench.json"]
    rec = json.loads((root / files[0]).read_text())["gpu"]["ablation"]["flux2"]
    assert list(rec) == ["stack_sha256", "base_sha", "preset", "dtype", "hardware", "torch", "triton", "run_id",
                         "command", "mode", "rounds", "device", "base_ms", "stack_ms", "noise_pct", "rows", "recorded_at"]
    assert rec["rows"][0] == {"entry": "flux2-swiglu", "without_ms": 495.0, "contribution_ms": 16.8, "contribution_pct": 3.4}
    # a member that is no store entry: nothing recorded (it could never be matched)
    other = {**cands, "replay-flux2-swiglu": CandidateRecord("replay-flux2-swiglu", "x", "0" * 40, "", "agent", "k", "o", "", {})}
    assert recall.record_stack_ablation(key, root, combine, other, {}, "run-1", "c") == []

    # the next run: the same stack, other commit shas and candidate ids, through the real ablate step
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2"), checkout=SimpleNamespace(base_sha="b" * 40),
                             preset="full", dtype="bfloat16", device="cuda")
    ctx = RunContext("run-2", tmp_path / "run2", Options("flux2", knowledge_path=str(root), ablation_rounds=1), Budget(),
                     {"baseline": {"env": ENV},
                      "generate": {"candidates": [{**asdict(c), "id": c.id + "-2"} for c in cands.values()]}}, target=target)
    res = CombineResult("done", "b", "b" * 40, "2" * 40, [StackCommit(c + "-2", "3" * 40, c) for c in cands],
                        stack_sha256="s" * 64)
    rows, note = Stages().ablate(ctx, res)
    assert [(r.candidate_id, r.contribution_ms) for r in rows] == [("replay-flux2-swiglu-2", 16.8),
                                                                  ("replay-flux2-qk-rmsnorm-rope-2", 56.7)]
    assert "known from run run-1" in note and res.ablation_known_from == "run-1" and res.ablation_measured == {}
    assert recall.stack_ablation(key, res.commits, {c["id"]: c for c in ctx.results["generate"]["candidates"]},
                                 "t" * 64, 1) is None  # another stack: measured again
    key2 = recall.RunKey(**{**key.__dict__, "revalidate": True})
    assert recall.stack_ablation(key2, res.commits, {c["id"]: c for c in ctx.results["generate"]["candidates"]},
                                 "s" * 64, 1) is None
