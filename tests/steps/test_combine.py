"""The combine step (bot/steps/combine.py): which accepted candidates make the stack, and a stack's
leave-one-out that the learn step recorded in its members' bench.json is reused by a later run over
the same stack instead of measured (bot/knowledge/recall.py, bot/knowledge/known.known_ablation)."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

from bot.generate.candidate import Candidate
from bot.knowledge import recall
from bot.knowledge.location import SHIPPED_STORE
from bot.run.context import Budget, RunOptions, RunContext
from bot.run.state import Results
from bot.steps import baseline, combine
from bot.steps.combine import StackCommit, _prefer_tuned
from bot.validate.ablate import Ablation, AblationRow, ablation_mode
from tests.knowledge.verdicts import ENV


def test_tuned_variant_supersedes_its_plain_replay():
    def cand(cid, gen, entry):
        return Candidate(cid, "o", "k", gen, "", "0" * 40, trailers={"Optbot-Entry": entry})

    keep, dropped = _prefer_tuned([cand("replay-a", "replay", "a"), cand("replay-b", "replay", "b"),
                                   cand("variant-a", "variant-search", "a"), cand("agent-1", "agent/fuse", "none")])
    assert [c.id for c in keep] == ["replay-b", "variant-a", "agent-1"]
    assert dropped == ["replay-a: superseded by variant-a (the same entry with its tuned config)"]


def _replayed(entries, suffix=""):
    return {f"replay-{e}{suffix}": Candidate(f"replay-{e}{suffix}", "o", "k", "replay", "", "0" * 40,
                                            trailers={"Optbot-Entry": e}) for e in entries}


def test_a_recorded_leave_one_out_is_reused_for_the_same_stack(tmp_path):
    """The glue: learn writes the combine step's measured leave-one-out into the members' bench.json
    (recall.record_stack_ablation, into the staging copy); a later run's ablation over the same
    stack maps it onto its own commits instead of measuring. The numbers are test data."""
    root = tmp_path / "knowledge"
    members = ("flux2-swiglu", "flux2-qk-rmsnorm-rope")
    for eid in members:
        shutil.copytree(SHIPPED_STORE / eid, root / "kernel_store" / eid)
    cands = _replayed(members)
    key = recall.RunKey(root / "kernel_store", "flux2", "h200", "b" * 40, "full", "bfloat16", True, False, ENV)
    # this run's combine step Result, with the leave-one-out it measured
    shas = {c: str(i) * 40 for i, c in enumerate(cands, 1)}
    measured = Ablation("flux2", "full", "cuda", "eager", "b" * 40, "9" * 40, base_ms=554.0, stack_ms=478.2, noise_pct=0.6,
                        rounds=1, rows=[AblationRow(shas["replay-flux2-swiglu"], "swiglu", 495.0, 16.8, 3.4),
                                        AblationRow(shas["replay-flux2-qk-rmsnorm-rope"], "qk", 534.9, 56.7, 10.6)])
    res1 = combine.Result("done", "optbot/flux2/bbbbbbbbbbbb", "b" * 40, "9" * 40,
                          [StackCommit(c, shas[c], c) for c in cands], ablation=measured, stack_sha256="s" * 64)
    files = recall.record_stack_ablation(key, root, res1, cands, {}, "run-1", "optbot optimize flux2")
    assert sorted(files) == ["kernel_store/flux2-qk-rmsnorm-rope/bench.json", "kernel_store/flux2-swiglu/bench.json"]
    rec = json.loads((root / files[0]).read_text())["gpu"]["ablation"]["flux2"]
    assert list(rec) == ["stack_sha256", "base_sha", "preset", "dtype", "hardware", "torch", "triton", "run_id",
                         "command", "mode", "rounds", "device", "base_ms", "stack_ms", "noise_pct", "rows", "recorded_at"]
    assert rec["rows"][0] == {"entry": "flux2-swiglu", "without_ms": 495.0, "contribution_ms": 16.8, "contribution_pct": 3.4}
    # a member that is no store entry: nothing recorded (it could never be matched)
    other = {**cands, "replay-flux2-swiglu": Candidate("replay-flux2-swiglu", "o", "k", "agent", "", "0" * 40)}
    assert recall.record_stack_ablation(key, root, res1, other, {}, "run-1", "c") == []

    # the next run: the same stack, other commit shas and candidate ids, through the step's ablation
    cands2 = _replayed(members, "-2")
    ctx = RunContext("run-2", tmp_path / "run2", RunOptions("flux2", knowledge_path=str(root), ablation_rounds=1), Budget(),
                     Results(baseline=baseline.Result("done", None, None, "", env=dict(ENV))), log=lambda m: None)
    ctx._target = SimpleNamespace(device="cuda", dtype="bfloat16", preset="full", workload=SimpleNamespace(name="flux2"),
                                  checkout=SimpleNamespace(base_sha="b" * 40))
    res2 = combine.Result("done", "b", "b" * 40, "2" * 40, [StackCommit(c, "3" * 39 + str(i), c)
                                                            for i, c in enumerate(cands2)], stack_sha256="s" * 64)
    ab, note, known_from = combine._ablate(ctx, res2, cands2)
    assert [(res2.candidate_of(r.sha), r.contribution_ms) for r in ab.rows] == [("replay-flux2-swiglu-2", 16.8),
                                                                             ("replay-flux2-qk-rmsnorm-rope-2", 56.7)]
    assert "known from run run-1" in note and known_from == "run-1"
    assert recall.stack_ablation(key, res2.commits, cands2, "t" * 64, 1) is None  # another stack: measured again
    key2 = recall.RunKey(**{**key.__dict__, "revalidate": True})
    assert recall.stack_ablation(key2, res2.commits, cands2, "s" * 64, 1) is None


def test_a_commit_idle_in_the_stack_is_named_from_the_stack_verdict():
    """The stack verdict a real CPU run took (tests/steps/data/fp8-stack-not-engaged): the FP8 GELU
    entry's kernel never ran in the stack. idle_in_stack names that candidate and no other, so
    combine rebuilds the stack without it; an accepted or otherwise rejected stack names none."""
    import dataclasses
    from pathlib import Path

    from bot.jsonable import from_json
    from bot.steps.generate import Result as GenerateResult

    data = Path(__file__).with_name("data") / "fp8-stack-not-engaged"
    comb = from_json(combine.Result, json.loads((data / "combine.json").read_text()))
    gen = from_json(GenerateResult, json.loads((data / "generate.json").read_text()))
    accepted = [c for c in gen.candidates if c.id in {s.candidate_id for s in comb.commits}]
    sv = comb.stack_verdict
    assert sv.status == "rejected" and sv.engagement.missing == ["_gelu_quant_kernel"]
    assert combine.idle_in_stack(sv, accepted, comb.commits) == ["replay-qwen-image-fp8-gelu-quant"]
    # not in the stack: not named
    assert combine.idle_in_stack(sv, accepted, [s for s in comb.commits if "fp8" not in s.candidate_id]) == []
    accepted_v = dataclasses.replace(sv, status="accepted", reason=None,
                                     engagement=dataclasses.replace(sv.engagement, ok=True, missing=[]))
    assert combine.idle_in_stack(accepted_v, accepted, comb.commits) == []
    slower = dataclasses.replace(sv, reason="slower", engagement=dataclasses.replace(sv.engagement, ok=True, missing=[]))
    assert combine.idle_in_stack(slower, accepted, comb.commits) == []


def test_a_one_commit_stack_with_its_candidates_tree_keeps_that_verdict(tmp_path):
    """A stack of one commit cherry-picked onto the base is the candidate's code: its verdict stands
    for the stack, labelled as such. Another tree (a second commit, a candidate made on another
    parent) or a candidate that was not accepted is validated again."""
    import git

    from tests.knowledge.verdicts import gpu_verdict as verdict

    repo = git.Repo.init(tmp_path / "engine")
    f = tmp_path / "engine" / "model.py"
    f.write_text("x = 1\n")
    repo.index.add([str(f)])
    base = repo.index.commit("base")
    f.write_text("x = 2\n")
    repo.index.add([str(f)])
    cand_commit = repo.index.commit("candidate")
    repo.git.checkout("--detach", base.hexsha)
    repo.git.cherry_pick("--no-commit", cand_commit.hexsha)
    stack_head = repo.index.commit("stack: candidate").hexsha
    assert stack_head != cand_commit.hexsha
    cands = {"replay-a": Candidate("replay-a", "o", "k", "replay", "", cand_commit.hexsha)}
    v = verdict(status="accepted", reason=None, base_sha=base.hexsha, candidate_sha=cand_commit.hexsha)
    commits = [StackCommit("replay-a", stack_head, "stack: candidate")]

    sv = combine.same_tree_verdict(repo, stack_head, commits, cands, {"replay-a": v})
    assert sv is not None and sv.accepted and sv.candidate_sha == stack_head and sv.speed == v.speed
    assert "candidate replay-a's tree" in sv.reused_from and "(this run)" in sv.reused_from
    assert sv.notes[-1] == sv.reused_from and v.reused_from == ""
    # the candidate's own verdict was a store record: the stack's says so
    known = combine.same_tree_verdict(repo, stack_head, commits, cands,
                                      {"replay-a": verdict(status="accepted", reason=None, reused_from="run r1's record")})
    assert "(run r1's record)" in known.reused_from

    rejected = verdict(status="rejected", reason="slower")
    assert combine.same_tree_verdict(repo, stack_head, commits, cands, {"replay-a": rejected}) is None
    f.write_text("x = 3\n")
    repo.index.add([str(f)])
    other = repo.index.commit("stack: another tree").hexsha
    assert combine.same_tree_verdict(repo, other, [StackCommit("replay-a", other, "s")], cands, {"replay-a": v}) is None
    two = [StackCommit("replay-a", stack_head, "s"), StackCommit("replay-b", other, "t")]
    assert combine.same_tree_verdict(repo, other, two, cands, {"replay-a": v}) is None


def test_the_leave_one_out_is_timed_in_the_stacks_fastest_mode():
    """The stack verdict of SGLang's FP8 Qwen-Image on an H100 (the optimize run of 2026-12-07): eager
    268 ms at 20% A/A noise, CUDA graph 196 ms at 1.2%, both compiled modes failing for base and stack.
    The ablation takes the graph mode; without a mode timed for both, or with only a mode the base ran
    elsewhere ("enabled"), it falls back to eager; a faster compiled mode wins when it ran."""
    import dataclasses
    from pathlib import Path

    from bot.jsonable import from_json
    from bot.validate.verdict import Verdict

    path = (Path(__file__).parents[2] / "benchmarks/results/h100-sglang-qwen-fp8-optimize-20261207/verdict-stack.json")
    sv = from_json(Verdict, json.loads(path.read_text()))
    assert [(s.mode, s.outcome) for s in sv.speed] == [("eager", "faster"), ("graph", "faster"),
                                                        ("compile", "n/a"), ("compile+graph", "n/a")]
    mode, why = ablation_mode(sv)
    assert mode == "graph" and why == "the stack's fastest mode in its verdict, 196.434 ms"
    assert ablation_mode(None)[0] == "eager"
    eager_only = dataclasses.replace(sv, speed=[dataclasses.replace(s, base_ms=[], outcome="n/a")
                                                if s.mode == "graph" else s for s in sv.speed])
    assert ablation_mode(eager_only)[0] == "eager"
    nothing = dataclasses.replace(sv, speed=[dataclasses.replace(s, candidate_ms=[], outcome="n/a") for s in sv.speed])
    assert ablation_mode(nothing) == ("eager", "no mode of the stack's verdict was timed for base and stack: eager")
    enabled = dataclasses.replace(sv, speed=[*sv.speed[:1], dataclasses.replace(sv.speed[1], base_mode="eager",
                                                                                 outcome="enabled")])
    assert ablation_mode(enabled)[0] == "eager"
    compiled = dataclasses.replace(sv, speed=[*sv.speed[:3], dataclasses.replace(
        sv.speed[3], base_ms=[190.0, 191.0], candidate_ms=[180.0, 181.0], outcome="faster")])
    assert ablation_mode(compiled)[0] == "compile+graph"


def test_the_step_ablates_in_that_mode_and_lets_the_pause_check_run_between_rounds(tmp_path):
    """combine._ablate hands the leave-one-out the stack's fastest mode and the run's own --pause-after
    check, and its note says which mode and why (the ablation itself is RunContext.ablate, given here
    a recorder in place of the GPU rounds)."""
    from pathlib import Path

    from bot.jsonable import from_json
    from bot.validate.verdict import Verdict

    root = tmp_path / "knowledge"
    (root / "kernel_store").mkdir(parents=True)
    sv = from_json(Verdict, json.loads((Path(__file__).parents[2] / "benchmarks/results/"
                                        "h100-sglang-qwen-fp8-optimize-20261207/verdict-stack.json").read_text()))
    cands = _replayed(("sglang-qwen-image-fp8-gelu-quant", "sglang-qwen-image-fp8-norm-quant"))
    ctx = RunContext("run-3", tmp_path / "run3", RunOptions("qwen-image", knowledge_path=str(root), ablation_rounds=2),
                     Budget(), Results(baseline=baseline.Result("done", None, None, "", env=dict(ENV))), log=lambda m: None)
    ctx._target = SimpleNamespace(device="cuda", dtype="bfloat16+fp8", preset="full",
                                  workload=SimpleNamespace(name="qwen-image"), checkout=SimpleNamespace(base_sha="b" * 40))
    calls = []

    def recorder(target, head, base, **kw):
        calls.append(kw)
        return Ablation("qwen-image", "full", "cuda", kw["mode"], base, head, base_ms=204.0, stack_ms=196.0,
                        noise_pct=0.5, rounds=kw["rounds"])

    ctx.ablate = recorder
    res = combine.Result("done", "b", "b" * 40, "2" * 40, [StackCommit(c, str(i) * 40, c) for i, c in enumerate(cands, 1)],
                         stack_verdict=sv, stack_sha256="u" * 64)
    ab, note, known_from = combine._ablate(ctx, res, cands)
    assert len(calls) == 1 and calls[0]["mode"] == "graph" and calls[0]["rounds"] == 2
    assert calls[0]["between_rounds"] == ctx.check_pause
    assert note.startswith("leave-one-out, graph (the stack's fastest mode in its verdict, 196.434 ms), 2 rounds on cuda")
    assert ab.mode == "graph" and known_from == ""


def test_a_stack_check_is_correctness_only_and_on_cuda_still_compares_every_mode(tmp_path):
    """combine's stack check asks THE validator for no timing; the validator's correctness processes
    on CUDA still run the step in each production mode and save its outputs there (a stack broke
    only under CUDA graphs), and the shared base's key names those modes; on CPU, eager only."""
    from bot.steps.validate import verdict_of
    from bot.validate import Options
    from bot.validate.context import Context
    from bot.validate.validator import _base_cache

    asked = []
    ctx = RunContext("run-1", tmp_path / "run", RunOptions("flux2", knowledge_path=str(tmp_path)), Budget(), Results(),
                     log=lambda m: None, validate=lambda t, ref, base, opts: asked.append(opts))
    ctx._target = SimpleNamespace(device="cuda", checkout=SimpleNamespace(base_sha="b" * 40))
    verdict_of(ctx, "c" * 40, "stack-check-cccccccccccc", "cuda", speed=False)
    verdict_of(ctx, "c" * 40, "stack", "cuda")
    assert [o.speed for o in asked] == [False, True]
    assert asked[0].cache_dir == asked[1].cache_dir  # one base outcome for both

    modes = ("eager", "graph", "compile", "compile+graph")
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2", production_modes=modes), preset="full",
                             device="cuda", dtype="bfloat16")

    def context(speed, cuda):
        return Context(target=target, opts=Options(speed=speed, cache_dir=tmp_path / "cache"), run_dir=tmp_path,
                       seeds=[1, 2], weight_seed=3, shapes=[], is_cuda=cuda, warmup=1, iters=1)

    check, timed = context(False, True), context(True, True)
    assert check.side_params()["timing"] == {"modes": list(modes), "save_outputs": True, "compile_backend": "inductor"}
    assert check.side_params()["flops"] is False and timed.side_params()["flops"] is True
    assert _base_cache(check, "b" * 40) == _base_cache(timed, "b" * 40)  # a check reuses the timed base's outcome
    assert context(False, False).side_params()["timing"] == {}
    assert "graph" not in str(_base_cache(context(False, False), "b" * 40))


