"""The agent's calls of THE validator (bot/generate/agent/validation.py): one verdict per (tree, speed),
the ranking of verdicts, a validator that cannot judge, and candidate code running only in runner
children without keys."""
from __future__ import annotations

from pathlib import Path

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


# ------------------------------------------------------------------------------------------------
# kernels declared by the agent; the best validated snapshot; the wall-time budget

KERNELS = Path(__file__).resolve().parents[1] / "kernels"  # scaled_add.py and its test (kernel test contract)
# its float32 case only: under the interpreter its bf16 store of an fp32 sum is garbage (it is the
# variant search's fixture, checked in float32 there)
FP32_ONLY = ('CASES = [("float32", 1e-6, 1e-6), ("bfloat16", 1e-2, 1e-2)]', 'CASES = [("float32", 1e-6, 1e-6)]')
GOOD, BROKEN = "def f(x):\n    return x + x\n", "def f(x):\n    return x + x + 1  # BROKEN\n"


def _write(path, content):
    return {"type": "tool_use", "name": "write_file", "input": {"path": path, "content": content}}


def _call(name, **inp):
    return {"type": "tool_use", "name": name, "input": inp}


@pytest.fixture
def by_content(monkeypatch, scratch_target):
    """bot.validate.validate replaced by a judge of the file the scripts edit: BROKEN is a correctness
    rejection, anything else accepted. Records (sha, trailers of the stack) per call."""
    from bot.trailers import parse_trailer_lists

    calls = []
    repo = scratch_target.checkout.repo

    def judge(target, candidate, base=None, opts=None):
        calls.append((candidate, parse_trailer_lists(repo.commit(candidate).message)))
        broken = "BROKEN" in repo.git.show(f"{candidate}:src/pkg/mod.py")
        return _verdict("rejected", "correctness") if broken else _verdict("accepted", sha=candidate)

    monkeypatch.setattr(validation, "validate", judge)
    return calls


def test_declared_kernels_are_tested_and_reach_the_validator(api_env, make_task, by_content):
    """declare_kernels -> run_kernel_test runs the store's kernel_test job (sandboxed child, Triton
    under TRITON_INTERPRET=1 on CPU); the validated commit and the candidate carry the declaration,
    and the validator's kernel check (kernel_tests_for) finds the test in the candidate's worktree."""
    from bot.validate.correctness import kernel_tests_for
    from bot.validate.resolve import resolve_candidate

    test = "src/pkg/kernels/test_scaled_add.py"
    test_text = (KERNELS / "test_scaled_add.py").read_text()
    assert FP32_ONLY[0] in test_text
    script = {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"content": [_write("src/pkg/kernels/scaled_add.py", (KERNELS / "scaled_add.py").read_text()),
                     _write(test, test_text.replace(*FP32_ONLY)), _write("src/pkg/mod.py", GOOD)]},
        {"content": [_call("declare_kernels", adds=["_scaled_add"], removes=["aten::mul"], tests=[test])]},
        {"expect": "declared", "content": [_call("run_kernel_test")]},
        {"expect": "PASS", "content": [_call("run_correctness")]},
        {"expect": "accepted", "content": [text_block("scaled add kernel")], "stop_reason": "end_turn"}]}]}
    task = make_task()
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=8)
        r = run_agent(task, "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert not s.expect_failures, s.expect_failures
    assert [k["ok"] for k in r.kernel_tests] == [True] and "TRITON_INTERPRET=1" in r.kernel_tests[0]["reason"]
    assert "kernel path triton" in r.kernel_tests[0]["reason"]
    declared = {"Optbot-Adds-Kernels": ["_scaled_add"], "Optbot-Removes-Kernels": ["aten::mul"],
                "Optbot-Kernel-Tests": [test]}
    (sha, trailers), = by_content  # one validation: the final commit shares the snapshot's verdict
    assert all(trailers[k] == v for k, v in declared.items()) and sha == r.validations[0]["commit"]
    c = r.candidate
    assert c.adds_kernels == ["_scaled_add"] and c.removes_kernels == ["aten::mul"]
    assert c.trailers["Optbot-Kernel-Tests"] == test and r.verdict.status == "accepted"
    rev = resolve_candidate(task.checkout, c.commit_sha, task.vctx.base_sha)
    assert all(rev.trailers[k] == v for k, v in declared.items())
    assert kernel_tests_for(rev, task.store_dir) == [str(rev.worktree / test)]


def text_block(t):
    return {"type": "text", "text": t}


def test_a_later_break_hands_on_the_best_snapshot(api_env, make_task, by_content):
    """Correct, validated; then an edit that breaks it: the candidate is the correct snapshot."""
    script = {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"content": [_write("src/pkg/mod.py", GOOD)]},
        {"content": [_call("run_correctness")]},
        {"expect": "accepted", "content": [_write("src/pkg/mod.py", BROKEN)]},
        {"content": [_call("run_correctness")]},
        {"expect": "rejected", "content": [text_block("f: add (a last tweak)")], "stop_reason": "end_turn"}]}]}
    task = make_task()
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=8)
        r = run_agent(task, "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert not s.expect_failures, s.expect_failures
    good = r.validations[0]["commit"]
    assert [v["status"] for v in r.validations] == ["accepted", "rejected"]
    assert r.from_snapshot == good and r.verdict.status == "accepted"
    repo = task.checkout.repo
    assert repo.commit(r.candidate.commit_sha).tree == repo.commit(good).tree
    assert repo.git.show(f"{r.candidate.commit_sha}:src/pkg/mod.py") == GOOD.rstrip("\n")
    assert repo.commit(r.candidate.commit_sha).parents[0].hexsha == task.vctx.base_sha
    assert good[:12] in r.candidate.description and len(by_content) == 2  # no third validation


def test_wall_time_spent_is_a_clean_stop_with_the_best_snapshot(api_env, make_task, by_content, monkeypatch):
    """The shared wall-time budget runs out during a validation: no further request and no further
    validation; the candidate is the validated snapshot, not the unvalidated edit after it."""
    pool = CostPool(5.0, max_wall_s=600.0)
    judge = validation.validate

    def slow(*a, **kw):
        pool.started -= 601  # the validation took the rest of the wall time
        return judge(*a, **kw)

    monkeypatch.setattr(validation, "validate", slow)
    script = {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"content": [_write("src/pkg/mod.py", GOOD)]},
        {"content": [_call("run_correctness"), _write("src/pkg/mod.py", BROKEN)]},
        {"content": [text_block("never sent")], "stop_reason": "end_turn"}]}]}
    task = make_task()
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=8)
        r = run_agent(task, "fuse", cfg, make_client(cfg), pool, log=lambda *_: None)
    assert r.stop.startswith("wall-time budget reached") and len(s.requests) == 2, r.stop
    assert len(by_content) == 1 and r.verdict.status == "accepted" and r.from_snapshot == r.validations[0]["commit"]
    assert task.checkout.repo.git.show(f"{r.candidate.commit_sha}:src/pkg/mod.py") == GOOD.rstrip("\n")
