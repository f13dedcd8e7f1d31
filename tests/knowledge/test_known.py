"""What the store already knows (bot/knowledge/known.py): a recorded GPU verdict is reused only when
patch, base, workload, preset, dtype, hardware, torch and triton are all unchanged; a recorded
leave-one-out only for the same stack."""
from __future__ import annotations

import json
import shutil

import pytest

from bot.knowledge.known import known_ablation, known_verdict
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.records import AblationRecord, AblationRecordRow, record_ablation
from bot.knowledge.store import get_entry
from tests.knowledge.verdicts import ENV, record_verdict


@pytest.fixture
def entry(tmp_path):
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", tmp_path / "store" / "flux2-swiglu")
    return get_entry("flux2-swiglu", tmp_path / "store")


def ask(entry, **kw):
    args = dict(workload="flux2", hardware="h200", base_sha="b" * 40, preset="full", dtype="bfloat16", env=ENV)
    args.update(kw)
    return known_verdict(entry, **args)


def test_a_recorded_verdict_applies_only_unchanged(entry):
    record_verdict(entry)
    k, why = ask(entry)
    assert k is not None and why == "" and k.status == "accepted" and k.speedup == 1.036
    assert k.numbers["speed"]["eager"]["base_process_ms"] == [551.9, 550.2]  # the record, as JSON
    for change, word in [(dict(base_sha="c" * 40), "base"), (dict(preset="tiny"), "preset"),
                         (dict(dtype="float32"), "dtype"), (dict(hardware="h100"), "no GPU verdict recorded on h100"),
                         (dict(env={**ENV, "triton": "3.7.0"}), "triton"), (dict(workload="qwen-image"), "no GPU verdict")]:
        k, why = ask(entry, **change)
        assert k is None and word in why, (change, why)
    # the patch changed since the verdict: unknown again
    entry.patch_path.write_text(entry.patch_path.read_text() + "\n")
    k, why = ask(entry)
    assert k is None and "patch" in why


def test_no_record_means_unknown(entry):
    entry.bench_path.unlink(missing_ok=True)
    assert ask(entry) == (None, "no GPU verdict recorded on h200")


def test_a_verdict_on_another_gpu_keeps_this_ones(entry):
    """The device tool lends an H100 or an H200: a store check on the H100 records its verdict as
    the latest and keeps the H200 one (gpu.validation_elsewhere), so a run on the H200 still reuses
    its own; a later H200 recording supersedes the H200 one wherever it is, and keeps the H100's."""
    from bot.knowledge.records import load_bench
    from tests.knowledge.verdicts import gpu_verdict

    h100 = {**ENV, "device_name": "NVIDIA H100 80GB HBM3"}
    record_verdict(entry)  # H200, 1.036x
    record_verdict(entry, gpu_verdict(speedup=1.02, env=h100))
    gpu = load_bench(entry.path).gpu
    assert gpu.validation.hardware() == "h100" and list(gpu.validation_elsewhere) == ["h200"]
    k, why = ask(entry)
    assert k is not None and k.speedup == 1.036, why
    k, why = ask(entry, hardware="h100", env=h100)
    assert k is not None and k.speedup == 1.02, why
    record_verdict(entry, gpu_verdict(speedup=1.05))  # H200 again
    gpu = load_bench(entry.path).gpu
    assert gpu.validation.hardware() == "h200" and list(gpu.validation_elsewhere) == ["h100"]
    assert ask(entry)[0].speedup == 1.05 and ask(entry, hardware="h100", env=h100)[0].speedup == 1.02
    record_verdict(entry, gpu_verdict(speedup=1.06))  # the same hardware: superseded, nothing kept
    gpu = load_bench(entry.path).gpu
    assert ask(entry)[0].speedup == 1.06 and list(gpu.validation_elsewhere) == ["h100"]


def test_the_shipped_records_are_found(entry):
    """A committed H200 verdict (benchmarks/results) matches its own conditions while the entry's patch
    is the one it was made on: flux2-merge-qkv's of 2026-11-29 and flux2-swiglu's of 2026-12-05 (its
    concatenation patch, four modes); once the patch changes, the verdict is another patch's."""
    for e in (get_entry("flux2-merge-qkv", SHIPPED_STORE), entry):
        rec = json.loads(e.bench_path.read_text())["gpu"]["validation"]["workloads"]["flux2"]
        k, why = ask(e, workload="flux2", base_sha=rec["base_sha"], env=rec["env"])
        assert k is not None, why
        assert k.status == rec["status"] and k.numbers == rec
    assert set(rec["speed"]) == {"eager", "graph", "compile", "compile+graph"}
    entry.patch_path.write_text(entry.patch_path.read_text() + "\n")
    k, why = ask(entry, base_sha=rec["base_sha"], env=rec["env"])
    assert k is None and "another patch" in why


def test_a_rejection_from_before_the_enabled_rule_is_measured_again(tmp_path):
    """qwen-image-hoist-host-copies' H100 verdict (2026-12-05) was rejected "faster in no mode" while
    its graph modes ran for it and not for upstream; the rule that times such a mode against the base
    without the graph came after. That recorded rejection is not reused; a verdict that judged the
    mode under the rule (base_mode set) is."""
    from bot.validate.verdict import Speed
    from tests.knowledge.verdicts import gpu_verdict

    e = get_entry("qwen-image-hoist-host-copies", SHIPPED_STORE)
    rec = json.loads(e.bench_path.read_text())["gpu"]["validation"]["workloads"]["qwen-image"]
    k, why = ask(e, workload="qwen-image", hardware="h100", base_sha=rec["base_sha"], env=rec["env"])
    assert k is None and "predates the rule for a mode only the candidate runs (graph" in why, why

    h100 = {**ENV, "device_name": "NVIDIA H100 80GB HBM3"}
    capture = "base: CUDA graph capture failed: RuntimeError: Cannot copy between CPU and CUDA tensors"
    for i, (graph, reused) in enumerate([
            (Speed("graph", "cuda", [], [410.6, 410.2], None, None, "n/a", capture, n=10), False),
            (Speed("graph", "cuda", [422.0, 424.2], [430.0, 431.0], 0.98, 0.8, "n/a", capture, n=10,
                   base_mode="eager"), True)]):
        shutil.copytree(SHIPPED_STORE / "flux2-swiglu", tmp_path / f"s{i}" / "flux2-swiglu")
        entry = get_entry("flux2-swiglu", tmp_path / f"s{i}")
        v = gpu_verdict(status="rejected", reason="no-change", env=h100)
        v.speed.append(graph)
        record_verdict(entry, v)
        k, why = ask(entry, hardware="h100", env=h100)
        assert (k is not None) == reused, why