def test_a_recorded_stack_check_is_taken_by_a_later_run_over_the_same_stack(tmp_path, monkeypatch):
    """learn writes the GPU stack checks combine made into every member's bench.json; a later run's
    check of a stack with the same diff and members takes it, and the whole stack it found broken
    is not validated again (its verdict says where it came from). Another stack, another member
    set, a CPU run or --revalidate: checked. A check taken from a record is not recorded again."""
    root = tmp_path / "knowledge"
    members = ("flux2-swiglu", "flux2-qk-rmsnorm-rope", "flux2-merge-qkv")
    for eid in members:
        shutil.copytree(SHIPPED_STORE / eid, root / "kernel_store" / eid)
    cands = _replayed(members)
    ids = list(cands)
    key = recall.RunKey(root / "kernel_store", "flux2", "h200", "b" * 40, "full", "bfloat16", True, False, ENV)
    whole = combine.StackCheck(ids, "", "1" * 40, "w" * 64, "rejected", "correctness", "rel L2 0.104 > 0.05")
    two = combine.StackCheck(ids[:2], ids[1], "2" * 40, "t" * 64, "accepted", None, "correct")
    copied = combine.StackCheck(ids, ids[2], "1" * 40, "w" * 64, "rejected", "correctness", "x", known_from="run-1")
    res = combine.Result("done", "b", "b" * 40, "2" * 40, checks=[whole, two, copied])
    files = recall.record_stack_checks(key, root, res, cands, {}, "run-1", "optbot optimize flux2")
    assert sorted(files) == [f"kernel_store/{e}/bench.json" for e in sorted(members)]
    recs = json.loads((root / "kernel_store/flux2-swiglu/bench.json").read_text())["gpu"]["stack_checks"]["flux2"]
    assert [(r["stack_sha256"][0], r["added"], r["status"]) for r in recs] == [("w", "", "rejected"),
                                                                              ("t", "flux2-qk-rmsnorm-rope", "accepted")]
    merge = json.loads((root / "kernel_store/flux2-merge-qkv/bench.json").read_text())["gpu"]["stack_checks"]["flux2"]
    assert len(merge) == 1  # not a member of the two-entry stack
    # a CPU run records nothing
    cpu = recall.RunKey(**{**key.__dict__, "on_cuda": False, "hardware": "cpu"})
    assert recall.record_stack_checks(cpu, root, res, cands, {}, "run-1", "c") == []

    # a later run: other candidate ids for the same entries
    cands2 = _replayed(members, "-2")
    ids2 = list(cands2)
    rec = recall.stack_check(key, ids2[:2], cands2, "t" * 64)
    assert rec.status == "accepted" and rec.run_id == "run-1"
    assert recall.stack_check(key, ids2[:2], cands2, "u" * 64) is None  # another diff
    assert recall.stack_check(key, [ids2[0], ids2[2]], cands2, "t" * 64) is None  # other members
    assert recall.stack_check(recall.RunKey(**{**key.__dict__, "revalidate": True}), ids2[:2], cands2, "t" * 64) is None
    other_torch = recall.RunKey(**{**key.__dict__, "env": {**ENV, "torch": "0.0"}})
    assert recall.stack_check(other_torch, ids2[:2], cands2, "t" * 64) is None

    # the step: the whole stack that broke is not validated again
    ctx = RunContext("run-2", tmp_path / "run2", RunOptions("flux2", knowledge_path=str(root)), Budget(),
                     Results(baseline=baseline.Result("done", None, None, "", env=dict(ENV))), log=lambda m: None,
                     validate=lambda *a: (_ for _ in ()).throw(AssertionError("validated again")))
    ctx._target = SimpleNamespace(device="cuda", dtype="bfloat16", preset="full", workload=SimpleNamespace(name="flux2"),
                                  checkout=SimpleNamespace(base_sha="b" * 40, repo=None))
    monkeypatch.setattr(combine, "stack_diff_sha256", lambda repo, base, head: "w" * 64)  # no engine repo here
    commits = [StackCommit(c, str(i) * 40, c) for i, c in enumerate(ids2)]
    v = combine._stack_verdict(ctx, "9" * 40, commits, cands2, {})
    assert v.status == "rejected" and v.reason == "correctness" and "checked by run run-1" in v.reused_from
    assert combine.breaks(v)
