"""bot/validate/engagement.py: does the change run in the step?"""
from __future__ import annotations

from pathlib import Path

from bot.validate.engagement import check_engagement, declared_matches
from bot.validate.resolve import Revision


def test_declared_kernel_matching():
    e = ("aten::linear", "aten::linear", "transformer_blocks.*.attn.to_qkv")
    assert declared_matches("attn.to_qkv", e)
    assert not declared_matches("attn.to_qkv", ("aten::linear", "aten::linear", "single.*.attn.to_qkv_mlp_proj"))
    assert not declared_matches("attn.to_q", e)
    assert declared_matches("fused_rms", ("triton_red_fused_rms_norm_0", "", ""))
    # scoped: the SiLU inside SwiGLU, not the one in the modulation MLP
    assert declared_matches("aten::silu@*gate_fn", ("aten::silu", "aten::silu", "transformer_blocks.0.ff.act_fn.gate_fn"))
    assert not declared_matches("aten::silu@*gate_fn", ("aten::silu", "aten::silu", "double_stream_modulation_img.act_fn"))
    assert not declared_matches("aten::gelu@*gate_fn", ("aten::silu", "aten::silu", "blocks.0.gate_fn"))
    # a scoped added kernel: launched by the single-stream processor itself (flux2-swiglu's concatenation
    # path), not by the module it replaces there, and not by a double-stream block
    single = "_swiglu_kernel@single_transformer_blocks.*.attn"
    assert declared_matches(single, ("_swiglu_kernel", "", "single_transformer_blocks.*.attn"))
    assert not declared_matches(single, ("_swiglu_kernel", "", "single_transformer_blocks.*.attn.mlp_act_fn"))
    assert not declared_matches("_swiglu_kernel@transformer_blocks.*.act_fn",
                                ("_swiglu_kernel", "", "single_transformer_blocks.*.attn.mlp_act_fn"))
    assert declared_matches("_swiglu_kernel@transformer_blocks.*.act_fn",
                            ("triton::_swiglu_kernel", "", "transformer_blocks.*.ff_context.act_fn"))


def _rev(trailers) -> Revision:
    return Revision("x", "c" * 40, "b" * 40, Path("."), [], trailers)


def test_engagement_rules():
    base = {"histogram": [["aten::linear", "aten::linear", "blocks.*.attn.to_q", 2],
                          ["aten::linear", "aten::linear", "blocks.*.attn.to_k", 2]]}
    same = check_engagement(_rev({}), base, base)
    assert not same.ok and "identical" in same.reason
    cand = {"histogram": [["aten::linear", "aten::linear", "blocks.*.attn.to_qkv", 2]]}
    changed = check_engagement(_rev({}), base, cand)
    assert changed.ok and len(changed.changed_ops) == 3, changed
    # every module whose counts differ (the report's "What is left" reads them), and each side's time by category
    assert changed.changed_modules == ["blocks.*.attn.to_k", "blocks.*.attn.to_q", "blocks.*.attn.to_qkv"]
    assert same.changed_modules == []  # identical: nothing changed anywhere
    timed = check_engagement(_rev({}), {**base, "categories": {"gemm": 2.123456}}, {**cand, "categories": {"gemm": 1.5}})
    assert timed.base_categories == {"gemm": 2.1235} and timed.candidate_categories == {"gemm": 1.5}
    ok = check_engagement(_rev({"Optbot-Adds-Kernels": ["attn.to_qkv"], "Optbot-Removes-Kernels": ["attn.to_k"]}), base, cand)
    assert ok.ok, ok.reason
    # a declared kernel that does not run is not excused by other counts that changed
    missing = check_engagement(_rev({"Optbot-Adds-Kernels": ["my_triton_kernel"]}), base, cand)
    assert not missing.ok and missing.missing == ["my_triton_kernel"]
    kept = check_engagement(_rev({"Optbot-Removes-Kernels": ["attn.to_k"]}), base, base)
    assert not kept.ok and kept.still_present == ["attn.to_k"]


def test_no_profile_is_not_engaged():
    e = check_engagement(_rev({"Optbot-Adds-Kernels": ["k"]}), None, {"histogram": []})
    assert not e.ok and "no profile" in e.reason and e.declared_adds == ["k"]


def test_a_change_that_only_lets_a_mode_run_is_engaged_there():
    """sglang-fp8-quant-compile changes nothing SGLang runs eagerly (its eager histogram is the
    base's) and lets the compiled modes build where the base's fail: engaged, by those modes. A mode
    that failed for both sides, or one the base ran, engages nothing."""
    from bot.validate.engagement import enabled_modes

    prof = {"histogram": [["_static_quant_fp8", "", "blocks.*.attn.to_qkv", 2]]}
    err = "InductorError: RuntimeError: PassManager::run failed"
    base = {"timing": {"eager": {"median_ms": 305.7}, "graph": {"median_ms": 303.2}, "compile": err, "compile+graph": err}}
    cand = {"timing": {"eager": {"median_ms": 305.6}, "graph": {"median_ms": 303.1}, "compile": {"median_ms": 290.0},
                       "compile+graph": err}}
    assert enabled_modes(base, cand) == ["compile"]
    e = check_engagement(_rev({}), prof, prof, enabled_modes(base, cand))
    assert e.ok and "runs compile, where the base fails" in e.reason, e.reason
    assert enabled_modes(base, base) == [] and not check_engagement(_rev({}), prof, prof, enabled_modes(base, base)).ok
    assert enabled_modes(cand, base) == []  # the candidate broke compile: not engagement (the crash rule's case)
