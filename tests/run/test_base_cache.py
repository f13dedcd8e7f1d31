"""A second run of an unchanged base reuses the first run's profile and analysis (issue 18,
bot/run/base_cache.py), and nothing else: the baseline is timed afresh, and any change to the key
(the analyzer's code, --revalidate) measures the base again.

Real steps on CPU, tiny FLUX.2, up to generate (the template generator reads the captured graph:
the reused graph must be a file of the second run). The cache is GPU-only in production
(`RunContext.reuses_base`); here that property is switched on, so the CPU run stands in for it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.run.context import RunContext, RunOptions
from bot.run.orchestrator import run_optimize


@pytest.fixture
def reuse_on(monkeypatch, tmp_path):
    monkeypatch.setattr(RunContext, "reuses_base", property(lambda self: not self.options.revalidate))
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path / "runs"))
    # a cache of this test's own (the session's OPTBOT_HOME holds the engines, and stays shared)
    import bot.run.base_cache as bc
    monkeypatch.setattr(bc, "cache_dir", lambda key: tmp_path / "cache" / key)


def _run(tmp_path, stop_after="generate", **kw):
    opts = RunOptions(workload="flux2", preset="tiny", device="cpu", dry_run=True, iters=2,
                      generators=("template",), knowledge_path=None, command="optbot optimize flux2", **kw)
    return run_optimize(opts, stop_after=stop_after)


def test_a_second_run_of_the_same_base_reuses_profile_and_analysis_only(reuse_on, tmp_path, monkeypatch):
    s1 = _run(tmp_path)
    p1, a1 = s1.result("profile"), s1.result("analyze")
    assert not p1.reused_from and not a1.reused_from
    assert (s1.run_dir / "jobs" / "profile" / "profile.job.json").is_file()

    s2 = _run(tmp_path)
    p2, a2, b2 = s2.result("profile"), s2.result("analyze"), s2.result("baseline")
    assert s1.run_id in p2.reused_from and s1.run_id in a2.reused_from, (p2.reused_from, a2.reused_from)
    assert "reused from run " + s1.run_id in p2.summary()
    assert not (s2.run_dir / "jobs" / "profile" / "profile.job.json").exists(), "no profile job ran"
    assert not (s2.run_dir / "jobs" / "graph" / "graph.job.json").exists(), "no graph job ran"
    assert b2.eager is not None and b2.log and Path(b2.log).is_file() and str(s2.run_dir) in b2.log  # timed afresh
    assert [o.id for o in a2.opportunities] == [o.id for o in a1.opportunities]
    full = json.loads((s2.run_dir / "analysis.full.json").read_text())
    assert full["meta"]["reused_from"]["run_id"] == s1.run_id
    assert full["meta"]["graph_file"].startswith(str(s2.run_dir)) and Path(full["meta"]["graph_file"]).is_file()
    assert full["profile"]["source"] == p2.profile_file and str(s1.run_dir) not in json.dumps(full)
    g1, g2 = (s.result("generate") for s in (s1, s2))
    assert [c.title for c in g2.candidates] == [c.title for c in g1.candidates] and g2.candidates

    # the analyzer's code changed: measured again (and that measurement is the one kept)
    import bot.run.base_cache as bc
    same = bc.code_digest
    monkeypatch.setattr(bc, "code_digest", lambda root=None: "another analyzer")
    s3 = _run(tmp_path, "analyze")
    assert not s3.result("profile").reused_from and not s3.result("analyze").reused_from
    # --revalidate measures everything again, though the cache holds this very base
    monkeypatch.setattr(bc, "code_digest", same)
    assert _run(tmp_path, "profile").result("profile").reused_from  # the control: reused without it
    s4 = _run(tmp_path, "profile", revalidate=True)
    assert not s4.result("profile").reused_from
    assert (s4.run_dir / "jobs" / "profile" / "profile.job.json").is_file()
