"""What the store already knows (bot/knowledge/known.py): a recorded GPU verdict is reused only when
patch, base, workload, preset, dtype, hardware, torch and triton are all unchanged; a replayed
entry's new verdict joins its history instead of duplicating it (bot/knowledge/learn.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bot.knowledge.known import known_verdict, patch_sha256
from bot.knowledge.store import STORE_DIR, get_entry
from bot.knowledge.learn import Outcome, learn
from bot.optimize.stages import reused_verdict

ENV = {"device_kind": "cuda", "device_name": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0"}


def _record(entry, **over) -> dict:
    """A gpu.validation record in the shape `store check --record` writes (test data, not a result)."""
    w = {"status": "accepted", "reason": None, "summary": "correct, engaged, eager 1.036x", "preset": "full",
         "dtype": "bfloat16", "base_sha": "b" * 40, "patch_sha256": patch_sha256(entry), "env": dict(ENV),
         "worst_output": {"label": "1024x1024/txt512/b1 seed 7", "output": "noise_pred", "rel_l2": 0.0, "max_abs": 0.0},
         "speed": {"eager": {"device": "cuda", "speedup": 1.036, "passes": 1, "trials_per_process": 10,
                             "base_process_ms": [551.9, 550.2], "patched_process_ms": [530.6, 532.7]}}}
    w.update(over)
    bench = {"entry": entry.id, "gpu": {"validation": {"command": "optbot store check --device cuda",
                                                        "recorded_at": "2026-11-29T22:16:00+00:00", "workloads": {"flux2": w}}}}
    entry.bench_path.write_text(json.dumps(bench))
    return w


@pytest.fixture
def entry(tmp_path):
    shutil.copytree(STORE_DIR / "flux2-swiglu", tmp_path / "store" / "flux2-swiglu")
    return get_entry("flux2-swiglu", tmp_path / "store")


def _ask(entry, **kw):
    args = dict(workload="flux2", hardware="h200", base_sha="b" * 40, preset="full", dtype="bfloat16", env=ENV)
    args.update(kw)
    return known_verdict(entry, **args)


def test_a_recorded_verdict_applies_only_unchanged(entry):
    _record(entry)
    k, why = _ask(entry)
    assert k is not None and why == "" and k.status == "accepted" and k.speedup == 1.036
    for change, word in [(dict(base_sha="c" * 40), "base"), (dict(preset="tiny"), "preset"),
                         (dict(dtype="float32"), "dtype"), (dict(hardware="h100"), "hardware"),
                         (dict(env={**ENV, "triton": "3.7.0"}), "triton"), (dict(workload="qwen-image"), "no GPU verdict")]:
        k, why = _ask(entry, **change)
        assert k is None and word in why, (change, why)
    # the patch changed since the verdict: unknown again
    entry.patch_path.write_text(entry.patch_path.read_text() + "\n")
    k, why = _ask(entry)
    assert k is None and "patch" in why


def test_no_record_means_unknown(entry):
    entry.bench_path.unlink(missing_ok=True)
    assert _ask(entry) == (None, "no GPU verdict recorded")


def test_reused_verdict_carries_the_recorded_numbers(entry):
    _record(entry)
    k, _ = _ask(entry)
    import dataclasses
    v = reused_verdict("replay-flux2-swiglu", dataclasses.asdict(k))
    assert v.status == "accepted" and v.reason.startswith("reused:") and v.raw["reused"] is True
    assert v.base_eager.median_ms == pytest.approx(551.05) and v.cand_eager.median_ms == pytest.approx(531.65)
    assert v.base_eager.device_name == "NVIDIA H200" and v.speedup == pytest.approx(551.05 / 531.65)


def _outcome(status: str, **kw) -> Outcome:
    base = dict(candidate_id="replay-flux2-swiglu", kind="fuse-elementwise-chain", generator="replay", run_id="r-1",
                status=status, reason="accepted" if status == "accepted" else "no-change: 1.004x",
                numbers={"eager": {"speedup": 1.03}}, device="cuda", hardware="h200", engine="diffusers",
                engine_source="x", base_sha="b" * 40, commit_sha="c" * 40, title="Fused SwiGLU", patch="",
                workload="flux2", dtype="bfloat16", entry_id="flux2-swiglu")
    base.update(kw)
    return Outcome(**base)


def test_a_replayed_entry_gets_history_not_a_copy(entry, tmp_path):
    store, lessons = entry.path.parent, tmp_path / "lessons"
    got = learn(_outcome("accepted"), store_dir=store, lessons_dir=lessons)
    assert got.entry_dir is None and got.lesson_path is None  # success of a known entry: no new files
    assert sorted(p.name for p in store.iterdir()) == ["flux2-swiglu"]
    hist = json.loads(entry.bench_path.read_text())["history"]
    assert [(h["run_id"], h["status"]) for h in hist] == [("r-1", "accepted")]
    learn(_outcome("accepted"), store_dir=store, lessons_dir=lessons)  # a resumed run: same row rewritten
    assert len(json.loads(entry.bench_path.read_text())["history"]) == 1
    got = learn(_outcome("rejected", run_id="r-2"), store_dir=store, lessons_dir=lessons)
    assert got.lesson_path is not None and "flux2-swiglu" in got.lesson_path.read_text()  # a failure is news
    assert [h["run_id"] for h in json.loads(entry.bench_path.read_text())["history"]] == ["r-1", "r-2"]


def test_a_gpu_verdict_learned_in_a_run_is_known_to_the_next(entry, tmp_path):
    """The loop closes: a verdict measured in one run (learn) is what the next run looks up (known)."""
    store, lessons = entry.path.parent, tmp_path / "lessons"
    entry.bench_path.unlink(missing_ok=True)
    verdict = {"status": "accepted", "reason": None, "summary": "correct, engaged, eager 1.04x", "preset": "full",
               "dtype": "bfloat16", "base_sha": "b" * 40, "candidate_sha": "c" * 40, "env": dict(ENV), "seconds": 150.0,
               "correctness": {"seeds": [5, 9, 11], "shapes": ["1024x1024/txt512/b1"], "rule": "rel_l2 <= 0.05",
                               "checks": [{"label": "1024x1024/txt512/b1 seed 5", "output": "noise_pred", "ok": True,
                                           "reason": "", "rel_l2": 0.003, "max_abs": 0.01}]},
               "speed": [{"mode": "eager", "device": "cuda", "base_ms": [550.0, 552.0], "candidate_ms": [530.0, 531.0],
                          "speedup": 1.04, "noise_pct": 0.4, "outcome": "faster", "n": 10, "passes": 1}]}
    learn(_outcome("accepted", verdict=verdict, command="optbot optimize flux2 --device cuda"),
          store_dir=store, lessons_dir=lessons)
    rec = json.loads(entry.bench_path.read_text())["gpu"]["validation"]
    assert rec["run_id"] == "r-1" and rec["command"] == "optbot optimize flux2 --device cuda"
    k, why = _ask(entry)
    assert k is not None, why
    assert k.status == "accepted" and k.speedup == 1.04 and k.numbers["speed"]["eager"]["base_process_ms"] == [550.0, 552.0]
    # a CPU verdict is not a GPU verdict: nothing recorded for reuse
    entry.bench_path.unlink()
    learn(_outcome("accepted", device="cpu", hardware="cpu", verdict=verdict), store_dir=store, lessons_dir=lessons)
    assert "gpu" not in json.loads(entry.bench_path.read_text())


def test_an_accepted_variant_becomes_the_entry(entry, tmp_path):
    """Variant search's winner, accepted on a GPU: the entry adopts its patch and kernel source, the
    verdict is recorded against the new patch, and the search is recorded so it is not repeated."""
    store, lessons = entry.path.parent, tmp_path / "lessons"
    entry.bench_path.unlink(missing_ok=True)
    old_patch = entry.patch_path.read_text()
    assert "block_n=1024" in old_patch or "block_n" in old_patch
    kernel = next(p for p in entry.path.glob("*.py") if not p.name.startswith("test_"))
    new_src = kernel.read_text() + "\n# tuned by variant search (test)\n"
    new_patch = old_patch + "\n"  # the variant commit's diff (test data: any change will do)
    verdict = {"status": "accepted", "reason": None, "summary": "eager 1.05x", "preset": "full", "dtype": "bfloat16",
               "base_sha": "b" * 40, "env": dict(ENV), "correctness": {"checks": []},
               "speed": [{"mode": "eager", "device": "cuda", "base_ms": [550.0], "candidate_ms": [524.0],
                          "speedup": 1.05, "n": 10, "passes": 1}]}
    o = _outcome("accepted", generator="variant-search", candidate_id="variant-flux2-swiglu", patch=new_patch,
                 added_files={f"src/diffusers/models/optbot_kernels/{kernel.name}": new_src}, verdict=verdict,
                 config="block_n=2048,num_warps=8")
    learn(o, store_dir=store, lessons_dir=lessons)
    assert entry.patch_path.read_text() == new_patch and kernel.read_text() == new_src
    gpu = json.loads(entry.bench_path.read_text())["gpu"]
    vs = gpu["variant_search"]["h200"]
    assert vs["adopted"] and vs["config"] == "block_n=2048,num_warps=8" and vs["patch_sha256"] == patch_sha256(entry)
    assert gpu["validation"]["workloads"]["flux2"]["patch_sha256"] == patch_sha256(entry)
    k, why = _ask(entry)
    assert k is not None and k.speedup == 1.05, why

    # a rejected variant changes nothing in the entry, but its search is remembered
    o2 = _outcome("rejected", generator="variant-search", run_id="r-2", patch=new_patch + "\n", verdict={**verdict, "status": "rejected"},
                  config="block_n=256,num_warps=2")
    learn(o2, store_dir=store, lessons_dir=lessons)
    assert entry.patch_path.read_text() == new_patch
    vs = json.loads(entry.bench_path.read_text())["gpu"]["variant_search"]["h200"]
    assert vs["run_id"] == "r-2" and not vs["adopted"] and vs["status"] == "rejected"


def test_a_stack_ablation_recorded_by_learn_is_known_for_the_same_stack_only(tmp_path):
    """learn.record_ablation writes the stack's leave-one-out into each member's bench.json;
    known_ablation reuses it only when every member holds it for the same stack diff, base,
    preset, dtype, hardware, torch, triton and at least as many rounds."""
    from bot.knowledge.known import known_ablation
    from bot.knowledge.learn import record_ablation

    store = tmp_path / "store"
    for eid in ("flux2-swiglu", "flux2-qk-rmsnorm-rope"):
        shutil.copytree(STORE_DIR / eid, store / eid)
    members = [get_entry(e, store) for e in ("flux2-swiglu", "flux2-qk-rmsnorm-rope")]
    key = dict(stack_sha256="s" * 64, base_sha="b" * 40, preset="full", dtype="bfloat16", hardware="h200",
               torch=ENV["torch"], triton=ENV["triton"])
    # rows as an ablation would report them (test data, not a measurement)
    rec = {**key, "run_id": "run-1", "mode": "eager", "rounds": 1, "device": "cuda", "base_ms": 554.0, "stack_ms": 478.2,
           "rows": [{"entry": "flux2-swiglu", "without_ms": 495.0, "contribution_ms": 16.8, "contribution_pct": 3.4},
                    {"entry": "flux2-qk-rmsnorm-rope", "without_ms": 534.9, "contribution_ms": 56.7, "contribution_pct": 10.6}]}

    def ask(entries=members, **kw):
        a = dict(workload="flux2", stack_sha256=key["stack_sha256"], hardware="h200", base_sha=key["base_sha"],
                 preset="full", dtype="bfloat16", env=ENV, rounds=1)
        a.update(kw)
        return known_ablation(entries, **a)

    assert ask()[0] is None and "no leave-one-out" in ask()[1]
    record_ablation(members[0].path, "flux2", rec)
    got, why = ask()
    assert got is None and "flux2-qk-rmsnorm-rope" in why  # one member does not hold it (yet)
    record_ablation(members[1].path, "flux2", rec)
    got, why = ask()
    assert why == "" and got["run_id"] == "run-1" and [r["contribution_ms"] for r in got["rows"]] == [16.8, 56.7]
    assert json.loads(members[0].bench_path.read_text())["gpu"]["ablation"]["flux2"]["recorded_at"]
    for change, word in [(dict(stack_sha256="t" * 64), "stack"), (dict(base_sha="c" * 40), "base"),
                         (dict(hardware="h100"), "hardware"), (dict(env={**ENV, "torch": "2.12.0"}), "torch"),
                         (dict(rounds=2), "rounds"), (dict(workload="qwen-image"), "no leave-one-out")]:
        got, why = ask(**change)
        assert got is None and word in why, (change, why)
    got, why = ask(entries=members[:1])  # a stack of other members
    assert got is None and "other entries" in why


def test_learn_records_the_measured_ablation_and_combine_reuses_it(tmp_path):
    """The glue: learn writes the combine step's measured leave-one-out into the members' bench.json
    (bot/optimize/recall.record_stack_ablation, into the staging copy); a later run's ablate step
    over the same stack maps it onto its own commits instead of measuring. The numbers are test data."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from bot.knowledge import recall
    from bot.optimize.stages import Budget, CandidateRecord, CombineResult, Options, RunContext, Stages, StackCommit

    root = tmp_path / "knowledge"
    for eid in ("flux2-swiglu", "flux2-qk-rmsnorm-rope"):
        shutil.copytree(STORE_DIR / eid, root / "kernel_store" / eid)
    cands = {f"replay-{e}": CandidateRecord(f"replay-{e}", e, "0" * 40, "", "replay", "k", "o", "", {"Optbot-Entry": e})
             for e in ("flux2-swiglu", "flux2-qk-rmsnorm-rope")}
    key = recall.RunKey(root / "kernel_store", "flux2", "h200", "b" * 40, "full", "bfloat16", True, False, ENV)
    combine = {"stack_sha256": "s" * 64, "commits": [{"candidate_id": c, "sha": "1" * 40, "subject": c} for c in cands],
               "ablation_measured": {"mode": "eager", "rounds": 1, "device": "cuda", "base_ms": 554.0, "stack_ms": 478.2},
               "ablation": [{"candidate_id": "replay-flux2-swiglu", "without_ms": 495.0, "contribution_ms": 16.8,
                             "contribution_pct": 3.4},
                            {"candidate_id": "replay-flux2-qk-rmsnorm-rope", "without_ms": 534.9, "contribution_ms": 56.7,
                             "contribution_pct": 10.6}]}
    files = recall.record_stack_ablation(key, root, combine, cands, {}, "run-1", "optbot optimize flux2")
    assert sorted(files) == ["kernel_store/flux2-qk-rmsnorm-rope/bench.json", "kernel_store/flux2-swiglu/bench.json"]
    # a member that is no store entry: nothing recorded (it could never be matched)
    other = {**cands, "replay-flux2-swiglu": CandidateRecord("replay-flux2-swiglu", "x", "0" * 40, "", "agent", "k", "o", "", {})}
    assert recall.record_stack_ablation(key, root, combine, other, {}, "run-1", "c") == []

    # the next run: the same stack, other commit shas and candidate ids, through the real ablate step
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2"), checkout=SimpleNamespace(base_sha="b" * 40),
                             preset="full", dtype="bfloat16", device="cuda")
    ctx = RunContext("run-2", tmp_path / "run2", Options("flux2", knowledge_path=str(root), ablation_rounds=1), Budget(),
                     {"baseline": {"env": ENV},
                      "generate": {"candidates": [{**asdict(c), "id": c.id + "-2"} for c in cands.values()]}}, target=target)
    res = CombineResult("done", "b", "b" * 40, "2" * 40, [StackCommit(c + "-2", "3" * 40, c) for c in cands],
                        stack_sha256="s" * 64)
    rows, note = Stages().ablate(ctx, res)
    assert [(r.candidate_id, r.contribution_ms) for r in rows] == [("replay-flux2-swiglu-2", 16.8),
                                                                  ("replay-flux2-qk-rmsnorm-rope-2", 56.7)]
    assert "known from run run-1" in note and res.ablation_known_from == "run-1" and res.ablation_measured == {}
    assert recall.stack_ablation(key, res.commits, {c["id"]: c for c in ctx.results["generate"]["candidates"]},
                                 "t" * 64, 1) is None  # another stack: measured again
    key2 = recall.RunKey(**{**key.__dict__, "revalidate": True})
    assert recall.stack_ablation(key2, res.commits, {c["id"]: c for c in ctx.results["generate"]["candidates"]},
                                 "s" * 64, 1) is None


