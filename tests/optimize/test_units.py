"""Small units of `optbot optimize`: budget parsing, rate-limit waits, the validator's verdict as
report rows, the report renderers, GitHub Enterprise base URLs, --dry-run with a token."""
from __future__ import annotations

import time

import click
import pytest
from github import GithubException

from bot.commands.optimize import parse_budget
from bot.deliver import report as rpt
from bot.deliver.github import rate_limit_wait
from bot.optimize.stages import Options, verdict_from_validator
from bot.run.state import to_jsonable
from bot.validate.verdict import Correctness, OutputCheck, Speed, Verdict


@pytest.mark.parametrize("values, wall, cost", [
    (("30m",), 1800, None), (("1h30m", "$5"), 5400, 5.0), (("90s,2.5usd",), 90, 2.5), ((), None, None)])
def test_parse_budget(values, wall, cost):
    assert parse_budget(values) == (wall, cost)


@pytest.mark.parametrize("bad", ["30x", "five dollars", "$"])
def test_parse_budget_rejects(bad):
    with pytest.raises(click.BadParameter, match="--budget|expected"):
        parse_budget((bad,))


def test_rate_limit_waits():
    now = 1000.0
    prim = GithubException(403, {"message": "API rate limit exceeded"}, {"x-ratelimit-remaining": "0",
                                                                        "x-ratelimit-reset": "1010"})
    assert rate_limit_wait(prim, 0, now=now) == pytest.approx(11.0)
    sec = GithubException(429, {"message": "secondary"}, {"Retry-After": "7"})
    assert rate_limit_wait(sec, 3, now=now) == 7.0
    plain = GithubException(403, {"message": "Resource not accessible by integration"}, {"X-RateLimit-Remaining": "4000"})
    assert rate_limit_wait(plain, 0, now=now) is None
    assert rate_limit_wait(GithubException(422, {"message": "Validation Failed"}, {}), 0) is None
    assert rate_limit_wait(GithubException(403, {"message": "API rate limit exceeded"}, {}), 2) == 4.0


# what the validator hands optimize: a real Verdict, as JSON
VERDICT = Verdict(
    status="accepted", reason=None, summary="1.21x faster (cuda), correct", workload="flux2", preset="full",
    device="cuda", dtype="bfloat16", base_sha="a" * 40, candidate_sha="b" * 40, candidate="b" * 40,
    env={"device_kind": "cuda", "device_name": "NVIDIA H200"},
    speed=[Speed("eager", "cuda", base_ms=[10.0, 10.2], candidate_ms=[8.1, 8.3], speedup=1.22, noise_pct=0.4,
                 outcome="faster", n=20),
           Speed("graph", "cuda", base_ms=[9.0, 9.1], candidate_ms=[7.5, 7.6], speedup=1.2, noise_pct=0.3,
                 outcome="faster", n=20)],
    correctness=Correctness(
        ok=True, seeds=[5, 9, 11], shapes=["1024x1024/txt512/b1", "768x1360/txt300/b1"], rule="rel_l2 <= 0.01",
        checks=[OutputCheck("1024x1024/txt512/b1 seed 5", "noise_pred", True, "", max_abs=0.0039, rel_l2=0.0021)],
        kernels=[{"name": "qk_norm_rope", "ok": True, "cases": [], "micro": {  # a kernel_check job's result
            "reference": {"median_ms": 0.5, "n": 50, "device": "cuda"},
            "reference_aa": {"median_ms": 0.501, "n": 50, "device": "cuda"},
            "kernel": {"median_ms": 0.2, "n": 50, "device": "cuda"}, "shape": [1, 4608, 48, 128]}}]),
).to_json()


