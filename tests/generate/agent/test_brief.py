"""What the agent is told about its target (bot/generate/agent/brief.py, prompts.py, tools.read_profile_text),
on a real analysis: the toy DiT of tests/analyze (captured graph, CPU profile, fixed peaks) and the
knowledge that ships with optbot (kernel_store/, lessons/)."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from bot.generate.agent import prompts
from bot.generate.agent.brief import build_brief, for_task, instance_prefix
from bot.generate.agent.tools import read_profile_text
from bot.knowledge.lessons import load_lesson
from bot.paths import REPO_ROOT
from bot.workload import load_workload

STORE, LESSONS = REPO_ROOT / "kernel_store", REPO_ROOT / "lessons"
BYTES = {"f32": 4, "bf16": 2}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(analysis, graph, profile, graph.json path) of a 3-block toy DiT, captured and profiled once."""
    import torch

    from tests.analyze.toy_helpers import run_toy
    from tests.analyze.toy_models import Contraption, inputs

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("toy")
    analysis, graph = run_toy(Contraption(n=3), [inputs()], d)
    return analysis, graph, json.loads((d / "profile.json").read_text()), d / "graph.json"


def _opp(analysis, kind, detail=None, n_out=None):
    """The first opportunity of that kind (and detail, and GEMM widths): opportunities are ranked by a CPU
    profile's timings, so where two of a kind exist the test names the one it means."""
    return next(o for o in analysis["opportunities"] if o["kind"] == kind and (detail is None or o["detail"] == detail)
                and (n_out is None or o["facts"].get("n_out") == n_out))


def _qkv(analysis):
    """The toy's Q/K/V projections (three [32, 32] Linears on one input), not the blocks' modulation
    Linears, which share the time embedding and rank above or below it by the profile's noise."""
    return _opp(analysis, "merge-siblings", "shared-input-gemms", n_out=[32, 32, 32])


def test_instance_prefix():
    assert instance_prefix("transformer_blocks.*.attn.to_q", "transformer_blocks.3.attn.to_q") == "transformer_blocks.3"
    assert instance_prefix("stack_of.*", "stack_of.0") == "stack_of.0"
    assert instance_prefix("words", "words") is None


def test_many_op_ids_keep_gain_estimate_and_facts(toy):
    """An opportunity with 1,440 op ids (FLUX.2's largest) no longer pushes its gain, estimate and facts
    out of the first message: the ids are summarized, everything else is in full."""
    analysis, graph, profile, _ = toy
    opp = json.loads(json.dumps(_opp(analysis, "fuse-norm-consumer")))
    real = list(opp["op_ids"])
    opp["op_ids"] = real + list(range(len(graph.ops), len(graph.ops) + 1440 - len(real)))  # ids past the graph
    assert len(json.dumps(opp, indent=1)) > 8000  # what the old message cut at 8,000 characters
    msg = prompts.task_message("fuse", build_brief(opp, graph=graph, profile=profile), {"workload": "toy"})
    assert f"{opp['gain_ms']:.5f} ms per step" in msg and f"{opp['gain_pct']:.3f}%" in msg
    assert opp["estimate"]["basis"] in msg and opp["estimate"]["profile_device"] in msg
    assert opp["confidence_reason"] in msg
    facts = json.dumps(opp["facts"], indent=1, default=str, sort_keys=True)
    assert facts in msg
    assert "Graph op ids: 1440 in all" in msg and str(opp["op_ids"][-1]) not in msg
    assert opp["location"]["module_pattern"] in msg and opp["location"]["call_site"] in msg


def test_graph_slice_has_shapes_scalars_and_engine_lines_of_the_norm(toy):
    """The slice of one instance of the hand-written RMSNorm (toy_models.Squash): its ops with shapes,
    dtypes, the eps argument and the engine line, and only the first block's ops."""
    analysis, graph, profile, _ = toy
    opp = _opp(analysis, "attention-waste", "qk-norm-rope")
    b = build_brief(opp, graph=graph, profile=profile)
    assert b.instance == "stack_of.0" and b.slice
    assert all(s.module == "stack_of.0" or s.module.startswith("stack_of.0.") for s in b.slice)
    assert len(b.instance_op_ids) * opp["location"]["instances"] == len(opp["op_ids"])
    eps = [s for s in b.slice if s.op == "aten::add" and s.module == "stack_of.0.sq_r"]
    assert eps and eps[0].scalars == {"other": 1e-06}
    q = graph.values[graph.ops[eps[0].id].inputs[0]]
    assert eps[0].inputs[0].shape == tuple(q["shape"]) and eps[0].inputs[0].dtype == "f32"
    text = b.render()
    assert '{"other": 1e-06}' in text and "f32[1, 24, 2, 16]" in text
    assert "toy_models.py:18" in text  # the engine line of the rsqrt(mean(x^2) + eps)
    assert "non-contiguous" in text  # the transposes into attention are views with strides of their own


