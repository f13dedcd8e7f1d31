"""bot/validate/speed.py: the speed outcome over interleaved processes, retiming, implausible numbers."""
from __future__ import annotations

import pytest

from bot.validate.speed import implausible, speed_line, speed_outcome
from bot.validate.verdict import Speed
from tests.validate.conftest import ADV


@pytest.mark.parametrize("base,cand,within,outcome", [
    ([10.0, 10.1], [8.0, 8.05], 0.01, "faster"),
    ([10.0, 10.1], [10.05, 10.0], 0.01, "no-change"),
    ([10.0, 10.0], [9.9, 9.9], 0.0, "no-change"),  # 1% gain, but under the 2% cpu floor
    ([10.0, 12.0], [9.9, 10.2], 0.01, "no-change"),  # 9% gain inside 18% A/A noise
    ([10.0, 10.0], [12.0, 12.1], 0.01, "slower"),
    ([10.0, 10.0], [9.0, 9.0], 0.3, "no-change"),  # 11% gain inside a 15% within-process spread
])
def test_speed_outcome_uses_aa_noise(base, cand, within, outcome):
    speedup, noise, got, aside = speed_outcome(base, cand, [within] * len(base), [within] * len(cand), "cpu")
    assert got == outcome, (speedup, noise)
    assert aside == []  # two processes a side: nothing is set aside


def test_a_lone_disturbed_process_is_set_aside_once_there_are_three():
    """The H200 loop of 2026-11-30 (benchmarks/results/h200-loop-20261130-b): a candidate 7% faster
    measured 389.8 vs 407.4 ms, one of its processes slowed to 400.1 ms by a co-tenant, a 10% A/A
    band: rejected no-change. A third pair of processes outvotes the disturbed one (per-process
    medians from that run; the third pair is what a quiet retime gives)."""
    base, cand = [407.4142, 407.4421], [379.4959, 400.0923]
    _, noise, got, _ = speed_outcome(base, cand, [0.01] * 2, [0.01, 0.2], "cuda")
    assert got == "no-change" and noise > 5
    speedup, noise, got, aside = speed_outcome(base + [407.0], cand + [378.9], [0.01] * 3, [0.01, 0.2, 0.01], "cuda")
    assert got == "faster" and noise < 1.0 and speedup > 1.07, (speedup, noise)
    assert aside == ["base process 3 (407 ms)", "candidate process 2 (400.1 ms)"]
    # a real slowdown is not set aside: two of three processes agree on it
    _, _, got, _ = speed_outcome([407.0, 407.2, 406.9], [440.0, 441.0, 400.0], [0.01] * 3, [0.01] * 3, "cuda")
    assert got == "slower"


def test_implausible_speedup_and_roofline():
    assert "over 10x" in implausible([Speed("eager", "cuda", [100.0], [5.0], speedup=20.0)], None)
    fl = {"compute_floor_ms": 358.0, "linear": 253e12, "attention": 29e12, "peaks": {"matmul_tflops": 790}}
    assert "roofline" in implausible([Speed("eager", "cuda", [533.0], [300.0], speedup=1.7)], fl)
    assert implausible([Speed("eager", "cuda", [533.0], [480.0], speedup=1.1)], fl) == ""


def test_an_fp8_step_is_held_to_the_fp8_floor_not_the_bf16_one():
    """SGLang's FP8 FLUX.2 on an H100 (2026-12-06): 282.60 TFLOP a step, 734.66 TFLOP/s bf16 matmul
    ceiling, 317.8 ms eager, under the bf16 floor (384.7 ms): held implausible, so no FP8 candidate
    could be delivered. With the linear FLOPs at an FP8 ceiling the same step is plausible."""
    from runner.roofline import compute_floor

    pk = {"device": "cuda", "matmul_tflops": 734.66, "matmul_dtype": "bfloat16", "fp8_matmul_tflops": 1200.0,
          "fp8_matmul_form": "_scaled_mm e4m3 x e4m3, row-wise fp32 scales, bf16 out"}
    fl = {"linear": 253.4e12, "attention": 29.2e12, "peaks": pk}
    step = [Speed("eager", "cuda", [319.7], [317.8], speedup=1.006)]
    fl["compute_floor_ms"], fl["compute_floor_basis"] = compute_floor(fl, pk)
    assert "under the roofline floor 384.66" in implausible(step, fl) and "bfloat16 matmul" in implausible(step, fl)
    fl["compute_floor_ms"], fl["compute_floor_basis"] = compute_floor(fl, pk, fp8=True)
    assert round(fl["compute_floor_ms"], 1) == 250.9 and implausible(step, fl) == ""
    assert "under the roofline floor 250.9" in implausible([Speed("eager", "cuda", [319.7], [240.0], speedup=1.3)], fl)
    # no FP8 ceiling measured: no floor, so no floor check (never the bf16 one)
    fl["compute_floor_ms"], fl["compute_floor_basis"] = compute_floor(fl, {**pk, "fp8_matmul_tflops": None}, fp8=True)
    assert fl["compute_floor_ms"] is None and implausible(step, fl) == ""