def test_verdict_from_validator_keeps_devices_and_numbers():
    v = verdict_from_validator("c1", VERDICT)
    assert v.status == "accepted" and "1.21x" in v.reason
    assert v.base_eager.median_ms == pytest.approx(10.1) and v.cand_eager.n == 40
    assert v.base_eager.device == "cuda" and v.base_eager.device_name == "NVIDIA H200"
    assert v.cand_graph.median_ms == pytest.approx(7.55)
    assert v.correctness[0]["seed"] == "5" and v.correctness[0]["max_rel"] == 0.0021
    assert v.micro[0]["speedup"] == pytest.approx(2.5) and v.micro[0]["device"] == "cuda"
    # and the PR body shows them with their device
    res = {"checkout": {"workload": "flux2", "engine": "diffusers", "base_sha": "a" * 40, "preset": "full"},
           "generate": {"candidates": [{"id": "c1", "title": "t", "kind": "attention-waste", "generator": "replay"}]},
           "validate": {"verdicts": [to_jsonable(v)]},
           "combine": {"branch": "optbot/flux2/aaaa", "commits": [{"candidate_id": "c1", "sha": "b" * 40, "subject": "t"}],
                       "stack_verdict": to_jsonable(verdict_from_validator("stack", VERDICT)),
                       "ablation": [{"candidate_id": "c1", "title": "t", "without_ms": 10.1, "contribution_ms": 1.9,
                                     "contribution_pct": 18.8, "device": "cuda"}], "ablation_note": "leave-one-out"}}
    md = rpt.to_markdown(rpt.build_blocks(res, "run-1", {}))
    assert "| optimized | eager | 8.200 |" in md and "cuda (NVIDIA H200)" in md
    assert "| optimized | CUDA graph | 7.550 |" in md
    assert "| c1: t | 10.100 | 1.900 | 18.8 | cuda |" in md
    assert "0.0039" in md and "2.50x" in md
    html = rpt.to_html(rpt.build_blocks(res, "run-1", {}))
    assert html.count("<details>") >= 2 and "<td>cuda (NVIDIA H200)</td>" in html


def test_html_escapes_text():
    html = rpt.to_html([rpt.P("<script>alert(1)</script> `x<y`")])
    assert "<script>" not in html and "<code>x&lt;y</code>" in html


def test_github_enterprise_base_url(forge_env, monkeypatch):
    """The forge talks to an API served under /api/v3, as GitHub Enterprise does."""
    from bot.deliver.github import GitHubForge
    from tests.optimize.github_standin import GitHubStandIn

    ghe = GitHubStandIn(prefix="/api/v3").start()
    try:
        ghe.add_repo("team/engine", forge_env["engine_bare"])
        o = Options(workload="flux2", repo="team/engine", github_api_url=ghe.base)
        f = GitHubForge("t", o, "run-x", log=lambda m: None)
        assert f.repo("team/engine").full_name == "team/engine"
        assert all(p.startswith("/api/v3/") for _, p in ghe.requests)
    finally:
        ghe.stop()


def test_dry_run_with_token_stays_local(forge_env):
    from bot.deliver.deliver import make_forge
    from bot.optimize.stages import Budget, RunContext

    ctx = RunContext("r", forge_env["tmp"], Options(workload="flux2", repo="team/engine", dry_run=True), Budget(), {})
    assert make_forge(ctx).name == "local"
    ctx.options.dry_run = False
    assert make_forge(ctx).name == "github"


def test_tuned_variant_supersedes_its_plain_replay():
    from bot.optimize.stages import CandidateRecord, _prefer_tuned

    def rec(cid, gen, entry):
        return CandidateRecord(cid, cid, "0" * 40, "", generator=gen, trailers={"Optbot-Entry": entry})

    keep, dropped = _prefer_tuned([rec("replay-a", "replay", "a"), rec("replay-b", "replay", "b"),
                                   rec("variant-a", "variant-search", "a"), rec("agent-1", "agent/fuse", "none")])
    assert [c.id for c in keep] == ["replay-b", "variant-a", "agent-1"]
    assert dropped == ["replay-a: superseded by variant-a (the same entry with its tuned config)"]


def _generate_ctx(tmp_path, device, checkout=None):
    from types import SimpleNamespace

    from bot.optimize.stages import Budget, RunContext

    ctx = RunContext("r", tmp_path, Options(workload="flux2", gpus=2), Budget(), {}, log=lambda m: None)
    ctx.target = SimpleNamespace(device=device, dtype="float32", preset="full", workload=SimpleNamespace(name="flux2"),
                                 checkout=checkout or SimpleNamespace(base_sha="0" * 40))
    return ctx


