"""Several agents in parallel, the strongest refined (bot/generate/agent/parallel.py): off without a
key; one failed agent does not sink the others; and end to end, the scripted stand-in drives real
agents (real anthropic client, real tool calls, THE validator's runner processes on the tiny FLUX.2
engine) to one candidate the validator accepts and one it rejects, then refines the accepted one."""
from __future__ import annotations

import json
from pathlib import Path

import git
import pytest

from bot.generate.agent.config import OFF_MESSAGE, AgentConfig
from bot.generate.agent.loop import AgentTask
from bot.generate.agent.parallel import generate
from bot.generate.agent.transcript import Transcript
from bot.generate.agent.validation import ValidationContext
from bot.generate.candidate import Candidate
from bot.target import resolve_target
from bot.trailers import parse_trailers
from bot.validate.verdict import Verdict
from messages_standin import MessagesStandin, reader_script


def test_off_without_api_key(monkeypatch, make_task):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    lines = []
    gen = generate(make_task(), AgentConfig(), log=lines.append)
    assert gen.off and lines == [OFF_MESSAGE] and gen.results == []
    assert "ANTHROPIC_API_KEY" in OFF_MESSAGE and "\n" not in OFF_MESSAGE


def test_failed_agent_does_not_sink_the_others(api_env, make_task, monkeypatch):
    import bot.engine

    real = bot.engine.add_worktree

    def flaky(checkout, name, ref=None):
        if "tile-tune" in name:
            raise bot.engine.EngineError("cannot add worktree (simulated)")
        return real(checkout, name, ref)

    monkeypatch.setattr(bot.engine, "add_worktree", flaky)
    script = reader_script(1)
    script["conversations"].append({"match": "Strategy: tile-tune", "turns": []})
    with MessagesStandin(script) as s:
        api_env(s.base_url)
        lines = []
        gen = generate(make_task(), AgentConfig(strategies=("fuse", "tile-tune"), rounds=0), log=lines.append)
    stops = {r.strategy: r.stop for r in gen.results}
    assert stops["fuse"] == "done (end_turn)" and stops["tile-tune"].startswith("failed: EngineError")
    assert gen.best is None  # neither agent changed anything: no candidate
    assert any(line.startswith("agent cost: ") for line in lines)


FILE = "src/diffusers/models/transformers/transformer_flux2.py"
SWIGLU = "x = self.gate_fn(x[..., :half]) * x[..., half:]"
# Same values (chunk gives the same two views as the slices), bit-exact, and engaged: the step's op
# histogram changes (split instead of two slices), which the validator's engagement check looks for.
HONEST = "gate, value = x.chunk(2, dim=-1)\n        x = self.gate_fn(gate) * value"
WRONG = "x = self.gate_fn(x[..., :half]) * x[..., :half]"  # gates the wrong half: a wrong kernel


def tu(name, **inp):
    return {"type": "tool_use", "name": name, "input": inp}


def text(t):
    return {"type": "text", "text": t}


SCRIPT = {"conversations": [
    {"name": "fuse", "match": "Strategy: fuse", "turns": [
        {"content": [text("Looking at the lessons and the SwiGLU."), tu("read_lessons", pattern="fuse-elementwise-chain"),
                     tu("search", pattern="class Flux2SwiGLU", path="src/diffusers/models/transformers")]},
        {"expect": "transformer_flux2.py", "content": [tu("read_file", path=FILE, start_line=285, end_line=299)]},
        {"expect": "gate_fn", "content": [tu("edit_file", path=FILE, old_text=SWIGLU, new_text=HONEST)]},
        {"expect": "edited", "content": [tu("run_correctness")]},
        {"expect": "accepted", "content": [text("SwiGLU: one expression for the gated product\n\nSame products, "
                                                 "bit-identical outputs.")], "stop_reason": "end_turn"},
    ]},
    {"name": "restructure", "match": "Strategy: restructure", "turns": [
        {"content": [tu("edit_file", path=FILE, old_text=SWIGLU, new_text=WRONG)]},
        {"expect": "edited", "content": [tu("run_correctness")]},
        {"expect": "rejected", "content": [text("SwiGLU gating restructured (validator disagrees)")], "stop_reason": "end_turn"},
    ]},
    {"name": "tile-tune", "match": "Strategy: tile-tune", "turns": [
        {"content": [tu("read_profile", top=5), tu("read_file", path="../../etc/passwd")]},
        {"expect": "'..' is not allowed", "content": [text("Nothing to tune here.")], "stop_reason": "end_turn"},
    ]},
    {"name": "refine", "match": "Strategy: refine", "turns": [
        {"expect": "", "content": [tu("read_file", path=FILE, start_line=295, end_line=298)]},
        {"expect": "self.gate_fn(gate) * value", "content": [text("Already minimal.")], "stop_reason": "end_turn"},
    ]},
]}


