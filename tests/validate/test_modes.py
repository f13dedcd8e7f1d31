"""Validation in every production mode (issue 20): a candidate is checked and timed in each mode the
validator is given, and a mode that breaks only for the candidate rejects it with the mode and the
error. CPU, tiny preset, torch.compile with the aot_eager backend: dynamo tracing, fake tensors and
AOT autograd are the real ones; only inductor's code generation is left to the GPU runs
(benchmarks/gpu_validate.sh), where the modes are eager, graph, compile, compile+graph by default."""
from __future__ import annotations

from tests.validate.conftest import ADV

MODES = ("eager", "compile")


def _opts(tmp_path, session_seeds, **kw):
    from bot.validate import Options

    seeds, wseed = session_seeds
    return Options(seeds=seeds[:2], weight_seed=wseed, modes=MODES, compile_backend="aot_eager", iters=2, warmup=1,
                   run_dir=tmp_path / "run", **kw)


def test_a_candidate_that_crashes_only_when_compiled_is_rejected_with_the_mode(flux2_cpu, session_seeds, tmp_path):
    """A registered op with a wrong fake: eager never calls the fake and is right; torch.compile traces
    with it and fails. The verdict names the mode and the error."""
    from bot.validate import validate

    v = validate(flux2_cpu, str(ADV / "compile_only_crash.patch"), opts=_opts(tmp_path, session_seeds))
    text = v.render()
    assert v.status == "rejected" and v.reason == "crashed", text
    assert v.summary.startswith("crashed under compile: "), text
    assert v.crash["mode"] == "compile" and v.crash["status"] == "mode failed", text


def test_a_candidate_wrong_only_when_compiled_fails_correctness_in_that_mode(flux2_cpu, session_seeds, tmp_path):
    from bot.validate import validate

    v = validate(flux2_cpu, str(ADV / "compile_only_wrong.patch"), opts=_opts(tmp_path, session_seeds))
    text = v.render()
    assert v.status == "rejected" and v.reason == "correctness", text
    bad = [c for c in v.correctness.checks if not c.ok]
    assert bad and all(c.label.endswith("[compile]") for c in bad), text  # eager is exact
    assert any(c.label.endswith("[compile]") for c in v.correctness.checks if c.ok) is False


def test_a_candidate_wrong_on_a_shape_it_ran_before_another_fails_its_eager_mode_check(flux2_cpu, session_seeds,
                                                                                        tmp_path):
    """A model that compiles itself in __init__ runs its first shape, once the correctness runs have
    seen the second, under a graph recompiled for both. Here that graph is wrong: every correctness
    run is right; the eager mode's outputs, made after them, are compared too and are not."""
    from bot.validate import validate

    v = validate(flux2_cpu, str(ADV / "wrong_on_a_shape_seen_again.patch"), opts=_opts(tmp_path, session_seeds))
    text = v.render()
    assert v.status == "rejected" and v.reason == "correctness", text
    runs = [c for c in v.correctness.checks if not c.label.endswith("]")]
    assert runs and all(c.ok for c in runs), text  # each shape right the first time it runs
    bad = {c.label.rsplit("[", 1)[-1] for c in v.correctness.checks if not c.ok}
    assert bad == {"eager]", "compile]"}, text


def test_an_honest_candidate_is_checked_and_timed_in_every_mode(flux2_cpu, session_seeds, tmp_path):
    from bot.validate import validate

    v = validate(flux2_cpu, str(ADV / "honest_merge_qkv.patch"), opts=_opts(tmp_path, session_seeds))
    text = v.render()
    assert v.status == "accepted", text
    assert [s.mode for s in v.speed] == list(MODES), text
    for s in v.speed:
        assert s.device == "cpu" and len(s.base_ms) == 1 and len(s.candidate_ms) == 1 and s.speedup, text
    compiled = [c for c in v.correctness.checks if c.label.endswith("[compile]")]
    assert compiled and all(c.ok for c in compiled), text
    eager = [c for c in v.correctness.checks if c.label.endswith("[eager]")]  # made after every shape ran
    assert eager and all(c.ok for c in eager), text
    assert "compile" in text  # the rendered verdict shows every mode