def test_own_kernels_reach_read_profile_however_low_they_rank(toy):
    analysis, graph, profile, _ = toy
    opp = _opp(analysis, "attention-waste", "qk-norm-rope")
    b = build_brief(opp, graph=graph, profile=profile)
    top = 5
    out = json.loads(read_profile_text(profile, top, b.kernels))
    top_keys = {(k["name"], k["module"]) for k in out["kernels"]}
    own = {(k["name"], k["module"]) for k in out["opportunity_kernels"]}
    for i in b.instance_op_ids:  # every non-view op of the instance has its rows
        o = graph.ops[i]
        if not o.alias:
            assert any(m == o.module and n.split("::")[-1] == o.name for n, m in own), o.op
    assert own - top_keys, "the test needs rows of the opportunity outside the top"
    ranks = {(k["name"], k["module"]): r for r, k in enumerate(profile["kernels"])}
    assert max(ranks[k] for k in own) > top
    # the attributed times add up to what cost.py put on the opportunity's ops
    from bot.analyze.cost import attribute
    cost = attribute(graph, profile)
    assert math.isclose(sum(k["attributed_ms"] for k in out["opportunity_kernels"]), cost.ms(opp["op_ids"]),
                        rel_tol=1e-3)


def test_roofline_is_computed_from_the_shapes(toy):
    """Three sibling Linear layers [1, 24, 32] x [32, 32] (+ bias): FLOPs and bytes recomputed here
    from the slice's shapes, over the profile's peaks (copy 20 GB/s, matmul 0.2 TFLOP/s)."""
    analysis, graph, profile, _ = toy
    b = build_brief(_qkv(analysis), graph=graph, profile=profile)
    r = b.roofline
    assert r is not None and (r.copy_gbps, r.matmul_tflops) == (20.0, 0.2)
    flops = nbytes = 0
    for s in b.slice:
        a, w = s.inputs[0].shape, s.inputs[1].shape
        flops += 2 * math.prod(s.outputs[0].shape) * a[-1]
        assert w[1] == a[-1]
        nbytes += sum(math.prod(t.shape) * BYTES[t.dtype] for t in s.inputs + s.outputs)
    assert len(b.slice) == 3 and flops == 3 * 2 * 24 * 32 * 32 == r.flops
    assert nbytes == r.unfused_bytes
    assert math.isclose(r.unfused_ms, nbytes / 20e9 * 1e3) and math.isclose(r.flops_ms, flops / 0.2e12 * 1e3)
    assert r.fused_bytes < r.unfused_bytes  # the shared input is read once
    assert r.bound_ms == max(r.fused_ms, r.flops_ms)
    assert "matmul 0.2 TFLOP/s, copy 20 GB/s" in b.render()


def test_tolerance_is_stated_for_the_dtype():
    wl = load_workload("flux2")
    t = wl.tolerance["bfloat16"]
    text = build_brief({"id": "x", "kind": "fuse-norm-consumer"}, workload=wl, dtype="bfloat16").render()
    assert f"<= {t.rel_l2:g}" in text and f"{t.atol:g} + {t.rtol:g} * |ref|" in text and "bfloat16" in text
    exact = dataclasses.replace(wl, bit_exact=True)
    assert "must be bit-exact" in build_brief({"id": "x", "kind": "k"}, workload=exact, dtype="float32").render()


def test_worked_examples_are_whole_store_entries_ranked_by_pattern():
    text = prompts.knowledge_block("fuse-norm-consumer", "diffusers", "h200", "flux2", lessons_dir=LESSONS,
                                   store_dir=STORE)
    from bot.knowledge.store import get_entry

    entry = STORE / "flux2-norm-modulate"
    for f in ("norm_modulate.py", "test_norm_modulate.py"):
        assert (entry / f).read_text().rstrip() in text, f
    assert prompts.example_patch(get_entry("flux2-norm-modulate", STORE)) in text
    first = text.index("### Worked example:")
    assert text[first:].startswith("### Worked example: store entry flux2-norm-modulate")


