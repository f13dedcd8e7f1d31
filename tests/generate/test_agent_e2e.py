"""End to end: the scripted stand-in drives real agents (real anthropic client, real tool calls, real
runner processes on the tiny FLUX.2 engine) to one candidate the validator accepts and one it
rejects; learning turns them into a store entry + pattern lesson and a caveat lesson; the next
agent's cached prompt carries those lessons."""
from __future__ import annotations

import subprocess

import git
import pytest
import yaml

from bot.knowledge import learn
from bot.generate.agent.candidates import read_trailers
from bot.generate.agent.config import AgentConfig
from bot.generate.agent.loop import AgentTask
from bot.generate.agent.parallel import generate, learn_all
from bot.generate.agent.transcript import Transcript
from bot.generate.agent.validation import FALLBACK, VALIDATOR, ValidationContext
from bot.target import resolve_target
from bot.workload import load_workload
from messages_standin import MessagesStandin

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
def test_agent_generation_validation_and_learning(api_env, diffusers_engine, base_worktree, tmp_path):
    run_dir = tmp_path / "run"
    # With bot/validate/validator.py present (after the merge) the real validator judges; without it, the fallback.
    target = resolve_target("flux2", None, None, "tiny", "cpu")
    assert target.checkout.base_sha == diffusers_engine.base_sha
    vctx = ValidationContext.from_target(target, base_worktree, run_dir)
    store, lessons = tmp_path / "kernel_store", tmp_path / "lessons"
    profile = {"device": "cpu", "total_ms": 20.0, "kernels": [{"name": "aten::silu", "module": "transformer_blocks.0.ff.act_fn",
                                                                "ms": 1.0, "calls": 2, "category": "elementwise"}]}
    task = AgentTask(run_id="20261129-e2e", run_dir=run_dir, checkout=diffusers_engine, vctx=vctx,
                     opportunity={"id": "opp-swiglu", "kind": "fuse-elementwise-chain",
                                  "location": {"module": "transformer_blocks.*.ff.act_fn", "file": FILE, "line": 297}},
                     engine="diffusers", hardware="cpu", profile=profile, lessons_dir=lessons, store_dir=store)
    lines = []
    with MessagesStandin(SCRIPT) as s:
        api_env(s.base_url)
        cfg = AgentConfig(strategies=("fuse", "tile-tune", "restructure"), rounds=1, max_turns=10)
        gen = generate(task, cfg, log=lines.append)
    assert not s.expect_failures, s.expect_failures
    by = {r.strategy: r for r in gen.results}
    assert set(by) == {"fuse", "tile-tune", "restructure", "refine"}

    fuse, bad, idle = by["fuse"], by["restructure"], by["tile-tune"]
    assert fuse.check.status == "accepted", fuse.check
    if fuse.check.by == FALLBACK:
        assert "bit-identical" in fuse.check.reason and fuse.check.numbers["outputs_compared"] == 6
    else:
        assert fuse.check.by == VALIDATOR and len(fuse.check.numbers["shapes"]) >= 2
    assert bad.check.status == "rejected" and bad.check.reason.startswith("correctness:"), bad.check
    assert idle.candidate is None and idle.stop == "done (end_turn)"
    assert gen.best is not None and gen.best.check.status == "accepted"
    # the refinement started from the strongest candidate's commit
    assert by["refine"].candidate is not None
    # candidate commits carry their trailers and the patch in the engine's real code path
    tr = read_trailers(diffusers_engine.repo_path, fuse.candidate.commit_sha)
    assert tr["Optbot-Kind"] == "fuse-elementwise-chain" and tr["Optbot-Opportunity"] == "opp-swiglu"
    assert tr["Optbot-Generator"] == "agent/fuse" and tr["Optbot-Run"] == "20261129-e2e"
    assert git.Repo(fuse.worktree).commit(fuse.candidate.commit_sha).message.startswith("SwiGLU: one expression")
    # transcripts: every request and response, as JSON lines
    recs = Transcript.read(fuse.transcript)
    assert [r["type"] for r in recs].count("request") == 5 == [r["type"] for r in recs].count("response")
    assert any(line.startswith("agent cost: ") and "$" in line for line in lines)
    assert gen.spend.cost_usd > 0 and gen.spend.turns == sum(r.spend.turns for r in gen.results)

    # learning: accepted -> store entry + pattern lesson; rejected -> caveat lesson with its root cause
    learned_all = learn_all(task, gen, engine_source="pypi-sdist:diffusers==0.42.1")
    # fuse and restructure; the refinement changed nothing more, so its files are learned once
    assert len(learned_all) == 2 and len(list(store.iterdir())) == 1 and len(list(lessons.iterdir())) == 2
    learned = {"fuse": learned_all[0], "restructure": learned_all[1]}
    entry_dir = learned["fuse"].entry_dir
    assert entry_dir is not None and learned["restructure"].entry_dir is None
    entry = yaml.safe_load((entry_dir / "entry.yaml").read_text())
    assert entry["provenance"] == {"kind": "generated", "agent": "agent/fuse", "run_id": "20261129-e2e",
                                   "date": entry["provenance"]["date"]}
    assert entry["pattern"] == "fuse-elementwise-chain" and entry["status"] == "validated-cpu"
    assert entry["engine"]["patches"] == [{"file": FILE, "function": "Flux2SwiGLU"}]
    # the stored patch applies to a clean base checkout
    chk = subprocess.run(["git", "apply", "--check", str(entry_dir / "patch.diff")], cwd=base_worktree,
                         capture_output=True, text=True)
    assert chk.returncode == 0, chk.stderr
    caveat = learned["restructure"].lesson_path.read_text()
    assert "kind: caveat" in caveat and "Root cause: the candidate computes something different" in caveat
    assert ("differs from the base" in caveat) if bad.check.by == FALLBACK else ("max abs" in caveat)
    pattern_lesson = learned["fuse"].lesson_path.read_text()
    assert "kind: pattern" in pattern_lesson and entry_dir.name in pattern_lesson
    try:  # when the store helper's loaders are present, they must accept what learning wrote
        from bot.knowledge import lessons as kl, store as ks
    except ImportError:
        pass
    else:
        ks.load_entry(entry_dir)
        kl.load_lesson(learned["restructure"].lesson_path)

    # the next run: retrieval by pattern, engine and hardware puts both lessons (caveat first) and the
    # entry into the agent's cached system prompt
    ctx = learn.prompt_context("fuse-elementwise-chain", "diffusers", "cpu", lessons_dir=lessons, store_dir=store)
    assert ctx.index(learned["restructure"].lesson_path.stem) < ctx.index(learned["fuse"].lesson_path.stem)
    assert entry_dir.name in ctx
    assert learn.find_lessons("merge-siblings", "diffusers", "cpu", lessons_dir=lessons) == []
    assert learn.find_lessons("fuse-elementwise-chain", "diffusers", "h200", lessons_dir=lessons) == []
    with MessagesStandin(SCRIPT) as s2:
        api_env(s2.base_url)
        task.run_id = "20261129-e2e-2"
        generate(task, AgentConfig(strategies=("tile-tune",), rounds=0), log=lines.append)
    system_text = s2.requests[0]["system"][-1]["text"]
    assert learned["restructure"].lesson_path.stem in system_text and "Root cause" in system_text
