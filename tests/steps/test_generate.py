"""The generate step (bot/steps/generate.py): variant search inside a run."""
from __future__ import annotations

from types import SimpleNamespace

from bot.generate.replay import ReplayResult

from bot.run.context import Budget, RunOptions, RunContext
from bot.run.state import Results
from bot.steps import generate


def _generate_ctx(tmp_path, device, checkout=None):
    """A run context whose target is a stand-in: only the device matters to these branches."""
    ctx = RunContext("r", tmp_path, RunOptions(workload="flux2", gpus=2), Budget(), Results(), log=lambda m: None)
    wl = SimpleNamespace(name="flux2", production_modes=("eager", "graph", "compile", "compile+graph"))
    ctx._target = SimpleNamespace(device=device, dtype="float32", preset="full", workload=wl,
                                  checkout=checkout or SimpleNamespace(base_sha="0" * 40))
    return ctx


def test_variant_search_in_generate_needs_a_gpu(tmp_path):
    replayed = [ReplayResult("flux2-swiglu", "o1", "applied"),
                ReplayResult("flux2-merge-qkv", "o2", "applied")]  # no config_space
    res = generate.Result("done", "")
    notes = generate._variants(_generate_ctx(tmp_path, "cpu"), replayed, [], res)
    assert res.candidates == [] and notes == ["variant search: needs a GPU to choose a config (config spaces of flux2-swiglu "
                                    "not searched)"]
    assert generate._variants(_generate_ctx(tmp_path, "cpu"), replayed[1:], [], res) == \
        ["variant search: no replayed entry declares a config_space"]


def test_variant_search_in_generate_adds_its_commit(tmp_path, monkeypatch, diffusers_engine):
    """The CUDA branch of generate, wired to the real search and commit; only the device and the
    choice are replaced (TEST SEAM: this machine has no GPU, so the search runs on CPU with a
    narrowed space and the test names the winner)."""
    import bot.generate.variants as variants

    real = variants.search_entry
    seen = {}

    def on_cpu_with_fake_choice(path, **kw):
        seen.update(kw)
        return real(path, **{**kw, "device": "cpu", "workers": 1, "space": {"block_n": [512], "num_warps": [2]},
                             "choose": lambda res: {"label": "block_n=512,num_warps=2", "by": "the test",
                                                    "config": {"block_n": 512, "num_warps": 2}, "total_ms": 0.0}})

    monkeypatch.setattr(variants, "search_entry", on_cpu_with_fake_choice)
    res = generate.Result("done", "")
    replayed = ReplayResult("flux2-swiglu", "o1", "applied", under_compile="reference",
                            under_compile_why="the output of o1 is quantized for an FP8 GEMM (q1)")
    notes = generate._variants(_generate_ctx(tmp_path, "cuda", diffusers_engine), [replayed], [], res)
    recs = res.candidates
    assert seen["gpus"] == 2 and seen["device"] == "cuda" and seen["opportunity_id"] == "o1"
    assert seen["aside"] == ("reference", replayed.under_compile_why)  # the tuned commit keeps the replay's choice
    assert [r.id for r in recs] == ["variant-flux2-swiglu"] and recs[0].generator == "variant-search"
    assert recs[0].trailers["Optbot-Config"] == "block_n=512,num_warps=2" and recs[0].opportunity_id == "o1"
    assert "committed" in notes[0], notes
    assert res.searches == []  # a search that gave a candidate is recorded by learn from its verdict
    assert (tmp_path / "variants" / "flux2-swiglu" / "variants.json").is_file()


def test_the_agent_gets_the_runs_wall_time_and_its_failed_attempts_are_kept(tmp_path, monkeypatch):
    """The generate step hands the agents what is left of the run's wall time, and keeps every
    agent's failed attempt besides the best (learn writes their caveats); the best is the candidate."""
    import bot.generate.agent.parallel as parallel
    from tests.fakes import opportunity
    from bot.generate.agent.budget import Spend
    from bot.generate.agent.loop import AgentResult
    from bot.generate.candidate import Candidate
    from tests.knowledge.verdicts import gpu_verdict

    def agent(name, status):
        c = Candidate(f"agent-{name}", "o1", "fuse-elementwise-chain", f"agent/{name}", "", name[0] * 40)
        return AgentResult(name, name, "done (end_turn)", Spend(), "", "", candidate=c,
                           verdict=gpu_verdict(status=status, candidate_sha=c.commit_sha))

    best, bad, held = agent("fuse", "accepted"), agent("restructure", "rejected"), agent("tile", "held")
    seen = {}

    def fake_generate(task, cfg, log=print, prefix=""):
        seen["wall"], seen["prefix"] = cfg.max_wall_s, prefix
        return parallel.AgentGeneration(results=[best, bad, held, agent("refine", "accepted")], best=best)

    monkeypatch.setattr(parallel, "generate", fake_generate)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    commit = SimpleNamespace(message="t\n\nOptbot-Kind: fuse-elementwise-chain", summary="t")
    checkout = SimpleNamespace(base_sha="0" * 40, repo=SimpleNamespace(commit=lambda sha: commit))
    ctx = _generate_ctx(tmp_path, "cpu", checkout)
    ctx.budget = Budget(wall_s=900.0)
    ctx.results = Results(profile=SimpleNamespace(load=lambda: None))
    ctx._target.engine_name = "diffusers"
    res = generate.Result("done", "")
    opp = opportunity("fuse-elementwise-chain", id="o1")
    notes = generate._agent(ctx, [opp], res)
    assert 800 < seen["wall"] <= 900 and seen["prefix"] == "o1-" and len(notes) == 1 and "best fuse" in notes[0], notes
    assert [c.id for c in res.candidates] == ["agent-fuse"]
    assert [(a.candidate.id, a.verdict.status) for a in res.attempts] == [("agent-restructure", "rejected"),
                                                                          ("agent-tile", "held")]