def test_knowledge_budget_keeps_whole_items_and_names_the_rest():
    from bot.knowledge.store import get_entry

    def block(n):
        return prompts.knowledge_block("attention-waste", "diffusers", "h200", "flux2", lessons_dir=LESSONS,
                                       store_dir=STORE, max_chars=n)

    big, small = block(prompts.KNOWLEDGE_CHARS), block(20_000)
    left_line = small[small.index("Left out for space"):]
    assert len(small) - len(left_line) <= 20_000
    ranked = [e.id for e in prompts.worked_examples("attention-waste", "diffusers", "flux2", STORE)]
    assert ranked[:2] == ["flux2-qk-rmsnorm-rope", "flux2-qkv-norm-rope-epilogue"]  # pattern, engine, workload
    for name in ranked:
        # an entry is in whole, or named as left out: never cut
        kernel = prompts.example_patch(get_entry(name, STORE))
        for text in (small, big):
            left = text[text.index("Left out for space"):] if "Left out for space" in text else ""
            assert (kernel in text) != (f"store entry {name} (" in left), name
    # the best-ranked example is in whole at the full budget; which of the next ones fit moves with the
    # shipped lessons' and entries' sizes (the 71 KB qkv epilogue entry is named, not cut, once lessons
    # fill the room it needs), and whole-or-named above holds for every one
    assert get_entry(ranked[0], STORE).kernel_files()[0].read_text().rstrip() in big
    # lessons rank first: the best-ranked lessons are in whole before any worked example (which lesson
    # that is moves as lessons are added: the shipped lessons dir is the input)
    ranked_lessons = prompts.agent_lessons("", "attention-waste", "diffusers", "h200", LESSONS)
    assert ranked_lessons and ranked_lessons[0].body in small
    assert small.index(ranked_lessons[0].body) < small.index("## Worked examples") if "## Worked examples" in small else True


def test_a_worked_example_names_the_kernel_file_its_patch_adds_instead_of_repeating_it(tmp_path):
    import shutil

    from bot.knowledge.store import get_entry, load_entry

    e = get_entry("flux2-swiglu", STORE)
    shown = prompts.example_patch(e)
    assert "diff --git a/src/diffusers/models/optbot_kernels/swiglu.py" in shown
    assert "(a new file: the text of swiglu.py above)" in shown
    assert "transformer_flux2.py" in shown and "def swiglu" not in shown  # the engine edits stay whole
    assert len(shown) < len(e.patch_path.read_text()) / 2
    # a patch that adds a different text under the kernel's name is shown whole
    d = tmp_path / e.id
    shutil.copytree(e.path, d)
    (d / "swiglu.py").write_text((d / "swiglu.py").read_text() + "# edited after the patch was made\n")
    assert prompts.example_patch(load_entry(d)) == load_entry(d).patch_path.read_text().rstrip()


def test_cpu_correctness_lesson_reaches_a_cuda_prompt_speed_lessons_stay_on_their_hardware():
    """The shipped lessons: a CPU correctness lesson (pattern: any) reaches an H200 prompt; an H200
    speed verdict (flux2-merge-qkv's no-change caveat, written by `store record-bench`) reaches the
    H200 prompt of its pattern and not the CPU one."""
    cpu_lesson = load_lesson(LESSONS / "fallback-must-replay-the-unfused-ops.md")
    assert cpu_lesson.applies_to["hardware"] == "cpu" and not prompts.is_speed_lesson(cpu_lesson)
    gpu = prompts.knowledge_block("merge-siblings", "diffusers", "h200", "flux2", lessons_dir=LESSONS,
                                  store_dir=STORE)
    assert cpu_lesson.body in gpu
    speed = load_lesson(LESSONS / "flux2-merge-qkv-on-h200-flux2.md")
    assert prompts.is_speed_lesson(speed)
    assert speed.body in gpu
    cpu = prompts.knowledge_block("merge-siblings", "diffusers", "cpu", "flux2", lessons_dir=LESSONS,
                                  store_dir=STORE)
    assert speed.body not in cpu and cpu_lesson.body in cpu
    fault = load_lesson(LESSONS / "user-triton-kernels-must-not-write-views-under-compile.md")  # h200, a fault
    assert fault.body in cpu
    slugs = [le.slug for le in prompts.agent_lessons("", "fuse-norm-consumer", "diffusers", "h200", LESSONS)]
    assert "fallback-must-replay-the-unfused-ops" in slugs


def test_for_task_reads_the_runs_graph_and_target(toy, make_task):
    analysis, graph, profile, graph_file = toy
    opp = _qkv(analysis)
    task = dataclasses.replace(make_task(), opportunity=opp, profile=profile, graph_file=str(graph_file))
    b = for_task(task)
    assert b.workload == "flux2" and b.dtype == "float32" and b.tolerance and len(b.slice) == 3
    assert b.kernels and b.roofline is not None
    bare = for_task(dataclasses.replace(task, graph_file=None))
    assert not bare.slice and "no captured graph" in bare.render() and "0.85" in bare.render()


def test_graph_file_of_the_run(toy, tmp_path):
    """The step that starts the agent finds the graph through the run's analysis.full.json."""
    from bot.generate.agent.brief import graph_file_of

    *_, graph_file = toy
    assert graph_file_of(tmp_path) is None
    (tmp_path / "analysis.full.json").write_text(json.dumps({"meta": {"graph_file": str(graph_file)}}))
    assert graph_file_of(tmp_path) == str(graph_file)
    (tmp_path / "analysis.full.json").write_text(json.dumps({"meta": {"graph_file": str(tmp_path / "gone.json")}}))
    assert graph_file_of(tmp_path) is None
