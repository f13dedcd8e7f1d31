"""The agent loop with the real anthropic client against the local Messages API stand-in (no engine
run: the scripted agents only read files, or write one that is never validated here)."""
from __future__ import annotations

import json

import pytest

from bot.generate.agent.budget import CostPool
from bot.generate.agent.config import OFF_MESSAGE, AgentConfig
from bot.generate.agent.loop import AgentTask, run_agent
from bot.generate.agent.parallel import generate, make_client
from bot.generate.agent.prices import PRICES, Price, cost_usd, price_for
from bot.generate.agent.transcript import Transcript
from bot.generate.agent.validation import ValidationContext
from messages_standin import MessagesStandin


def _task(engine, tmp_path, kind="fuse-elementwise-chain"):
    vctx = ValidationContext(workload={"name": "scratch", "presets": {"tiny": {"shapes": {"resolution": [16, 16], "text_tokens": 4, "batch": 1}}}}, preset="tiny",
                             device="cpu", dtype="float32", model_class="pkg.mod.M", import_root="src",
                             base_worktree=engine.repo_path, base_sha=engine.base_sha, work_dir=tmp_path / "run")
    return AgentTask(run_id="test-run", run_dir=tmp_path / "run", checkout=engine, vctx=vctx,
                     opportunity={"id": "opp-1", "kind": kind}, engine="diffusers", hardware="cpu",
                     lessons_dir=tmp_path / "lessons", store_dir=tmp_path / "store")


READ = {"type": "tool_use", "name": "read_file", "input": {"path": "src/pkg/mod.py"}}


def _reader_script(n_reads: int, match="Strategy: fuse", usage=None) -> dict:
    turns = [{"content": [{"type": "text", "text": f"look {i}"}, READ], **({"usage": usage} if usage else {})}
             for i in range(n_reads)]
    turns.append({"content": [{"type": "text", "text": "nothing to change"}], "stop_reason": "end_turn"})
    return {"conversations": [{"match": match, "turns": turns}]}


def test_off_without_api_key(monkeypatch, scratch_engine, tmp_path):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    lines = []
    gen = generate(_task(scratch_engine, tmp_path), AgentConfig(), log=lines.append)
    assert gen.off and lines == [OFF_MESSAGE]
    assert "ANTHROPIC_API_KEY" in OFF_MESSAGE and "\n" not in OFF_MESSAGE


def test_price_table_and_cost():
    assert price_for("claude-sonnet-5-5") == PRICES["claude-sonnet-5-5"]
    assert price_for("claude-sonnet-4-5-20250929") == PRICES["claude-sonnet-4-5"]  # dated id -> its family
    assert price_for("claude-sonnet-5-5-20260901") == PRICES["claude-sonnet-5-5"]  # longest prefix wins
    p = Price(2.0, 10.0, 2.5, 0.2)
    u = {"input_tokens": 1000, "output_tokens": 500, "cache_creation_input_tokens": 2000, "cache_read_input_tokens": 10000}
    assert cost_usd(p, u) == pytest.approx((1000 * 2 + 500 * 10 + 2000 * 2.5 + 10000 * 0.2) / 1e6)


def test_unknown_model_needs_a_price(monkeypatch):
    from bot.errors import ConfigError

    with pytest.raises(ConfigError, match="OPTBOT_AGENT_MODEL"):
        AgentConfig(model="claude-unknown-9")
    monkeypatch.setenv("OPTBOT_AGENT_PRICES", "1,2,3,4")
    assert AgentConfig(model="claude-unknown-9").price == Price(1, 2, 3, 4)


def test_loop_transcript_caching_and_cost(api_env, scratch_engine, tmp_path):
    with MessagesStandin(_reader_script(3)) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=10)
        pool = CostPool(cfg.max_cost_usd)
        r = run_agent(_task(scratch_engine, tmp_path), "fuse", cfg, make_client(cfg), pool, log=lambda *_: None)
    assert r.stop == "done (end_turn)" and r.tool_calls == 3 and r.candidate is None
    assert r.spend.turns == 4 and len(s.requests) == 4 and not s.expect_failures
    recs = Transcript.read(r.transcript)
    assert [x["type"] for x in recs].count("request") == 4 and [x["type"] for x in recs].count("response") == 4
    usages = [x["usage"] for x in recs if x["type"] == "usage"]
    # the first request writes the cache; later ones read the static prefix (tools + rules + knowledge)
    assert usages[0]["cache_creation_input_tokens"] > 0 and usages[0]["cache_read_input_tokens"] == 0
    assert all(u["cache_read_input_tokens"] >= usages[0]["cache_creation_input_tokens"] for u in usages[1:])
    expected = sum(cost_usd(cfg.price, u) for u in usages)
    assert r.spend.cost_usd == pytest.approx(expected) and pool.spent.cost_usd == pytest.approx(expected)
    # the tool result went back to the model with the file's content, answering the tool_use id
    last = s.requests[1]["messages"][-1]["content"][0]
    assert last["type"] == "tool_result" and "return x * 2" in last["content"]
    # at most one moving breakpoint in messages, static ones on tools and system
    assert "cache_control" in s.requests[1]["tools"][-1] and "cache_control" in s.requests[1]["system"][-1]


