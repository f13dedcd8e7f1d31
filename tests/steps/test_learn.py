"""The learn step (bot/steps/learn.py), run for real: what the learners write is what the knowledge
commit holds, and what the next run recalls (bot/knowledge/recall.py)."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import git

from bot.generate.candidate import Candidate
from bot.knowledge import recall
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry
from bot.run.context import Budget, RunOptions, RunContext
from bot.run.state import Results
from bot.steps import baseline, generate, learn, validate
from tests.knowledge.verdicts import ENV, gpu_verdict


def _baseline() -> baseline.Result:
    return baseline.Result("done", None, None, "", env=dict(ENV))  # what recorded results are matched on


def _ctx(tmp_path, root, target, results: Results) -> RunContext:
    ctx = RunContext("run-1", tmp_path / "run1", RunOptions("flux2", knowledge_path=str(root)), Budget(), results,
                     log=lambda m: None)
    ctx._target = target
    return ctx


def test_the_learn_step_commits_what_an_adopted_variant_wrote(tmp_path):
    """Regression (H200 loop, 2026-11-30): learn adopted a tuned variant into its entry (patch.diff,
    kernel source) but the learn step listed only bench.json for the knowledge commit, so the next
    run found a variant_search record whose patch_sha256 matched no patch.diff, searched again and
    validated again. Through the real learn step: every file the learner wrote is in its result,
    and the staged entry is known (searched, and its verdict applies) to the next run."""
    root = tmp_path / "knowledge"
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", root / "kernel_store" / "flux2-swiglu")
    (root / "kernel_store" / "flux2-swiglu" / "bench.json").unlink(missing_ok=True)
    kernel = next(p for p in (root / "kernel_store" / "flux2-swiglu").glob("*.py") if not p.name.startswith("test_"))

    eng = git.Repo.init(tmp_path / "engine")
    with eng.config_writer() as cw:
        cw.set_value("user", "name", "t")
        cw.set_value("user", "email", "t@localhost")
    (tmp_path / "engine" / "model.py").write_text("def f(x):\n    return x\n")
    eng.git.add("-A")
    eng.git.commit("-m", "base")
    base = eng.head.commit.hexsha
    kdir = tmp_path / "engine" / "optbot_kernels"
    kdir.mkdir()
    tuned_src = kernel.read_text() + "\n# tuned: block_n=2048 (test)\n"
    (kdir / kernel.name).write_text(tuned_src)
    (tmp_path / "engine" / "model.py").write_text("def f(x):\n    return swiglu(x)\n")
    eng.git.add("-A")
    eng.git.commit("-m", "variant\n\nOptbot-Entry: flux2-swiglu\nOptbot-Config: block_n=2048")
    cand = Candidate("variant-flux2-swiglu", "o", "fuse-elementwise-chain", "variant-search", "", eng.head.commit.hexsha,
                     base, "flux2-swiglu", title="Fused SwiGLU (tuned)",
                     trailers={"Optbot-Entry": "flux2-swiglu", "Optbot-Config": "block_n=2048"})
    verdict = gpu_verdict(base_ms=(550.0,), candidate_ms=(524.0,), speedup=1.05, base_sha=base,
                          candidate_sha=cand.commit_sha)
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2", default_engine="diffusers"), engine_name="diffusers",
                             checkout=SimpleNamespace(repo=eng, base_sha=base, repo_path=tmp_path / "engine"),
                             preset="full", dtype="bfloat16", device="cuda")
    res = learn.run(_ctx(tmp_path, root, target, Results(
        baseline=_baseline(), generate=generate.Result("done", "1 candidate", [cand]),
        validate=validate.Result("done", "1 of 1 accepted", {cand.id: verdict}))))
    staged = Path(res.knowledge_root) / "kernel_store" / "flux2-swiglu"
    assert {"kernel_store/flux2-swiglu/patch.diff", f"kernel_store/flux2-swiglu/{kernel.name}",
            "kernel_store/flux2-swiglu/bench.json"} <= set(res.files), res.files
    assert (staged / kernel.name).read_text() == tuned_src and "swiglu(x)" in (staged / "patch.diff").read_text()
    # the next run reads what was committed: the search is known, and so is the verdict
    key = recall.RunKey(staged.parent, "flux2", "h200", base, "full", "bfloat16", True, False, ENV)
    e = get_entry("flux2-swiglu", staged.parent)
    assert "adopted" in recall.searched(key, e)
    k, why = recall.entry_verdict(key, "flux2-swiglu")
    assert k is not None and k.status == "accepted", why


def test_a_search_that_kept_the_entrys_config_is_not_run_again(tmp_path):
    """Variant search that found nothing worth a candidate (the entry's own config is, or is near,
    the fastest) is finished: the learn step records it against the entry's patch, and the next
    run's recall says the space was searched. Nothing was validated in this run."""
    root = tmp_path / "knowledge"
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", root / "kernel_store" / "flux2-swiglu")
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2", default_engine="diffusers"), engine_name="diffusers",
                             checkout=SimpleNamespace(repo=None, base_sha="b" * 40, repo_path=tmp_path),
                             preset="full", dtype="bfloat16", device="cuda")
    search = generate.Search("flux2-swiglu", "block_n=1024,num_warps=4", "kept",
                             "the entry's own config is within 3% of the fastest")
    res = learn.run(_ctx(tmp_path, root, target, Results(
        baseline=_baseline(), generate=generate.Result("done", "0 candidates", searches=[search]),
        validate=validate.Result("skipped", "no candidates to validate"))))
    assert res.status == "done" and res.files == ["kernel_store/flux2-swiglu/bench.json"], (res.reason, res.files)
    staged = Path(res.knowledge_root) / "kernel_store"
    key = recall.RunKey(staged, "flux2", "h200", "b" * 40, "full", "bfloat16", True, False, ENV)
    said = recall.searched(key, get_entry("flux2-swiglu", staged))
    assert "searched in run run-1 on h200: block_n=1024,num_warps=4 kept" in said, said
    assert recall.searched(recall.RunKey(**{**key.__dict__, "env": {**ENV, "triton": "3.7.0"}}),
                           get_entry("flux2-swiglu", staged)) == ""  # another triton: searched again