def test_speed_line_says_mode_device_outcome_and_noise():
    line = speed_line([Speed("eager", "cpu", [10.0], [8.0], speedup=1.25, noise_pct=2.0, outcome="faster"),
                       Speed("graph", "cpu", note="capture failed: cudaErrorStreamCaptureUnsupported")])
    assert line == "eager 1.250x on cpu (faster, noise 2.00%); graph: capture failed: cudaErrorStreamCaptureUnsupported"


def test_a_noisy_rejection_times_another_pair(flux2_cpu, tmp_path, monkeypatch):
    """A speed verdict that would reject inside a wide noise band is measured again: one more
    candidate and base process each (Options.retimes), then decided over all of them. The outcome
    is forced wide-noise no-change here (patched where _speeds looks it up) so that the loop runs
    on CPU; the processes are real."""
    import bot.validate.speed
    from bot.validate import Options, validate

    calls = []

    def noisy(base_ms, cand_ms, bw, cw, device):
        calls.append((len(base_ms), len(cand_ms)))
        return 1.0, 50.0, "no-change", []

    monkeypatch.setattr(bot.validate.speed, "speed_outcome", noisy)
    lines = []
    v = validate(flux2_cpu, str(ADV / "honest_merge_qkv.patch"),
                 opts=Options(iters=2, speed_gates=True, retimes=1, modes=("eager",), run_dir=tmp_path / "run",
                              log=lines.append))
    assert v.status == "rejected" and v.reason == "no-change", v.render()
    eager = next(s for s in v.speed if s.mode == "eager")
    assert len(eager.base_ms) == 3 and len(eager.candidate_ms) == 3
    assert calls == [(2, 2), (3, 3)]  # decided again over all processes, then no more rounds (retimes=1)
    assert any("timing another candidate/base pair (1 of 1)" in ln for ln in lines), lines
    # each runner process's outcome and seconds, as it ends: a validation cut from outside (a device
    # call's limit) shows where its time went
    import re

    timed = [ln for ln in lines if re.fullmatch(r"(candidate [0-9a-f]{12}|base [0-9a-f]{12}|compare|"
                                                 r"(candidate|base): timed process \d): ok, \d+ s"
                                                 r"( \((build|correctness|profile|eager) \d+(, (correctness|profile|eager) \d+)*\))?",
                                                 ln)]
    assert [t.split(":")[0].split(" ")[0] for t in timed][:3] == ["candidate", "base", "compare"], lines
    assert sum("timed process" in t for t in timed) == 4, lines  # two pairs (retimes=1)


def test_a_mode_the_engine_cannot_run_says_so_once_and_whole():
    from bot.validate.speed import failure_note

    err = ("CUDA graph capture failed: RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph "
           "capture unless the CPU tensor is pinned. Please use tensor.pin_memory() or allocate the tensor with "
           "pin_memory=True")
    assert failure_note([err, err], [err, err]) == f"base and candidate: {err}"
    assert failure_note([{"ms": [1.0]}, {"ms": [1.0]}], ["boom", "boom"]) == "candidate: boom"
    assert failure_note(["a"], ["b"]) == "base: a; candidate: b"


CAPTURE_FAILED = ("CUDA graph capture failed: RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA "
                  "graph capture unless the CPU tensor is pinned.")


def _process(timing: dict) -> dict:
    """One validate_step result's timing: mode -> TimingStats as JSON, or the mode's error line. The
    samples spread as the H100 run's did (half the interquartile range 0.8% of the median)."""
    from runner.timing import TimingStats

    return {"timing": {m: t if isinstance(t, str) else
                       TimingStats.from_samples([t * f for f in (0.985, 0.992, 1, 1.008, 1.015)], "cuda",
                                                mode=m).to_json()
                       for m, t in timing.items()}}