def test_variant_search_in_generate_needs_a_gpu(tmp_path):
    from types import SimpleNamespace

    from bot.optimize.stages import Stages

    replayed = [SimpleNamespace(entry_id="flux2-swiglu", opportunity_id="o1"),
                SimpleNamespace(entry_id="flux2-merge-qkv", opportunity_id="o2")]  # no config_space
    recs = []
    notes = Stages()._variants(_generate_ctx(tmp_path, "cpu"), replayed, recs, [], [])
    assert recs == [] and notes == ["variant search: needs a GPU to choose a config (config spaces of flux2-swiglu "
                                    "not searched)"]
    assert Stages()._variants(_generate_ctx(tmp_path, "cpu"), replayed[1:], recs, [], []) == \
        ["variant search: no replayed entry declares a config_space"]


def test_variant_search_in_generate_adds_its_commit(tmp_path, monkeypatch, diffusers_engine):
    """The CUDA branch of generate, wired to the real search and commit; only the device and the
    choice are replaced (TEST SEAM: this machine has no GPU, so the search runs on CPU with a
    narrowed space and the test names the winner)."""
    from types import SimpleNamespace

    import bot.generate.variants as variants
    from bot.optimize.stages import Stages

    real = variants.search_entry
    seen = {}

    def on_cpu_with_fake_choice(path, **kw):
        seen.update(kw)
        return real(path, **{**kw, "device": "cpu", "workers": 1, "space": {"block_n": [512], "num_warps": [2]},
                             "choose": lambda res: {"label": "block_n=512,num_warps=2", "by": "the test",
                                                    "config": {"block_n": 512, "num_warps": 2}, "total_ms": 0.0}})

    monkeypatch.setattr(variants, "search_entry", on_cpu_with_fake_choice)
    recs, searches = [], []
    notes = Stages()._variants(_generate_ctx(tmp_path, "cuda", diffusers_engine),
                               [SimpleNamespace(entry_id="flux2-swiglu", opportunity_id="o1")], recs, [], searches)
    assert seen["gpus"] == 2 and seen["device"] == "cuda" and seen["opportunity_id"] == "o1"
    assert [r.id for r in recs] == ["variant-flux2-swiglu"] and recs[0].generator == "variant-search"
    assert recs[0].trailers["Optbot-Config"] == "block_n=512,num_warps=2" and recs[0].opportunity == "o1"
    assert "committed" in notes[0], notes
    assert searches == []  # a search that gave a candidate is recorded by learn from its verdict
    assert (tmp_path / "variants" / "flux2-swiglu" / "variants.json").is_file()


def test_a_candidate_verdict_is_checkpointed_for_resume(tmp_path):
    """validate keeps each verdict as soon as it is reached; a resumed run takes it back for the same
    commit only."""
    from dataclasses import asdict

    from bot.run.resume import load_checkpoint, save_checkpoint
    from bot.optimize.stages import VerdictRecord, verdict_from_dict

    assert load_checkpoint(tmp_path, "replay-x", "a" * 40) is None
    save_checkpoint(tmp_path, "replay-x", "a" * 40, asdict(VerdictRecord("replay-x", "rejected", "no-change: 1.004x", "cuda")))
    back = verdict_from_dict("replay-x", load_checkpoint(tmp_path, "replay-x", "a" * 40))
    assert back.status == "rejected" and back.reason == "no-change: 1.004x" and back.device == "cuda"
    assert load_checkpoint(tmp_path, "replay-x", "b" * 40) is None  # another commit under the same id


def test_pause_after_exits_75_with_a_resumable_run(tmp_path):
    """`--pause-after` stops the attempt at a safe point: exit status 75 (not done, not failed), the
    JSON says paused, and the printed line names the --resume command; a bad duration names the option."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "OPTBOT_RUNS_DIR": str(tmp_path / "runs")}
    p = subprocess.run([sys.executable, "-m", "bot", "optimize", "flux2", "--pause-after", "0s", "--json",
                        str(tmp_path / "run.json")], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 75, p.stderr
    d = json.loads((tmp_path / "run.json").read_text())
    assert d["paused"] is True and d["finished"] is False
    assert f"--resume {d['run_id']}" in " ".join(p.stderr.split())
    bad = subprocess.run([sys.executable, "-m", "bot", "optimize", "flux2", "--pause-after", "5x"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "--pause-after" in bad.stderr and "'5x'" in bad.stderr