def _ablation(key: dict, rounds: int = 1) -> AblationRecord:
    """The stack's leave-one-out as the optimize learn step records it (numbers are test data)."""
    return AblationRecord(**key, run_id="run-1", command="optbot optimize flux2", mode="eager", rounds=rounds, device="cuda",
                    base_ms=554.0, stack_ms=478.2, noise_pct=0.5,
                    rows=[AblationRecordRow("flux2-swiglu", 495.0, 16.8, 3.4),
                          AblationRecordRow("flux2-qk-rmsnorm-rope", 534.9, 56.7, 10.6)])


def test_a_stack_ablation_is_known_for_the_same_stack_only(tmp_path):
    """records.record_ablation writes the stack's leave-one-out into each member's bench.json;
    known_ablation reuses it only when every member holds it for the same stack diff, base,
    preset, dtype, hardware, torch, triton and at least as many rounds."""
    store = tmp_path / "store"
    for eid in ("flux2-swiglu", "flux2-qk-rmsnorm-rope"):
        shutil.copytree(SHIPPED_STORE / eid, store / eid)
    members = [get_entry(e, store) for e in ("flux2-swiglu", "flux2-qk-rmsnorm-rope")]
    key = dict(stack_sha256="s" * 64, base_sha="b" * 40, preset="full", dtype="bfloat16", hardware="h200",
               torch=ENV["torch"], triton=ENV["triton"])

    def ask_stack(entries=members, **kw):
        a = dict(workload="flux2", stack_sha256=key["stack_sha256"], hardware="h200", base_sha=key["base_sha"],
                 preset="full", dtype="bfloat16", env=ENV, rounds=1)
        a.update(kw)
        return known_ablation(entries, **a)

    assert ask_stack()[0] is None and "no leave-one-out" in ask_stack()[1]
    record_ablation(members[0].path, "flux2", _ablation(key))
    got, why = ask_stack()
    assert got is None and "flux2-qk-rmsnorm-rope" in why  # one member does not hold it (yet)
    record_ablation(members[1].path, "flux2", _ablation(key))
    got, why = ask_stack()
    assert why == "" and got["run_id"] == "run-1" and [r["contribution_ms"] for r in got["rows"]] == [16.8, 56.7]
    assert json.loads(members[0].bench_path.read_text())["gpu"]["ablation"]["flux2"]["recorded_at"]
    for change, word in [(dict(stack_sha256="t" * 64), "stack"), (dict(base_sha="c" * 40), "base"),
                         (dict(hardware="h100"), "hardware"), (dict(env={**ENV, "torch": "2.12.0"}), "torch"),
                         (dict(rounds=2), "rounds"), (dict(workload="qwen-image"), "no leave-one-out")]:
        got, why = ask_stack(**change)
        assert got is None and word in why, (change, why)
    got, why = ask_stack(entries=members[:1])  # a stack of other members
    assert got is None and "other entries" in why


def test_every_shipped_record_cites_a_result_that_is_committed():
    """A store entry's GPU record names the results file it came from ("source"); that file is in the
    repository under that name (large results are gzipped, benchmarks/results/README.md, but not the
    ones a record or lesson cites). Found missing once, when three cited files had been gzipped."""
    root = SHIPPED_STORE.parent
    cited = set()

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "source" and isinstance(v, str) and v.startswith("benchmarks/results/"):
                    cited.add(v)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for bench in SHIPPED_STORE.glob("*/bench.json"):
        walk(json.loads(bench.read_text()))
    assert cited, "no store record cites a results file: the walk found nothing to check"
    missing = sorted(c for c in cited if not (root / c).is_file())
    assert not missing, missing


def test_a_quantized_verdict_from_before_the_unquantized_check_is_measured_again(entry):
    """At a quantized precision the gate gained a second condition (no farther from the unquantized
    model than the quantized base): a verdict recorded under the old rule was judged by another one,
    so it is not reused; one whose rule carries the condition is."""
    from bot.tolerance import Tolerance
    from bot.validate.verdict import Correctness
    from tests.knowledge.verdicts import SHAPE, gpu_verdict

    old = gpu_verdict(dtype="bfloat16+fp8")
    record_verdict(entry, old)
    k, why = ask(entry, dtype="bfloat16+fp8")
    assert k is None and "predates the rule against the unquantized model" in why
    rule = Tolerance(0.065, 0.98, 0.1, "measured").rule("bfloat16+fp8")
    record_verdict(entry, gpu_verdict(dtype="bfloat16+fp8", correctness=Correctness(
        ok=True, seeds=[5, 9, 11], shapes=[SHAPE], rule=rule, checks=old.correctness.checks)))
    k, why = ask(entry, dtype="bfloat16+fp8")
    assert k is not None and why == "", why
    assert ask(entry)[0] is None  # and the bfloat16 question is another dtype