def test_speed_rejection_rules():
    """Which mode decides: a candidate-only failure, then any slower mode, then no faster mode."""
    from bot.validate.speed import speed_rejection
    from bot.validate.verdict import Speed

    def s(mode, outcome, speedup=1.0, note=""):
        return Speed(mode=mode, device="cuda", outcome=outcome, speedup=speedup, note=note)

    assert speed_rejection([s("eager", "faster", 1.2), s("compile", "no-change")]) is None
    assert speed_rejection([s("eager", "faster", 1.2), s("compile", "slower", 0.95)]) == \
        ("slower", "slower under compile (0.950x)")  # a user who compiles would lose
    assert speed_rejection([s("eager", "no-change"), s("graph", "n/a", None, "base: capture failed")]) == \
        ("no-change", "faster in no mode")
    assert speed_rejection([s("eager", "faster", 1.3), s("compile+graph", "failed", None, "candidate: illegal")]) == \
        ("crashed", "crashed under compile+graph: candidate: illegal")
    assert speed_rejection([s("eager", "no-change"), s("graph", "faster", 1.1)]) is None
    # a graph mode only the candidate captures, faster than the base without the graph: a gain
    assert speed_rejection([s("eager", "no-change"), s("graph", "enabled", 1.03), s("compile", "no-change")]) is None


def test_a_mode_only_the_candidate_runs_is_compared_with_what_a_user_of_the_base_runs():
    """The pairs the compare job gets: same mode where the base ran it; where the base could not
    capture (Qwen-Image's host copy), the candidate's graph outputs against the base's eager ones
    and its compile+graph outputs against the base's compile ones; where the base ran neither the
    mode nor its uncaptured or uncompiled form, against eager (speed.base_fallbacks). Without these a candidate that
    "enables" a mode would be credited with its speed there and checked in it by nothing
    (tests/validate/test_gpu.py runs gpu_graph_only_wrong.patch, wrong only inside a graph)."""
    from bot.validate.correctness import mode_pairs

    pairs = mode_pairs("64x64/txt8/b1 seed 7", "base/run0.pt", {"compile": "base/mode_compile.pt"},
                       {"graph": "cand/mode_graph.pt", "compile": "cand/mode_compile.pt",
                        "compile+graph": "cand/mode_compile_graph.pt", "compile:whole+graph": "cand/w.pt"})
    assert pairs == [
        {"label": "64x64/txt8/b1 seed 7 [graph; base eager]", "base": "base/run0.pt", "candidate": "cand/mode_graph.pt"},
        {"label": "64x64/txt8/b1 seed 7 [compile]", "base": "base/mode_compile.pt", "candidate": "cand/mode_compile.pt"},
        {"label": "64x64/txt8/b1 seed 7 [compile+graph; base compile]", "base": "base/mode_compile.pt",
         "candidate": "cand/mode_compile_graph.pt"},
        {"label": "64x64/txt8/b1 seed 7 [compile:whole+graph; base eager]", "base": "base/run0.pt",
         "candidate": "cand/w.pt"},
    ]  # compile:whole+graph: the base ran neither compile:whole nor graph, so its user runs eager


def test_a_compiled_output_against_an_eager_base_is_judged_by_the_bound_across_modes():
    """Where the workload gives a bound for outputs of two modes (flux2's SGLang FP8: inductor's own
    rewrite of the FP8 model moves the step by rel L2 0.083 on an H100, beyond half the recipe's own
    error), a candidate's compiled output judged against the base's eager one carries that bound; a
    pair within one mode, or across a graph capture only (the same arithmetic), keeps the workload's."""
    from bot.validate.correctness import mode_pairs

    across = {"rel_l2": 0.095, "atol": 0.49, "rtol": 0.1}
    pairs = mode_pairs("s", "base/run0.pt", {"graph": "base/g.pt"},
                       {"graph": "cand/g.pt", "compile": "cand/c.pt", "compile+graph": "cand/cg.pt"}, across)
    assert [(p["label"], p.get("tolerance")) for p in pairs] == [
        ("s [graph]", None), ("s [compile; base eager]", across), ("s [compile+graph; base graph]", across)]
    pairs = mode_pairs("s", "base/run0.pt", {"compile": "base/c.pt"}, {"compile+graph": "cand/cg.pt"}, across)
    assert pairs == [{"label": "s [compile+graph; base compile]", "base": "base/c.pt", "candidate": "cand/cg.pt"}]