def test_every_failed_agent_attempt_is_a_caveat_lesson(tmp_path):
    """An agent's rejected attempt that was not handed on (another agent's candidate was stronger) is
    learned too: the learn step writes its caveat lesson through the one learner, and the generate
    step's result carrying it reads back from JSON (a resumed run learns it the same)."""
    from bot.jsonable import from_json, to_json

    root = tmp_path / "knowledge"
    (root / "kernel_store").mkdir(parents=True)
    eng = git.Repo.init(tmp_path / "engine")
    with eng.config_writer() as cw:
        cw.set_value("user", "name", "t")
        cw.set_value("user", "email", "t@localhost")
    (tmp_path / "engine" / "model.py").write_text("def f(x):\n    return x * 2\n")
    eng.git.add("-A")
    eng.git.commit("-m", "base")
    base = eng.head.commit.hexsha
    (tmp_path / "engine" / "model.py").write_text("def f(x):\n    return x + x + 1\n")
    eng.git.add("-A")
    eng.git.commit("-m", "f: add\n\nOptbot-Kind: fuse-elementwise-chain\nOptbot-Generator: agent/restructure")
    cand = Candidate("agent-r1-restructure-1", "opp-1", "fuse-elementwise-chain", "agent/restructure", "",
                     eng.head.commit.hexsha, base, title="f: add instead of multiply",
                     trailers={"Optbot-Kind": "fuse-elementwise-chain", "Optbot-Generator": "agent/restructure"})
    verdict = gpu_verdict(status="rejected", speedup=0.97, base_sha=base, candidate_sha=cand.commit_sha)
    gen = generate.Result("done", "0 candidates", attempts=[generate.Attempt(cand, verdict)])
    gen = from_json(generate.Result, to_json(gen))
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2", default_engine="diffusers"), engine_name="diffusers",
                             checkout=SimpleNamespace(repo=eng, base_sha=base, repo_path=tmp_path / "engine"),
                             preset="full", dtype="bfloat16", device="cuda")
    res = learn.run(_ctx(tmp_path, root, target, Results(
        baseline=_baseline(), generate=gen, validate=validate.Result("skipped", "no candidates to validate"))))
    assert res.status == "done" and res.entries == [] and len(res.lessons) == 1, res.reason
    text = (Path(res.knowledge_root) / res.lessons[0]).read_text()
    assert "kind: caveat" in text and "agent/restructure" in text and cand.commit_sha[:12] in text