def test_a_graph_mode_only_the_candidate_captures_counts_against_the_base_without_the_graph():
    """qwen-image-hoist-host-copies on an H100 (benchmarks/results/h100-qwen-stack7-20261205/,
    per-process medians): the base's forward copies a pageable host tensor, so its CUDA-graph modes
    fail; the entry hoists the copy and captures. Eager and compile do not change, so under the old
    rule it was rejected "faster in no mode", and replay would drop the one entry that lets the
    stack capture. A user of the base who wants graphs runs eager (compile), so that is the
    comparison: graph 410.6 vs eager 422.0 ms is a gain ("enabled")."""
    from types import SimpleNamespace

    from bot.validate.speed import _speeds, speed_line, speed_rejection

    base = [{"eager": 503.858, "graph": CAPTURE_FAILED, "compile": 333.7438, "compile+graph": CAPTURE_FAILED},
            {"eager": 424.1956, "graph": CAPTURE_FAILED, "compile": 329.6458, "compile+graph": CAPTURE_FAILED},
            {"eager": 422.4095, "graph": CAPTURE_FAILED, "compile": 329.9102, "compile+graph": CAPTURE_FAILED}]
    cand = [{"eager": 422.0194, "graph": 411.1443, "compile": 332.0251, "compile+graph": 327.8161},
            {"eager": 421.8714, "graph": 410.6120, "compile": 331.5140, "compile+graph": 327.8393},
            {"eager": 420.1025, "graph": 410.2122, "compile": 331.4458, "compile+graph": 329.3625}]
    ctx = SimpleNamespace(modes=("eager", "graph", "compile", "compile+graph"), iters=10)
    speeds = {s.mode: s for s in _speeds(ctx, {"base": [_process(t) for t in base],
                                               "candidate": [_process(t) for t in cand]}, 2, "cuda")}
    g = speeds["graph"]
    assert g.outcome == "enabled" and g.base_mode == "eager", g
    assert g.base_ms == [503.858, 424.1956, 422.4095] and 1.02 < g.speedup < 1.035, g
    assert "graph runs for the candidate only; against the base's eager" in g.note and "base: CUDA graph" in g.note
    assert speeds["eager"].outcome == "no-change" and speeds["compile"].outcome == "no-change"
    assert speed_rejection(list(speeds.values())) is None
    assert "graph 1.0" in speed_line([g]) and "x vs the base's eager on cuda (enabled" in speed_line([g])

    # the same candidate capturing, but no faster than the base's eager: nothing gained, nothing lost
    slow = [dict(t, graph=430.0) for t in cand]
    speeds = {s.mode: s for s in _speeds(ctx, {"base": [_process(t) for t in base],
                                               "candidate": [_process(t) for t in slow]}, 2, "cuda")}
    g = speeds["graph"]
    assert g.outcome == "n/a" and g.base_mode == "eager" and g.speedup == 0.9844, g  # the ratio kept
    assert "against the base's eager: no gain beyond the noise band" in g.note
    assert speed_rejection(list(speeds.values())) == ("no-change", "faster in no mode")
    # compile+graph: 327.8 vs the base's compile 329.8 ms, 0.6% inside the 0.8% band: no gain either
    assert speeds["compile+graph"].outcome == "n/a" and speeds["compile+graph"].base_mode == "compile"

    # the base captured in one process and not another: not the engine's limit, nothing enabled
    flaky = [dict(base[0], graph=415.0)] + base[1:]
    speeds = {s.mode: s for s in _speeds(ctx, {"base": [_process(t) for t in flaky],
                                               "candidate": [_process(t) for t in cand]}, 2, "cuda")}
    assert speeds["graph"].outcome == "n/a" and not speeds["graph"].base_mode


@pytest.mark.parametrize("mode,fallbacks", [("graph", ["eager"]), ("compile+graph", ["compile", "graph", "eager"]),
                                            ("compile:whole+graph", ["compile:whole", "graph", "eager"]), ("eager", []),
                                            ("compile", ["eager"]), ("compile:max-autotune", ["eager"])])
def test_base_fallbacks_are_what_a_user_runs_when_a_mode_fails(mode, fallbacks):
    from bot.validate.speed import base_fallbacks

    assert base_fallbacks(mode) == fallbacks


def test_a_compiled_mode_only_the_candidate_runs_counts_against_the_base_uncompiled():
    """SGLang's own FP8 FLUX.2 on the H200 (benchmarks/results/h200-sglang-fp8-20261206/): its
    static FP8 quantization kernel fails to build under inductor ("PassManager::run failed"), so the
    base's compile and compile+graph fail in every process while eager 305.7 and graph 303.2 ms run.
    A candidate that fixes the kernel runs compiled: a user of the base runs eager instead of
    compile, and the graph instead of compile+graph, so those are the comparisons."""
    from types import SimpleNamespace

    from bot.validate.speed import _speeds, speed_rejection

    err = "InductorError: RuntimeError: PassManager::run failed"
    base = [{"eager": 305.7, "graph": 303.2, "compile": err, "compile+graph": err}] * 3
    cand = [{"eager": 305.6, "graph": 303.1, "compile": 290.0, "compile+graph": 288.0}] * 3
    ctx = SimpleNamespace(modes=("eager", "graph", "compile", "compile+graph"), iters=10)
    speeds = {s.mode: s for s in _speeds(ctx, {"base": [_process(t) for t in base],
                                               "candidate": [_process(t) for t in cand]}, 1, "cuda")}
    assert speeds["compile"].outcome == "enabled" and speeds["compile"].base_mode == "eager", speeds["compile"]
    cg = speeds["compile+graph"]
    assert cg.outcome == "enabled" and cg.base_mode == "graph" and abs(cg.speedup - 303.2 / 288.0) < 0.01, cg
    assert "PassManager::run failed" in cg.note
    assert speed_rejection(list(speeds.values())) is None
    # compiled but no faster than the base's eager: runs, gains nothing, decides nothing
    same = [dict(t, compile=305.8, **{"compile+graph": 303.3}) for t in cand]
    speeds = {s.mode: s for s in _speeds(ctx, {"base": [_process(t) for t in base],
                                               "candidate": [_process(t) for t in same]}, 1, "cuda")}
    assert speeds["compile"].outcome == "n/a" and speeds["compile+graph"].outcome == "n/a"
    assert speed_rejection(list(speeds.values())) == ("no-change", "faster in no mode")