def test_the_compare_job_applies_a_pairs_own_bound(tmp_path):
    """runner/kinds/compare.py: one pair's own tolerance, the job's for the others; the same
    difference fails the one and passes the other, and the looser bound still fails an output that
    is wrong (the sign flipped)."""
    import torch

    from runner.kinds import compare

    b = torch.ones(64)
    c = b.clone()
    c[::2] += 0.2  # rel L2 0.141
    torch.save({"x": b}, tmp_path / "b.pt")
    torch.save({"x": c}, tmp_path / "c.pt")
    torch.save({"x": -b}, tmp_path / "wrong.pt")  # a kernel wrong only in the compiled mode: far past either bound

    class Job:
        params = {"bit_exact": False, "tolerance": {"rel_l2": 0.05, "atol": 0.25, "rtol": 0.1},
                  "pairs": [{"label": "within", "base": str(tmp_path / "b.pt"), "candidate": str(tmp_path / "c.pt")},
                            {"label": "across", "base": str(tmp_path / "b.pt"), "candidate": str(tmp_path / "c.pt"),
                             "tolerance": {"rel_l2": 0.15, "atol": 0.25, "rtol": 0.1}},
                            {"label": "across, wrong", "base": str(tmp_path / "b.pt"),
                             "candidate": str(tmp_path / "wrong.pt"), "tolerance": {"rel_l2": 0.15, "atol": 0.25, "rtol": 0.1}}]}

    checks = {c["label"]: c for c in compare.run(Job())["checks"]}
    assert checks["within"]["ok"] is False and "rel L2" in checks["within"]["reason"]
    assert checks["across"]["ok"] is True
    assert checks["across, wrong"]["ok"] is False


def _split_by_a_print():
    """A module dynamo must split in two: a host call between two ops."""
    import torch

    class Split(torch.nn.Module):
        def forward(self, x):
            x = x.sin()
            print("a host call dynamo cannot trace")  # the break
            return x.cos()

    return Split()


def test_a_compiled_step_reports_its_graphs_and_graph_breaks():
    """runner/modes.compile_report: a compile recipe counts dynamo's graphs and records each graph
    break with where (the user code's file:line) and why; `optbot profile --mode compile*` prints it
    (bot/profile_report.compile_lines). Inductor fuses nothing across a break: SGLang's FP8 FLUX.2
    compiled whole kept its quantization as a kernel of its own (2026-12-06). A second recipe starts
    the count again."""
    import torch

    from bot.profile_report import compile_lines
    from runner.modes import compile_model, compile_report, uncompile

    m = _split_by_a_print()
    compile_model(m, "whole", backend="aot_eager")
    x = torch.randn(8)
    torch.testing.assert_close(m(x), x.sin().cos())
    r = compile_report()
    assert r["graphs"] == 2 and r["breaks"] == 1, r
    top = r["top"][0]
    assert top["count"] == 1 and "test_modes.py:" in top["at"] and "print" in top["why"], r
    lines = compile_lines({"compile_report": r})
    assert lines[0] == "compiled: 2 graph(s), 1 graph break(s)" and "test_modes.py" in lines[1]
    uncompile(m)

    class Whole(torch.nn.Module):
        def forward(self, x):
            return x.sin().cos()

    w = Whole()
    compile_model(w, "whole", backend="aot_eager")
    w(x)
    assert compile_report() == {"graphs": 1, "breaks": 0, "top": []}
    assert compile_lines({"compile_report": None}) == [] and compile_lines({}) == []