def test_a_member_that_broke_the_stack_is_a_caveat_lesson_and_the_checks_are_recorded(tmp_path):
    """The learn step, for real, after a combine whose stack broke whole: the member whose addition
    failed its check gets a caveat lesson naming what it broke with, and every check this run made
    is recorded in the members' bench.json (gpu.stack_checks) for the next run; a check taken from an
    earlier run is neither."""
    from bot.steps import combine

    root = tmp_path / "knowledge"
    members = ("flux2-qk-rmsnorm-rope", "flux2-swiglu", "flux2-merge-qkv")
    for eid in members:
        shutil.copytree(SHIPPED_STORE / eid, root / "kernel_store" / eid)
    cands = {f"replay-{e}": Candidate(f"replay-{e}", "o", "fuse-elementwise-chain", "replay", "", str(i) * 40, "b" * 40,
                                      e, trailers={"Optbot-Entry": e}) for i, e in enumerate(members, 1)}
    ids = list(cands)
    verdicts = {cid: gpu_verdict(reused_from="a store record (test)") for cid in ids}
    checks = [combine.StackCheck(ids, "", "9" * 40, "w" * 64, "rejected", "correctness", "rel L2 0.104 > 0.05"),
              combine.StackCheck(ids[:2], ids[1], "8" * 40, "t" * 64, "rejected", "correctness",
                                 "1024x1024 [graph]: cond rel L2 0.139 > 0.05"),
              combine.StackCheck([ids[0], ids[2]], ids[2], "7" * 40, "u" * 64, "rejected", "crashed", "x",
                                 known_from="run-0")]
    comb = combine.Result("done", "b", "b" * 40, "7" * 40, checks=checks)
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2", default_engine="diffusers"), engine_name="diffusers",
                             checkout=SimpleNamespace(base_sha="b" * 40), preset="full", dtype="bfloat16", device="cuda")
    res = learn.run(_ctx(tmp_path, root, target, Results(
        baseline=_baseline(), generate=generate.Result("done", "3 candidates", list(cands.values())),
        validate=validate.Result("done", "3 of 3 accepted", verdicts), combine=comb)))
    assert res.lessons == ["lessons/flux2-swiglu-in-a-stack-on-h200-flux2.md"]
    text = (Path(res.knowledge_root) / res.lessons[0]).read_text()
    assert "flux2-swiglu breaks a stack on h200 (flux2): correctness" in text and "onto flux2-qk-rmsnorm-rope" in text
    assert "cond rel L2 0.139" in text and "kind: caveat" in text
    assert {"kernel_store/flux2-qk-rmsnorm-rope/bench.json", "kernel_store/flux2-swiglu/bench.json",
            "kernel_store/flux2-merge-qkv/bench.json", res.lessons[0]} <= set(res.files)
    key = recall.RunKey(Path(res.knowledge_root) / "kernel_store", "flux2", "h200", "b" * 40, "full", "bfloat16", True,
                        False, ENV)
    assert recall.stack_check(key, ids[:2], cands, "t" * 64).status == "rejected"
    assert recall.stack_check(key, [ids[0], ids[2]], cands, "u" * 64) is None  # known from run-0: not recorded again