@pytest.mark.slow
def test_agents_validated_by_the_validator_and_refined(api_env, diffusers_engine, tmp_path):
    run_dir = tmp_path / "run"
    target = resolve_target("flux2", None, None, "tiny", "cpu")
    assert target.checkout.base_sha == diffusers_engine.base_sha
    vctx = ValidationContext.from_target(target, run_dir)
    profile = {"device": "cpu", "total_ms": 20.0, "kernels": [{"name": "aten::silu", "module": "transformer_blocks.0.ff.act_fn",
                                                                "ms": 1.0, "calls": 2, "category": "elementwise"}]}
    task = AgentTask(run_id="20261129-e2e", run_dir=run_dir, checkout=diffusers_engine, vctx=vctx,
                     opportunity={"id": "opp-swiglu", "kind": "fuse-elementwise-chain", "gain_ms": 0.5,
                                  "location": {"module": "transformer_blocks.*.ff.act_fn", "file": FILE, "line": 297}},
                     engine="diffusers", hardware="cpu", profile=profile, lessons_dir=tmp_path / "lessons",
                     store_dir=tmp_path / "kernel_store")
    lines = []
    with MessagesStandin(SCRIPT) as s:
        api_env(s.base_url)
        cfg = AgentConfig(strategies=("fuse", "tile-tune", "restructure"), samples=1, rounds=1, max_turns=10)
        gen = generate(task, cfg, log=lines.append)
    assert not s.expect_failures, s.expect_failures
    by = {r.strategy: r for r in gen.results}
    assert set(by) == {"fuse", "tile-tune", "restructure", "refine"}
    fuse, bad, idle, refine = by["fuse"], by["restructure"], by["tile-tune"], by["refine"]

    # THE validator judged: its Verdict, with the compare job's per-output checks, written to its run directory
    v = fuse.verdict
    assert isinstance(v, Verdict) and v.status == "accepted" and v.reason is None, fuse.error or v.render()
    c = v.correctness
    assert c is not None and c.ok and len(c.seeds) == 3 and len(c.shapes) >= 2
    assert c.checks and all(ch.ok and ch.rel_l2 is not None and ch.max_abs is not None for ch in c.checks)
    assert v.engagement is not None and v.engagement.ok  # chunk instead of two slices: the op histogram changed
    assert Path(v.run_dir).is_relative_to(run_dir / "validation")
    assert Verdict.from_json(json.loads((Path(v.run_dir) / "verdict.json").read_text())) == v
    # the final commit has the files of the snapshot the agent validated: one verdict for both
    repo = git.Repo(fuse.worktree)
    assert v.candidate_sha == fuse.validations[0]["commit"] != fuse.candidate.commit_sha
    assert repo.commit(v.candidate_sha).tree == repo.commit(fuse.candidate.commit_sha).tree

    w = bad.verdict
    assert isinstance(w, Verdict) and w.status == "rejected" and w.reason == "correctness", w.render()
    assert any(not ch.ok and ch.max_abs for ch in w.correctness.checks)
    assert idle.candidate is None and idle.verdict is None and idle.stop == "done (end_turn)"

    # the refinement started from the strongest candidate's commit, with its verdict as feedback; it
    # changed nothing more, so it shares that verdict and does not replace the best
    opening = next(m for m in (json.dumps(q["messages"][0]) for q in s.requests) if "Strategy: refine" in m)
    assert "Verdict of the candidate you start from" in opening and "verdict: ACCEPTED" in opening
    assert refine.candidate is not None and refine.verdict is v
    assert gen.best is fuse

    # the candidate is the one Candidate, its commit carries the trailers and the agent's title
    cand = fuse.candidate
    message = repo.commit(cand.commit_sha).message
    assert isinstance(cand, Candidate) and cand.description == message and cand.estimated_gain_ms == 0.5
    tr = parse_trailers(message)
    assert tr == cand.trailers
    assert tr["Optbot-Kind"] == "fuse-elementwise-chain" and tr["Optbot-Opportunity"] == "opp-swiglu"
    assert tr["Optbot-Generator"] == "agent/fuse" and tr["Optbot-Run"] == "20261129-e2e"
    assert message.startswith("SwiGLU: one expression")
    assert FILE in repo.git.diff(diffusers_engine.base_sha, cand.commit_sha, "--name-only").splitlines()
    # transcripts: every request and response, as JSON lines
    recs = Transcript.read(fuse.transcript)
    assert [r["type"] for r in recs].count("request") == 5 == [r["type"] for r in recs].count("response")
    assert recs[-1]["type"] == "end" and recs[-1]["verdict"]["status"] == "accepted"
    assert any(line.startswith("agent cost: ") and "$" in line for line in lines)
    assert gen.spend.cost_usd > 0 and gen.spend.turns == sum(r.spend.turns for r in gen.results)
