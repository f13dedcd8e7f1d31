"""The agent's search (bot/generate/agent/parallel.py, bot/steps/generate._agent): several samples per
strategy, refine rounds told what the other agents found, and opportunities beyond the first worked
in rank order while the budget lasts. The real anthropic client talks to the scripted stand-in; the
validator is replaced by a recorder that judges the commit's file (TEST SEAM: the real validator is
driven end to end by test_parallel.py's slow test), so each test takes seconds."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

import bot.generate.agent.validation as validation
from bot.generate.agent import prompts
from bot.generate.agent.budget import Spend
from bot.generate.agent.config import AgentConfig
from bot.generate.agent.loop import AgentResult
from bot.generate.agent.parallel import generate
from bot.generate.agent.transcript import Transcript
from bot.generate.candidate import Candidate
from bot.validate.verdict import Verdict
from messages_standin import MessagesStandin

MOD = "src/pkg/mod.py"
GOOD = "def f(x):\n    return x + x\n"  # what the recorder accepts (the same values as x * 2)
WRONG = "def f(x):\n    return x * 3\n"


def tu(name, **inp):
    return {"type": "tool_use", "name": name, "input": inp}


def text(t):
    return {"type": "text", "text": t}


def first_message(req: dict) -> str:
    c = req["messages"][0]["content"]
    return c if isinstance(c, str) else " ".join(b.get("text", "") for b in c)


def _verdict(status, reason, sha) -> Verdict:
    return Verdict(status=status, reason=reason, summary=f"{status} by the test's recorder", workload="flux2",
                   preset="tiny", device="cpu", dtype="float32", base_sha="b" * 40, candidate_sha=sha, candidate=sha)


@pytest.fixture
def judged(monkeypatch, scratch_target):
    """bot.validate.validate replaced: accepted when the commit's mod.py is GOOD, else rejected
    (correctness). Returns the commits it was asked to judge."""
    calls = []

    def fake_validate(target, candidate, base=None, opts=None):
        calls.append(candidate)
        src = target.checkout.repo.git.show(f"{candidate}:{MOD}") + "\n"
        return _verdict("accepted", None, candidate) if src == GOOD else _verdict("rejected", "correctness", candidate)

    monkeypatch.setattr(validation, "validate", fake_validate)
    return calls


def test_samples_per_strategy_are_run_named_and_told_apart(api_env, make_task):
    script = {"conversations": [{"match": "", "turns": [{"content": [text("nothing to change")],
                                                         "stop_reason": "end_turn"}]}]}
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        gen = generate(make_task(), AgentConfig(strategies=("fuse", "tile-tune"), samples=2, rounds=2),
                       log=lambda *_: None)
    names = sorted(r.name for r in gen.results)
    assert names == ["r1-fuse-s1", "r1-fuse-s2", "r1-tile-tune-s1", "r1-tile-tune-s2"]
    assert gen.best is None and gen.rounds_note == "refine round 2 not run: no agent made a candidate"
    # one request each, and each (strategy, sample) told apart in its first message
    firsts = [first_message(q) for q in s.requests]
    assert len(firsts) == 4
    for strategy in ("fuse", "tile-tune"):
        for k in (1, 2):
            hits = [m for m in firsts if m.startswith(prompts.STRATEGIES[strategy]) and f"Sample {k} of 2" in m]
            assert len(hits) == 1, (strategy, k, firsts)
            assert ("take a different approach from the obvious one" in hits[0]) == (k == 2)
    # the cached prefix (tools, system) is the same for every agent: strategy and sample are in the message
    assert len({json.dumps(q["system"], sort_keys=True) for q in s.requests}) == 1
    assert len({json.dumps(q["tools"], sort_keys=True) for q in s.requests}) == 1
    # all four charged the one pool; each transcript names its sample
    assert gen.spend.turns == 4 == sum(r.spend.turns for r in gen.results)
    starts = {r.name: Transcript.read(r.transcript)[0] for r in gen.results}
    assert {n: (st["strategy"], st["sample"], st["samples"]) for n, st in starts.items()} == {
        "r1-fuse-s1": ("fuse", 1, 2), "r1-fuse-s2": ("fuse", 2, 2),
        "r1-tile-tune-s1": ("tile-tune", 1, 2), "r1-tile-tune-s2": ("tile-tune", 2, 2)}


def test_one_sample_keeps_the_plain_name_and_message(api_env, make_task):
    script = {"conversations": [{"match": "", "turns": [{"content": [text("no")], "stop_reason": "end_turn"}]}]}
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        gen = generate(make_task(), AgentConfig(strategies=("fuse",), samples=1, rounds=0), log=lambda *_: None)
    assert [r.name for r in gen.results] == ["r1-fuse"] and "Sample" not in first_message(s.requests[0])


def edit_then_check(content: str, title: str) -> list[dict]:
    """Turns that write mod.py, validate it, and end with `title`."""
    return [{"content": [tu("write_file", path=MOD, content=content)]},
            {"expect": "wrote", "content": [tu("run_correctness")]},
            {"content": [text(title)], "stop_reason": "end_turn"}]


def test_refine_rounds_are_told_what_the_other_agents_found(api_env, make_task, judged):
    script = {"conversations": [
        {"match": "Strategy: refine", "turns": [
            {"content": [tu("read_file", path=MOD)]},
            {"expect": "x + x", "content": [text("f: nothing left to improve")], "stop_reason": "end_turn"}]},
        {"match": "Sample 1 of 2", "turns": edit_then_check(GOOD, "f: add instead of multiply")},
        {"match": "Sample 2 of 2", "turns": edit_then_check(WRONG, "f: times three")},
    ]}
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        gen = generate(make_task(), AgentConfig(strategies=("fuse",), samples=2, rounds=2, max_turns=6),
                       log=lambda *_: None)
    assert not s.expect_failures, s.expect_failures
    by = {r.name: r for r in gen.results}
    assert list(by) == ["r1-fuse-s1", "r1-fuse-s2", "r2-refine", "r3-refine"]
    assert by["r1-fuse-s1"].verdict.status == "accepted" and by["r1-fuse-s2"].verdict.status == "rejected"
    assert gen.best is by["r1-fuse-s1"]  # the refinements changed nothing: not stronger
    refines = [first_message(q) for q in s.requests if first_message(q).startswith(prompts.STRATEGIES["refine"])]
    openings = list(dict.fromkeys(refines))  # each refine agent's first message, in the order they ran
    assert len(openings) == 2
    r2, r3 = openings
    for m in (r2, r3):
        # the best candidate's verdict, then the others' findings, not the best's own
        assert "Verdict of the candidate you start from:\nverdict: ACCEPTED" in m, m
        assert "What the other agents found" in m and "- r1-fuse-s1 " not in m
        assert "- r1-fuse-s2 (strategy fuse): candidate rejected (correctness): rejected by the test's recorder" in m
        assert "  its summary: f: times three" in m and "  validations: correctness rejected (correctness)" in m
        assert "  kernel tests: none run" in m
    # round 3 also hears of round 2's refinement
    assert "- r2-refine (strategy refine): candidate accepted" not in r2
    assert "- r2-refine (strategy refine): candidate accepted" in r3 and "its summary: f: nothing left to improve" in r3


def _result(name, strategy, *, verdict=None, cand=True, stop="done (end_turn)", error="", summary="",
            validations=(), kernel_tests=()):
    c = Candidate(f"agent-{name}", "opp-1", "fuse-elementwise-chain", f"agent/{strategy}", "", "a" * 40,
                  adds_kernels=["swiglu_kernel"] if cand else []) if cand else None
    return AgentResult(name, strategy, stop, Spend(), "", "", candidate=c, verdict=verdict, error=error,
                       summary=summary, validations=list(validations), kernel_tests=list(kernel_tests))


def test_findings_digest_is_compact_whole_and_ranked():
    ok = _verdict("accepted", None, "c" * 40)
    bad = _verdict("rejected", "correctness", "d" * 40)
    results = [
        _result("r1-fuse-s2", "fuse", verdict=bad, summary="SwiGLU in one kernel\n\nlong body",
                validations=[{"mode": "correctness", "status": "rejected", "reason": "correctness"}] * 2
                + [{"mode": "correctness", "error": "the base engine fails\ntraceback ..."}],
                kernel_tests=[{"path": "test_swiglu.py", "ok": False, "reason": "max abs 3.1e-2 at [0, 17]\nmore"},
                              {"path": "test_swiglu.py", "ok": True, "reason": "6 cases"},
                              {"path": "test_gelu.py", "ok": False, "reason": "max abs 1.0 at [3]"}]),
        _result("r1-tile-tune-s1", "tile-tune", cand=False, stop="failed: EngineError: cannot add worktree"),
        _result("r1-restructure-s1", "restructure", verdict=None, error="not validated: wall-time budget reached"),
        _result("r2-refine", "refine", verdict=ok, summary="refined"),
    ]
    d = prompts.findings_digest(results)
    lines = d.splitlines()
    assert lines[0].startswith("What the other agents found (4 of the earlier rounds, strongest first")
    # strongest first: accepted, rejected, no verdict, no candidate
    heads = [ln for ln in lines if ln.startswith("- ")]
    assert [h.split(" ")[1] for h in heads] == ["r2-refine", "r1-fuse-s2", "r1-restructure-s1", "r1-tile-tune-s1"]
    assert "- r1-fuse-s2 (strategy fuse): candidate rejected (correctness): rejected by the test's recorder" in lines
    assert "  its summary: SwiGLU in one kernel" in lines and "long body" not in d
    assert ("  validations: correctness rejected (correctness) x2, correctness error: the base engine fails"
            in lines) and "traceback" not in d
    assert ("  kernel tests: test_swiglu.py: 2 runs, last PASS; test_gelu.py: 1 run, last FAIL (max abs 1.0 at [3])"
            in lines)
    assert "  declared kernels: adds swiglu_kernel; removes none" in lines
    assert "- r1-restructure-s1 (strategy restructure): candidate without a verdict: not validated: wall-time " \
           "budget reached" in lines
    assert "- r1-tile-tune-s1 (strategy tile-tune): no candidate" in lines
    assert "  stopped: failed: EngineError: cannot add worktree" in lines
    # over the limit: whole agents are left out, the weakest, and counted
    refine, fuse, tile, restructure = (prompts.finding(r) for r in results[::-1][:1] + results[:3])
    limit = len(lines[0]) + len(refine) + len(fuse) + 2 + 80 + 10  # room for the two strongest only
    small = prompts.findings_digest(results, max_chars=limit)
    assert small.startswith(lines[0] + "\n" + refine + "\n" + fuse + "\n")
    assert restructure not in small and tile not in small
    assert small.endswith("(2 more agents left out for space, the weakest)")
    assert prompts.findings_digest([]) == ""


# ---------------------------------------------------------------- the generate step: opportunities in rank order

@pytest.fixture
def step(tmp_path, scratch_target, monkeypatch, api_env):
    """A run context on the scratch engine for bot/steps/generate._agent: one fuse agent per
    opportunity (env), no refine round, an empty knowledge folder."""
    from bot.run.context import Budget, RunContext, RunOptions
    from bot.run.state import Results

    for k, v in {"OPTBOT_AGENT_STRATEGIES": "fuse", "OPTBOT_AGENT_SAMPLES": "1", "OPTBOT_AGENT_ROUNDS": "0",
                 "OPTBOT_AGENT_MAX_TURNS": "5"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("OPTBOT_AGENT_MAX_OPPORTUNITIES", raising=False)
    monkeypatch.delenv("OPTBOT_AGENT_MAX_COST", raising=False)

    def make(cost_usd=None):
        opts = RunOptions(workload="flux2", budget_cost_usd=cost_usd, knowledge_path=str(tmp_path / "knowledge"))
        lines = []
        ctx = RunContext("r", tmp_path / "run", opts, Budget(wall_s=600.0, cost_usd=cost_usd),
                         Results(profile=SimpleNamespace(load=lambda: None)), log=lines.append)
        ctx._target = scratch_target
        return ctx

    return make


def _opps():
    from tests.fakes import opportunity
    return [opportunity("fuse-elementwise-chain", id="opp-a", gain=2.0),
            opportunity("fuse-norm-consumer", id="opp-b", gain=1.0)]


def _edit_script(usage=None):
    turns = [{"content": [tu("write_file", path=MOD, content=GOOD)], **({"usage": usage} if usage else {})},
             {"content": [text("f: add instead of multiply")], "stop_reason": "end_turn"}]
    return {"conversations": [{"match": "Strategy: fuse", "turns": turns}]}


def test_opportunities_are_worked_in_rank_order_each_with_the_budget_left(step, judged, api_env):
    from bot.steps import generate as gstep

    ctx, res = step(cost_usd=3.0), gstep.Result("done", "")
    with MessagesStandin(_edit_script()) as s:
        api_env(s.base_url)
        notes = gstep._agent(ctx, _opps(), res)
    assert not s.expect_failures
    # opp-a's agent ran (all its requests) before opp-b's
    opened = [("opp-a" if "## Opportunity opp-a" in m else "opp-b") for m in map(first_message, s.requests)]
    assert opened == ["opp-a", "opp-a", "opp-b", "opp-b"]
    assert [c.opportunity_id for c in res.candidates] == ["opp-a", "opp-b"]
    assert [c.generator for c in res.candidates] == ["agent/fuse", "agent/fuse"]
    assert len(notes) == 2, notes
    assert notes[0].startswith("agent on opportunity 1 of 2, fuse-elementwise-chain opp-a: 1 agents")
    assert notes[1].startswith("agent on opportunity 2 of 2, fuse-norm-consumer opp-b: 1 agents")
    assert all("-> candidate " in n and "(accepted)" in n for n in notes)
    # the second opportunity's pool is what the first left of the run's --budget cost
    recs = [Transcript.read(ctx.run_dir / "agent" / "agent" / f"{n}.jsonl") for n in ("o1-r1-fuse", "o2-r1-fuse")]
    (start_a, end_a), (start_b, end_b) = [(r[0], r[-1]) for r in recs]
    cost_a, cost_b = end_a["spend"]["cost_usd"], end_b["spend"]["cost_usd"]
    assert cost_a > 0 and cost_b > 0 and res.agent_cost_usd == pytest.approx(cost_a + cost_b, abs=1e-5)
    assert start_a["budgets"]["usd_pool"] == 3.0
    assert start_b["budgets"]["usd_pool"] == pytest.approx(3.0 - cost_a, abs=1e-5)
    assert 0 < start_b["budgets"]["wall_s_pool"] <= start_a["budgets"]["wall_s_pool"] <= 600.0


def test_the_next_opportunity_is_skipped_when_the_budget_is_spent(step, judged, api_env):
    from bot.generate.agent.config import AgentConfig
    from bot.steps import generate as gstep

    price = AgentConfig().price
    # the first response alone costs more than the $1 budget
    usage = {"output_tokens": math.ceil(1.0 / price.output * 1e6) + 1000}
    ctx, res = step(cost_usd=1.0), gstep.Result("done", "")
    with MessagesStandin(_edit_script(usage)) as s:
        api_env(s.base_url)
        notes = gstep._agent(ctx, _opps(), res)
    assert not any("## Opportunity opp-b" in first_message(q) for q in s.requests)
    assert len(s.requests) == 1  # the agent stopped on the cost budget after its first response
    assert [c.opportunity_id for c in res.candidates] == ["opp-a"]  # its edit is still the candidate
    assert res.agent_cost_usd > 1.0
    assert notes[0].startswith("agent on opportunity 1 of 2, fuse-elementwise-chain opp-a")
    assert "-> candidate" in notes[0]
    assert notes[1].startswith("agent: stopped after 1 of 2 opportunities: the USD budget is spent ($")
    assert notes[1].endswith("of $1.00); not worked: fuse-norm-consumer opp-b")


def test_the_opportunity_cap_stops_the_loop(step, judged, api_env, monkeypatch):
    from bot.steps import generate as gstep

    monkeypatch.setenv("OPTBOT_AGENT_MAX_OPPORTUNITIES", "1")
    ctx, res = step(), gstep.Result("done", "")
    with MessagesStandin(_edit_script()) as s:
        api_env(s.base_url)
        notes = gstep._agent(ctx, _opps(), res)
    assert [c.opportunity_id for c in res.candidates] == ["opp-a"] and len(s.requests) == 2
    assert notes[1] == ("agent: stopped after 1 of 2 opportunities: the cap of 1 opportunities is reached "
                        "(OPTBOT_AGENT_MAX_OPPORTUNITIES); not worked: fuse-norm-consumer opp-b")


def test_env_parses_the_search_settings(monkeypatch):
    for k, v in {"OPTBOT_AGENT_SAMPLES": "3", "OPTBOT_AGENT_ROUNDS": "0", "OPTBOT_AGENT_MAX_OPPORTUNITIES": "5",
                 "OPTBOT_AGENT_PARALLEL": "4"}.items():
        monkeypatch.setenv(k, v)
    cfg = AgentConfig.from_env()
    assert (cfg.samples, cfg.rounds, cfg.max_opportunities, cfg.parallel) == (3, 0, 5, 4)
    for k in ("OPTBOT_AGENT_SAMPLES", "OPTBOT_AGENT_ROUNDS", "OPTBOT_AGENT_MAX_OPPORTUNITIES", "OPTBOT_AGENT_PARALLEL"):
        monkeypatch.delenv(k)
    d = AgentConfig.from_env()
    assert (d.samples, d.rounds, d.max_opportunities, d.parallel) == (2, 2, 3, 6)
    from bot.errors import ConfigError
    monkeypatch.setenv("OPTBOT_AGENT_SAMPLES", "0")
    with pytest.raises(ConfigError):
        AgentConfig.from_env()