def test_a_candidate_keeps_the_estimate_its_generator_summed(tmp_path):
    """A template kernel at four places carries the sum of their estimates (18.4 ms on Qwen-Image
    on the H200); the run kept only the first place's (7.75 ms), so the report and any
    estimate-vs-realized comparison undercounted it. A candidate without one gets its opportunity's."""
    import git
    from bot.generate.candidate import Candidate

    repo = git.Repo.init(tmp_path / "e")
    (tmp_path / "e" / "f.py").write_text("x = 1\n")
    repo.index.add(["f.py"])
    sha = repo.index.commit("optbot: a change\n\nOptbot-Opportunity: o1\nOptbot-Kind: fuse-norm-consumer\n").hexsha
    ctx = _generate_ctx(tmp_path, "cpu", SimpleNamespace(base_sha="0" * 40, repo=repo))
    opps = [SimpleNamespace(id="o1", gain_ms=7.75)]
    summed = generate._complete(ctx, Candidate("t", "o1", "fuse-norm-consumer", "template", "", sha,
                                               estimated_gain_ms=18.39), 0, opps)
    plain = generate._complete(ctx, Candidate("r", "", "", "replay", "", sha), 1, opps)
    assert summed.estimated_gain_ms == 18.39
    assert plain.estimated_gain_ms == 7.75 and plain.opportunity_id == "o1"


def test_replay_offers_a_superseded_entry_only_without_its_superseder(tmp_path, monkeypatch, diffusers_engine):
    """flux2-qkv-norm-rope-epilogue includes flux2-qk-rmsnorm-rope's and flux2-merge-qkv's changes and
    conflicts with both (its entry.yaml `supersedes`): with it offered, they are not (combine would keep
    whichever came first); when it is known rejected on this machine, they are offered again.
    TEST SEAM: the recorded GPU verdict lookup (this machine has none to record)."""
    from bot.knowledge import recall
    from bot.knowledge.known import KnownVerdict
    from bot.knowledge.location import Knowledge, SHIPPED_STORE
    from tests.fakes import opportunity

    opps = [opportunity("attention-waste", id="o1"), opportunity("merge-siblings", id="o2"),
            opportunity("fuse-elementwise-chain", id="o3")]
    ctx = _generate_ctx(tmp_path, "cuda", diffusers_engine)
    ctx._target.engine_name, ctx._target.workload.default_engine = "diffusers", "diffusers"
    monkeypatch.setattr(ctx, "hardware", lambda: "h200")
    monkeypatch.setattr(ctx, "knowledge", lambda: Knowledge(SHIPPED_STORE.parent, SHIPPED_STORE, tmp_path / "lessons", "test"))
    monkeypatch.setattr(ctx, "run_key", lambda: None)
    rejected = set()

    def recorded(key, entry_id):
        if entry_id not in rejected:
            return None, "no GPU verdict recorded"
        return KnownVerdict(entry_id, "flux2", "rejected", "no-change", "", 1.0, "2026-12-05", "the test", {}), ""

    monkeypatch.setattr(recall, "entry_verdict", recorded)
    res = generate.Result("done", "")
    offered = {r.entry_id for r in generate._replay(ctx, opps, res)}
    assert offered == {"flux2-qkv-norm-rope-epilogue", "flux2-swiglu"}, res.notes
    for old in ("flux2-qk-rmsnorm-rope", "flux2-merge-qkv"):
        assert f"store replay {old}: skipped, superseded by flux2-qkv-norm-rope-epilogue (its entry.yaml " \
               "`supersedes`), which is offered" in res.notes
    rejected.add("flux2-qkv-norm-rope-epilogue")
    res = generate.Result("done", "")
    offered = {r.entry_id for r in generate._replay(ctx, opps, res)}
    assert offered == {"flux2-qk-rmsnorm-rope", "flux2-merge-qkv", "flux2-swiglu"}, res.notes
    assert {c.entry_id for c in res.candidates} == offered
