"""The validate step on a candidate the store already knows (bot/steps/validate.reused_verdict): the
recorded verdict is its verdict, with the recorded numbers and where they came from."""
from __future__ import annotations

import re
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


def _ctx_validating(tmp_path, cands, accept):
    """A run context whose validator (ctx.validate, the seam orchestration tests use) accepts the
    candidates whose commit is in `accept` and records the order it was asked in."""
    from bot.steps import generate
    from bot.validate.verdict import Verdict

    asked: list[str] = []
    by_sha = {c.commit_sha: c.id for c in cands}

    def validate(target, ref, base, opts):
        asked.append(by_sha[ref])
        ok = ref in accept
        return Verdict(status="accepted" if ok else "rejected", reason=None if ok else "slower", summary="",
                       workload="qwen-image", preset="full", device="cuda", dtype="bfloat16", base_sha=base,
                       candidate_sha=ref, candidate=by_sha[ref])

    said: list[str] = []
    ctx = RunContext("r", tmp_path, RunOptions("qwen-image"), Budget(),
                     Results(generate=generate.Result("done", "", cands)), log=said.append, validate=validate)
    ctx.said = said
    ctx._target = SimpleNamespace(device="cuda", dtype="bfloat16", preset="full",
                                  workload=SimpleNamespace(name="qwen-image"), checkout=SimpleNamespace(base_sha="b" * 40))
    return ctx, asked


def _cands():
    def cand(cid, gen, entry, sha):
        return Candidate(cid, "o", "k", gen, "", sha * 40, trailers={"Optbot-Entry": entry} if entry else {})

    return [cand("replay-a", "replay", "a", "1"), cand("replay-b", "replay", "b", "2"),
            cand("variant-a", "variant-search", "a", "3"), cand("variant-b", "variant-search", "b", "4"),
            cand("replay-c", "replay", "c", "5"), cand("compile-region-x", "compile-region", "", "6")]


def test_a_replay_whose_tuned_variant_is_accepted_is_not_validated(tmp_path):
    """The variant goes first; an accepted one stands for its plain replay (combine would drop the
    replay for it anyway); a rejected one leaves the replay to be validated, after it."""
    from bot.steps import validate

    cands = _cands()
    ctx, asked = _ctx_validating(tmp_path, cands, accept={"3" * 40, "2" * 40, "5" * 40})
    res = validate.run(ctx)
    assert asked == ["variant-a", "variant-b", "replay-c", "compile-region-x", "replay-b"]
    assert res.superseded == {"replay-a": "variant-a"}
    assert list(res.verdicts) == ["replay-b", "variant-a", "variant-b", "replay-c", "compile-region-x"]
    assert res.reason == "3 of 5 accepted; 1 replay(s) not validated, their tuned variants accepted"
    # progress for people: which candidate, how many of the step's are settled, the pace
    assert ctx.said[0] == "validating variant-a (1 of 6)"
    assert re.fullmatch(r"variant-a: accepted in \d+ s; about \d+ min for the 5 left at this pace \(fewer if tuned "
                        r"variants are accepted\)", ctx.said[1]), ctx.said
    assert re.fullmatch(r"variant-b: rejected \(slower\) in \d+ s; .*", ctx.said[3]), ctx.said
    assert "validating replay-b (6 of 6)" in ctx.said and re.fullmatch(r"replay-b: accepted in \d+ s", ctx.said[-2])
    assert ctx.said[-1] == "not validated, their tuned variants accepted: replay-a (by variant-a)"
    # the verdicts reached are checkpointed: a resumed run asks the validator nothing again
    ctx2, asked2 = _ctx_validating(tmp_path, cands, accept=set())
    assert validate.run(ctx2).superseded == {"replay-a": "variant-a"} and asked2 == []


def test_shards_keep_a_replay_with_its_tuned_variant():
    """Fan-out: the replay is planned into its variant's shard (only that shard knows whether to
    validate it), and merge accepts its missing verdict only where the variant was accepted."""
    from bot.run.fanout import Planned, assign, without_verdict

    cands = _cands()
    n, shard_of = assign(cands, 3)
    assert n == 3
    assert shard_of == {"variant-a": 1, "variant-b": 2, "replay-c": 3, "compile-region-x": 1,
                        "replay-a": 1, "replay-b": 2}
    planned = [Planned(c.id, c.commit_sha, shard_of[c.id]) for c in cands]
    accepted = SimpleNamespace(accepted=True)
    got = {cid: accepted for cid in ("replay-b", "variant-a", "replay-c", "compile-region-x")}
    got["variant-b"] = SimpleNamespace(accepted=False)
    assert [c.id for c in without_verdict(planned, got, cands)] == []
    del got["replay-b"]  # variant-b was rejected: replay-b needed a verdict
    assert [c.id for c in without_verdict(planned, got, cands)] == ["replay-b"]
    got["variant-a"] = SimpleNamespace(accepted=False)
    assert [c.id for c in without_verdict(planned, got, cands)] == ["replay-a", "replay-b"]