def test_a_candidate_that_adds_graph_breaks_is_reported_in_its_compiled_modes(flux2_cpu, session_seeds, tmp_path):
    """A correct SwiGLU that reads a value back to the host breaks dynamo's graph in every block:
    under compile the verdict's speed line for that mode says the candidate adds graph breaks and
    where most of them are (bot/validate/speed.added_breaks, from runner/modes.compile_report)."""
    from bot.validate import validate
    from bot.validate.speed import added_breaks

    v = validate(flux2_cpu, str(ADV / "graph_break_swiglu.patch"), opts=_opts(tmp_path, session_seeds))
    text = v.render()
    assert v.status == "accepted", text  # correct and engaged; on the CPU speed does not gate
    (comp,) = [s for s in v.speed if s.mode == "compile"]
    assert "the candidate adds graph breaks under compile (base 0, candidate" in comp.note, text
    assert "transformer_flux2.py:" in comp.note, text
    (eager,) = [s for s in v.speed if s.mode == "eager"]
    assert "graph breaks" not in eager.note
    same = {"graphs": {"graphs": 2, "breaks": 1, "top": [{"at": "m.py:3", "why": "x", "count": 1}]}}
    assert added_breaks("compile", same, same) == "" and added_breaks("compile", {}, same) == ""
    more = {"graphs": {"graphs": 3, "breaks": 2, "top": [{"at": "m.py:3", "why": "x", "count": 2}]}}
    assert added_breaks("compile", same, more) == ("the candidate adds graph breaks under compile (base 1, "
                                                   "candidate 2; most at m.py:3: x)")


def test_a_users_torch_logs_is_left_as_set(monkeypatch):
    """A user who debugs with TORCH_LOGS keeps what they asked for: the compile report does not replace
    it, and says so where that leaves graph breaks unrecorded (breaks None)."""
    import torch

    from bot.profile_report import compile_lines
    from runner.modes import compile_model, compile_report, uncompile

    monkeypatch.setenv("TORCH_LOGS", "recompiles")

    m = _split_by_a_print()
    compile_model(m, "whole", backend="aot_eager")
    m(torch.randn(8))
    r = compile_report()
    assert r["graphs"] == 2 and r["breaks"] is None, r
    assert compile_lines({"compile_report": r}) == [
        "compiled: 2 graph(s), graph breaks not recorded (TORCH_LOGS without graph_breaks)"]
    uncompile(m)


def test_an_fp8_candidate_that_adds_error_only_when_compiled_is_judged_against_the_unquantized_model_there(
        session_seeds, tmp_path):
    """A quantized precision's second condition (no farther from the unquantized model than the quantized
    base, bot/tolerance.py NO_FARTHER) is measured in every mode, not only eager's: the candidate's
    compiled output against the unquantized model, beside the base's compiled one.
    fp8_compile_only_error.patch keeps the activation in float8 with a fixed scale when compiled only
    (tests/validate/test_adversarial.py's fp8_activation_in_fp8 in eager): eager is the base's, the
    compiled output fails both conditions."""
    from bot.target import resolve_target
    from bot.validate import validate

    target = resolve_target("flux2", None, None, "tiny", "cpu", quant="fp8")
    v = validate(target, str(ADV / "fp8_compile_only_error.patch"), opts=_opts(tmp_path, session_seeds))
    text = v.render()
    assert v.status == "rejected" and v.reason == "correctness", text
    bad = sorted(c.label.split(" seed ")[1].split(" ", 1)[1] for c in v.correctness.checks if not c.ok)
    assert bad == ["[compile]", "[compile] [vs unquantized]"], text  # eager: the base's outputs
    far = next(c for c in v.correctness.checks if c.label.endswith("[compile] [vs unquantized]"))
    assert far.against == "unquantized" and far.rel_l2 > 1.05 * far.base_rel_l2, text
