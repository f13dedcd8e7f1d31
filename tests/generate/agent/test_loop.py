"""The agent loop with the real anthropic client against the local Messages API stand-in (no engine
run: the scripted agents only read files, or write one that is never validated here)."""
from __future__ import annotations

import pytest

from bot.generate.agent.budget import CostPool
from bot.generate.agent.config import AgentConfig
from bot.generate.agent.loop import run_agent
from bot.generate.agent.parallel import make_client
from bot.generate.agent.prices import cost_usd
from bot.generate.agent.transcript import Transcript
from messages_standin import MessagesStandin, reader_script


def test_loop_transcript_caching_and_cost(api_env, make_task):
    with MessagesStandin(reader_script(3)) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=10)
        pool = CostPool(cfg.max_cost_usd)
        r = run_agent(make_task(), "fuse", cfg, make_client(cfg), pool, log=lambda *_: None)
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


def test_turn_budget_stops(api_env, make_task):
    with MessagesStandin(reader_script(50)) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=3)
        r = run_agent(make_task(), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert r.stop.startswith("turn budget reached (3 of 3") and len(s.requests) == 3


def test_cost_budget_stops_and_is_shared(api_env, make_task):
    # each response claims 100k output tokens: $1.00 at $10/MTok; the pool has $2.50
    script = reader_script(50, usage={"output_tokens": 100_000})
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=50, max_cost_usd=2.5, max_output_tokens=128_000)
        pool = CostPool(cfg.max_cost_usd)
        r = run_agent(make_task(), "fuse", cfg, make_client(cfg), pool, log=lambda *_: None)
    assert "cost budget" in r.stop, r.stop
    assert r.spend.turns == 3 and pool.spent.cost_usd >= 2.5
    # max_tokens of each request shrank with the money left
    assert [q["max_tokens"] for q in s.requests][0] > s.requests[-1]["max_tokens"]


def test_token_budget_stops(api_env, make_task):
    with MessagesStandin(reader_script(50)) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=50, max_tokens=6000)
        r = run_agent(make_task(), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert r.stop.startswith(("token budget reached", "token budget nearly spent")), r.stop
    assert r.spend.billed_tokens > 6000 - 256  # reached, or under 256 tokens left ("nearly spent")


def test_api_error_ends_agent_cleanly(api_env, make_task):
    script = {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"error": {"status": 400, "type": "invalid_request_error", "message": "scripted bad request"}}]}]}
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_retries=0)
        r = run_agent(make_task(), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert r.stop.startswith("API error 400") and "scripted bad request" in r.stop
    assert any(x["type"] == "api_error" for x in Transcript.read(r.transcript))


def test_standin_rejects_malformed_requests(api_env):
    import anthropic

    with MessagesStandin(reader_script(1)) as s:
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


def test_knowledge_reaches_the_cached_system_prompt(api_env, make_task):
    """What earlier attempts taught (a rejected attempt's caveat lesson, learned from a real Verdict) is
    in the cached system block when the pattern, engine and hardware match; other patterns' lessons are not."""
    from bot.knowledge import learn
    from bot.validate.verdict import Correctness, OutputCheck, Verdict

    task = make_task()
    check = OutputCheck("256x256/txt32/b1 seed 5", "noise_pred", False, "noise_pred: max abs 3 at [0, 1]", max_abs=3.0,
                        at=[0, 1], rel_l2=0.4)
    v = Verdict(status="rejected", reason="correctness", summary="1 of 1 output checks fail", workload="flux2",
                preset="tiny", device="cpu", dtype="float32", base_sha=task.vctx.base_sha, candidate_sha="c" * 40,
                candidate="c" * 40, correctness=Correctness(False, [5, 6, 7], ["256x256/txt32/b1"], "rel_l2", [check]))

    def learned(kind: str):
        o = learn.Outcome(candidate_id="c1", kind=kind, generator="agent/fuse", run_id="20261201-000000-optimize-abc123",
                          status=v.status, reason=f"{v.reason}: {v.summary}", numbers={"failures": [check.reason]},
                          device="cpu", hardware="cpu", engine="diffusers", engine_source="scratch",
                          base_sha=v.base_sha, commit_sha=v.candidate_sha, title=f"{kind}: gate the wrong half",
                          patch="", verdict=v.to_json())
        return learn.learn(o, store_dir=task.store_dir, lessons_dir=task.lessons_dir).lesson_path.stem

    mine, other = learned("fuse-elementwise-chain"), learned("merge-siblings")
    with MessagesStandin(reader_script(0)) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=2)
        run_agent(task, "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    system = s.requests[0]["system"]
    assert "cache_control" in system[-1] and "Root cause" in system[-1]["text"]
    assert mine in system[-1]["text"] and other not in system[-1]["text"]


def test_a_response_cut_off_at_max_tokens_is_continued(api_env, make_task):
    """stop_reason max_tokens does not end the agent: its (maybe incomplete) tool call is answered
    "send it again" without running, a text block asks it to continue, and the turn goes on."""
    read = {"type": "tool_use", "name": "read_file", "input": {"path": "src/pkg/mod.py"}}
    script = {"conversations": [{"match": "Strategy: fuse", "turns": [
        {"content": [{"type": "text", "text": "reading"}, read], "stop_reason": "max_tokens"},
        {"expect": "cut off at the output token limit", "content": [read]},
        {"expect": "return x * 2", "content": [{"type": "text", "text": "nothing to change"}], "stop_reason": "end_turn"}]}]}
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        cfg = AgentConfig(max_turns=5)
        r = run_agent(make_task(), "fuse", cfg, make_client(cfg), CostPool(5.0), log=lambda *_: None)
    assert not s.expect_failures, s.expect_failures
    assert r.stop == "done (end_turn)" and r.cut_off == 1 and r.tool_calls == 1 and len(s.requests) == 3
    answer = s.requests[1]["messages"][-1]["content"]
    assert answer[0]["type"] == "tool_result" and answer[0]["is_error"] and "send it again" in answer[0]["content"]
    assert any(x["type"] == "cut_off" for x in Transcript.read(r.transcript))