def test_the_learn_step_commits_what_an_adopted_variant_wrote(tmp_path):
    """Regression (H200 loop, 2026-11-30): learn adopted a tuned variant into its entry (patch.diff,
    kernel source) but the learn step listed only bench.json for the knowledge commit, so the next
    run found a variant_search record whose patch_sha256 matched no patch.diff, searched again and
    validated again. Through the real learn step: every file the learner wrote is in its result,
    and the staged entry is known (searched, and its verdict applies) to the next run."""
    from dataclasses import asdict
    from types import SimpleNamespace

    import git

    from bot.knowledge import recall
    from bot.optimize.stages import Budget, CandidateRecord, Options, RunContext, Stages

    root = tmp_path / "knowledge"
    shutil.copytree(STORE_DIR / "flux2-swiglu", root / "kernel_store" / "flux2-swiglu")
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
    cand = CandidateRecord("variant-flux2-swiglu", "Fused SwiGLU (tuned)", eng.head.commit.hexsha, "", "variant-search",
                           "fuse-elementwise-chain", "o", "", {"Optbot-Entry": "flux2-swiglu", "Optbot-Config": "block_n=2048"})
    verdict = {"status": "accepted", "reason": None, "summary": "eager 1.05x", "preset": "full", "dtype": "bfloat16",
               "base_sha": base, "env": dict(ENV), "correctness": {"checks": []},
               "speed": [{"mode": "eager", "device": "cuda", "base_ms": [550.0], "candidate_ms": [524.0],
                          "speedup": 1.05, "n": 10, "passes": 1}]}
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2", default_engine="diffusers"), engine_name="diffusers",
                             checkout=SimpleNamespace(repo=eng, base_sha=base, repo_path=tmp_path / "engine"),
                             preset="full", dtype="bfloat16", device="cuda")
    ctx = RunContext("run-1", tmp_path / "run1", Options("flux2", knowledge_path=str(root)), Budget(),
                     {"baseline": {"env": ENV}, "generate": {"candidates": [asdict(cand)]},
                      "validate": {"verdicts": [{"candidate_id": cand.id, "status": "accepted", "reason": "accepted",
                                                 "device": "cuda", "raw": {"verdict": verdict}}]}},
                     target=target)
    res = Stages().learn(ctx)
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
    from types import SimpleNamespace

    from bot.knowledge import recall
    from bot.optimize.stages import Budget, Options, RunContext, Stages

    root = tmp_path / "knowledge"
    shutil.copytree(STORE_DIR / "flux2-swiglu", root / "kernel_store" / "flux2-swiglu")
    target = SimpleNamespace(workload=SimpleNamespace(name="flux2", default_engine="diffusers"), engine_name="diffusers",
                             checkout=SimpleNamespace(repo=None, base_sha="b" * 40, repo_path=tmp_path),
                             preset="full", dtype="bfloat16", device="cuda")
    search = {"entry_id": "flux2-swiglu", "config": "block_n=1024,num_warps=4", "status": "kept",
              "reason": "the entry's own config is within 3% of the fastest"}
    ctx = RunContext("run-1", tmp_path / "run1", Options("flux2", knowledge_path=str(root)), Budget(),
                     {"baseline": {"env": ENV}, "generate": {"candidates": [], "searches": [search]},
                      "validate": {"verdicts": []}}, target=target)
    res = Stages().learn(ctx)
    assert res.status == "done" and res.files == ["kernel_store/flux2-swiglu/bench.json"], (res.reason, res.files)
    staged = Path(res.knowledge_root) / "kernel_store"
    key = recall.RunKey(staged, "flux2", "h200", "b" * 40, "full", "bfloat16", True, False, ENV)
    said = recall.searched(key, get_entry("flux2-swiglu", staged))
    assert "searched in run run-1 on h200: block_n=1024,num_warps=4 kept" in said, said
    assert recall.searched(recall.RunKey(**{**key.__dict__, "env": {**ENV, "triton": "3.7.0"}}),
                           get_entry("flux2-swiglu", staged)) == ""  # another triton: searched again
