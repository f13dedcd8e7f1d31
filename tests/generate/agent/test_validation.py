"""The agent's calls of THE validator (bot/generate/agent/validation.py): one verdict per (tree, speed),
the ranking of verdicts, a validator that cannot judge, and candidate code running only in runner
children without keys."""
from __future__ import annotations

import pytest

import bot.generate.agent.validation as validation
from bot.errors import RunnerError
from bot.generate.agent.budget import CostPool
from bot.generate.agent.config import AgentConfig
from bot.generate.agent.loop import run_agent
from bot.generate.agent.parallel import make_client
from bot.generate.agent.transcript import Transcript
from bot.generate.agent.validation import ValidationContext, strength, validate_commit
from bot.generate.candidate import Candidate, make_trailers
from bot.generate.commits import commit_candidate, snapshot
from bot.validate.verdict import Speed, Verdict
from messages_standin import MessagesStandin


def _verdict(status: str, reason: str | None = None, speedup: float | None = None, sha: str = "c" * 40) -> Verdict:
    speed = [Speed(mode="eager", device="cpu", base_ms=[2.0], candidate_ms=[2.0 / speedup], speedup=speedup,
                   noise_pct=1.0, outcome="n/a", n=5)] if speedup else []
    return Verdict(status=status, reason=reason, summary=f"{status} for the test", workload="flux2", preset="tiny",
                   device="cpu", dtype="float32", base_sha="b" * 40, candidate_sha=sha, candidate=sha, speed=speed)


def test_strength_orders_verdicts():
    ranked = sorted([None, _verdict("rejected", "correctness"), _verdict("held", "implausible", 12.0),
                     _verdict("accepted", None, 1.05), _verdict("accepted", None, 1.2), _verdict("accepted")],
                    key=strength, reverse=True)
    assert [(v.status, v.speedup()) if v else None for v in ranked] == [
        ("accepted", 1.2), ("accepted", 1.05), ("accepted", None), ("held", 12.0), ("rejected", None), None]


@pytest.fixture
def recorded(monkeypatch):
    """bot.validate.validate replaced by a recorder that answers a real Verdict for the commit it is given."""
    calls = []

    def fake_validate(target, candidate, base=None, opts=None):
        calls.append((candidate, base, opts))
        return _verdict("accepted", sha=candidate)

    monkeypatch.setattr(validation, "validate", fake_validate)
    return calls


def test_one_verdict_per_tree_and_speed(scratch_target, tmp_path, recorded):
    wt, base = scratch_target.checkout.repo_path, scratch_target.checkout.base_sha
    ctx = ValidationContext.from_target(scratch_target, tmp_path / "run")
    assert ctx.base_sha == base
    (wt / "src" / "pkg" / "mod.py").write_text("def f(x):\n    return x + x\n")
    snap = snapshot(wt, "snapshot")
    final = commit_candidate(wt, base, "f: add", "", make_trailers("opp-1", "fuse-elementwise-chain", [], []))
    assert snap != final
    first = validate_commit(ctx, snap, speed=False)
    assert validate_commit(ctx, final, speed=False) is first and first.candidate_sha == snap
    timed = validate_commit(ctx, final, speed=True)
    assert timed is not first and timed.candidate_sha == final
    assert [(c, b, o.speed) for c, b, o in recorded] == [(snap, base, False), (final, base, True)]
    for _, _, opts in recorded:
        assert opts.run_dir.parent == tmp_path / "run" / "validation" == opts.cache_dir.parent


def _edit_then_validate(tool: str) -> dict:
    code = "def f(x):\n    return x + x\n"
    return {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"content": [{"type": "tool_use", "name": "write_file", "input": {"path": "src/pkg/mod.py", "content": code}}]},
        {"expect": "wrote", "content": [{"type": "tool_use", "name": tool, "input": {}}]},
        {"content": [{"type": "text", "text": "f: add instead of multiply"}], "stop_reason": "end_turn"}]}]}


def test_validator_that_cannot_judge(api_env, make_task, monkeypatch):
    """The validator raising (a broken base, say) is an error result for the model, and the candidate
    is kept without a verdict, with the reason."""
    def broken(*a, **kw):
        raise RunnerError("the BASE engine failed to run (simulated)")

    monkeypatch.setattr(validation, "validate", broken)
    with MessagesStandin(_edit_then_validate("run_correctness")) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=5)
        r = run_agent(make_task(), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert not s.expect_failures, s.expect_failures
    answer = s.requests[2]["messages"][-1]["content"][0]
    assert answer["is_error"] is True and "the validator could not judge commit" in answer["content"]
    assert "simulated" in answer["content"]
    assert isinstance(r.candidate, Candidate) and r.candidate.title == "f: add instead of multiply"
    assert r.verdict is None and "simulated" in r.error
    assert r.validations[0]["mode"] == "correctness" and "simulated" in r.validations[0]["error"]
    tool = next(x for x in Transcript.read(r.transcript) if x["type"] == "tool" and x["name"] == "run_correctness")
    assert tool["is_error"] is True
    assert Transcript.read(r.transcript)[-1]["error"] == r.error


def test_agent_code_runs_without_keys(api_env, make_task, tmp_path):
    """Code the agent writes runs only in runner children of the validator, whose environment has no
    API key: a module that records ANTHROPIC_API_KEY at import finds it absent. (The scratch engine
    has no model class, so the validator then rejects the candidate as crashed.)"""
    code = ("import os, pathlib\n"  # the child's working directory is its scratch, under the run dir
            "pathlib.Path('probe.txt').write_text(os.environ.get('ANTHROPIC_API_KEY', 'ABSENT'))\n"
            "def f(x):\n    return x * 2\n")
    script = {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"content": [{"type": "tool_use", "name": "write_file", "input": {"path": "src/pkg/mod.py", "content": code}}]},
        {"content": [{"type": "tool_use", "name": "run_microbenchmark", "input": {}}]},
        {"expect": "rejected", "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}]}]}
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=5)
        r = run_agent(make_task(), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert not s.expect_failures, s.expect_failures
    probes = list((tmp_path / "run").rglob("probe.txt"))
    assert probes and all(p.read_text() == "ABSENT" for p in probes), probes
    assert r.validations[0]["mode"] == "speed" and r.validations[0]["status"] == "rejected"
    assert isinstance(r.verdict, Verdict) and (r.verdict.status, r.verdict.reason) == ("rejected", "crashed")
    assert "has no class 'M'" in r.verdict.summary