def test_turn_budget_stops(api_env, scratch_engine, tmp_path):
    with MessagesStandin(_reader_script(50)) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=3)
        r = run_agent(_task(scratch_engine, tmp_path), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert r.stop.startswith("turn budget reached (3 of 3") and len(s.requests) == 3


def test_cost_budget_stops_and_is_shared(api_env, scratch_engine, tmp_path):
    # each response claims 100k output tokens: $1.00 at $10/MTok; the pool has $2.50
    script = _reader_script(50, usage={"output_tokens": 100_000})
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=50, max_cost_usd=2.5, max_output_tokens=128_000)
        pool = CostPool(cfg.max_cost_usd)
        r = run_agent(_task(scratch_engine, tmp_path), "fuse", cfg, make_client(cfg), pool, log=lambda *_: None)
    assert "cost budget" in r.stop, r.stop
    assert r.spend.turns == 3 and pool.spent.cost_usd >= 2.5
    # max_tokens of each request shrank with the money left
    assert [q["max_tokens"] for q in s.requests][0] > s.requests[-1]["max_tokens"]


def test_token_budget_stops(api_env, scratch_engine, tmp_path):
    with MessagesStandin(_reader_script(50)) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=50, max_tokens=6000)
        r = run_agent(_task(scratch_engine, tmp_path), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert r.stop.startswith(("token budget reached", "token budget nearly spent")), r.stop
    assert r.spend.billed_tokens >= 6000


def test_api_error_ends_agent_cleanly(api_env, scratch_engine, tmp_path):
    script = {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"error": {"status": 400, "type": "invalid_request_error", "message": "scripted bad request"}}]}]}
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_retries=0)
        r = run_agent(_task(scratch_engine, tmp_path), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert r.stop.startswith("API error 400") and "scripted bad request" in r.stop
    assert any(x["type"] == "api_error" for x in Transcript.read(r.transcript))


def test_standin_rejects_malformed_requests(api_env):
    import anthropic

    with MessagesStandin(_reader_script(1)) as s:
        client = anthropic.Anthropic(api_key="k", base_url=s.base_url, max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="roles must alternate"):
            client.messages.create(model="m", max_tokens=10, messages=[{"role": "assistant", "content": "hi"}])
        with pytest.raises(anthropic.BadRequestError, match="tool_use_id"):
            client.messages.create(model="m", max_tokens=10, messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}])
        cc = {"type": "ephemeral"}
        with pytest.raises(anthropic.BadRequestError, match="maximum of 4"):
            client.messages.create(model="m", max_tokens=10, system=[{"type": "text", "text": str(i), "cache_control": cc}
                                                                     for i in range(5)],
                                   messages=[{"role": "user", "content": "Strategy: fuse"}])
        m = client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "Strategy: fuse"}])
        assert m.type == "message" and m.stop_reason == "tool_use" and m.content[1].name == "read_file"
        assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0


def test_failed_agent_does_not_sink_the_others(api_env, scratch_engine, tmp_path, monkeypatch):

    import bot.engine

    real = bot.engine.add_worktree

    def flaky(checkout, name, ref=None):
        if "tile-tune" in name:
            raise bot.engine.EngineError("cannot add worktree (simulated)")
        return real(checkout, name, ref)

    monkeypatch.setattr(bot.engine, "add_worktree", flaky)
    script = _reader_script(1)
    script["conversations"].append({"match": "Strategy: tile-tune", "turns": []})
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        lines = []
        gen = generate(_task(scratch_engine, tmp_path), AgentConfig(strategies=("fuse", "tile-tune"), rounds=0),
                       log=lines.append)
    stops = {r.strategy: r.stop for r in gen.results}
    assert stops["fuse"] == "done (end_turn)" and stops["tile-tune"].startswith("failed: EngineError")
    assert any(line.startswith("agent cost: ") for line in lines)



def test_agent_code_runs_without_keys(api_env, scratch_engine, tmp_path):
    """Code the agent writes runs only in runner children, whose environment has no API key: a module
    that records ANTHROPIC_API_KEY at import finds it absent."""
    probe = tmp_path / "probe.txt"
    code = ("import os, pathlib\n"
            f"pathlib.Path({str(probe)!r}).write_text(os.environ.get('ANTHROPIC_API_KEY', 'ABSENT'))\n"
            "def f(x):\n    return x * 2\n")
    script = {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"content": [{"type": "tool_use", "name": "write_file", "input": {"path": "src/pkg/mod.py", "content": code}}]},
        {"content": [{"type": "tool_use", "name": "run_microbenchmark", "input": {}}]},
        {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}]}]}
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=5)
        r = run_agent(_task(scratch_engine, tmp_path), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert probe.read_text() == "ABSENT"
    assert r.checks and r.checks[0]["mode"] == "speed"
