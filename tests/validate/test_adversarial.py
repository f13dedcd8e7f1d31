"""The adversarial suite: real candidates (patches against the real diffusers 0.42.1 engine) that
the validator must reject, each with the right reason; and an honest one it must accept.

CPU, tiny preset. The GPU-only cases (side stream, illegal memory access) are marked gpu and run on
the device through benchmarks/gpu_validate.sh. tests/validate/make_patches.py regenerates the
patches."""
from __future__ import annotations

import pytest

from tests.validate.conftest import ADV

CASES = [
    # patch, expected reason, what must be said about it
    ("uninitialized_output.patch", "correctness", "NaN"),
    ("inputs_zeroed.patch", "correctness", "modified its inputs"),
    ("constant_one_seed.patch", "correctness", "output checks fail"),
    ("cached_across_calls.patch", "correctness", "output checks fail"),
    ("shape_specialized.patch", "correctness", "176x240/txt19/b1"),
    ("precision_drop.patch", "correctness", "rel L2"),
    ("hangs.patch", "timeout", "timeout"),
    ("segfault.patch", "crashed", "SIGSEGV"),
    # at exit it sends a forged, complete success (a fused kernel, timings x0.7) into the report
    # channel: the runner's os._exit means the hook never runs, and the no-op patch is what is judged
    ("forged_result.patch", "not-engaged", "identical"),
    ("not_engaged.patch", "not-engaged", "identical"),
]


def _opts(session_seeds, base_cache, **kw):
    from bot.validate import Options

    seeds, wseed = session_seeds
    return Options(seeds=seeds, weight_seed=wseed, speed=False, cache_dir=base_cache, **kw)


@pytest.mark.parametrize("patch,reason,says", CASES, ids=[c[0].removesuffix(".patch") for c in CASES])
def test_adversarial_rejected(flux2_cpu, session_seeds, base_cache, patch, reason, says):
    from bot.validate import validate

    timeout = 30 if reason == "timeout" else 300
    v = validate(flux2_cpu, str(ADV / patch), opts=_opts(session_seeds, base_cache, timeout_s=timeout))
    text = v.render()
    assert v.status == "rejected", text
    assert v.reason == reason, text
    assert says in text, text
    if reason == "correctness":
        assert v.correctness is not None and not v.correctness.ok
    if reason == "correctness" and patch != "inputs_zeroed.patch":
        bad = [c for c in v.correctness.checks if not c.ok]
        assert bad and all(c.at is not None or c.nonfinite for c in bad), text  # says where
    if patch == "shape_specialized.patch":
        # right on the preset's shape it was tuned on; only the untuned extra shape catches it
        tuned = [c for c in v.correctness.checks if c.label.startswith("256x256")]
        other = [c for c in v.correctness.checks if c.label.startswith("176x240")]
        assert tuned and all(c.ok for c in tuned), text
        assert other and not any(c.ok for c in other), text
    if patch == "cached_across_calls.patch":
        # the first seed of each shape is right; the later seeds get the cached output
        first = {c.label.split(" seed")[0]: c for c in reversed(v.correctness.checks)}
        assert all(c.ok for c in first.values()) and not all(c.ok for c in v.correctness.checks), text
    if reason in ("crashed", "timeout"):
        assert v.crash["log"] and v.crash["status"] in ("crashed", "timeout")


def test_a_slowed_clock_is_held(flux2_cpu, session_seeds, base_cache, tmp_path):
    """A candidate that makes time.perf_counter run at half speed in its process: its timings claim
    half the time the bot's own clock saw the timed phase take, so it is held for a person, not
    measured as a 2x win (bot/jobs.clock_check)."""
    from bot.validate import Options, validate

    seeds, wseed = session_seeds
    v = validate(flux2_cpu, str(ADV / "slow_clock.patch"),
                 opts=Options(seeds=seeds, weight_seed=wseed, iters=20, engagement=False, run_dir=tmp_path / "run"))
    text = v.render()
    assert v.status == "held" and v.reason == "implausible", text
    assert "by the bot's clock" in v.implausible and "a clock in the child runs slow" in v.implausible, text


def test_honest_candidate_accepted_on_cpu(flux2_cpu, tmp_path):
    """Merged Q/K/V: correct, engaged (declared kernels seen, replaced ones gone); speed measured in
    interleaved processes and labelled cpu, informational on CPU (DESIGN decision 7)."""
    import json

    from bot.validate import Options, validate
    from bot.validate.verdict import Verdict

    v = validate(flux2_cpu, str(ADV / "honest_merge_qkv.patch"), opts=Options(iters=3, run_dir=tmp_path / "run"))
    text = v.render()
    assert v.status == "accepted", text
    assert v.correctness.ok and len(v.correctness.seeds) >= 3 and len(v.correctness.shapes) >= 2
    assert 0 not in v.correctness.seeds
    assert v.engagement.ok and not v.engagement.missing and not v.engagement.still_present
    assert v.trailers["Optbot-Kind"] == ["merge-siblings"]
    eager = [s for s in v.speed if s.mode == "eager"]
    # CPU speed does not gate: the correctness processes' timings alone, one process a side
    assert eager and eager[0].device == "cpu" and len(eager[0].base_ms) == 1 and len(eager[0].candidate_ms) == 1
    assert not list((tmp_path / "run").rglob("*timing*"))
    assert eager[0].noise_pct is not None and "cpu" in eager[0].note
    assert any("informational" in n for n in v.notes)
    back = Verdict.from_json(json.loads((tmp_path / "run" / "verdict.json").read_text()))
    assert (back.status, back.summary, back.correctness.seeds, back.speed[0].base_ms) == \
        (v.status, v.summary, v.correctness.seeds, v.speed[0].base_ms)



def test_fp8_candidate_that_adds_error_is_rejected_against_the_unquantized_model(session_seeds, base_cache,
                                                                                  diffusers_engine):
    """At a quantized precision two correct outputs may be far apart (FP8 turns last-bit differences
    into different e4m3 codes), so the validator also measures each output against the unquantized
    model: no farther than the quantized base (bot/tolerance.py NO_FARTHER). The candidate keeps the
    SwiGLU activation in float8 with a fixed 1/1024 scale, so most values fall into e4m3's subnormals:
    rejected, and the unquantized checks alone would reject it (each is several times the base's
    distance), whatever bound the precision sets against the quantized base."""
    from bot.target import resolve_target
    from bot.validate import validate

    target = resolve_target("flux2", None, None, "tiny", "cpu", quant="fp8")
    v = validate(target, str(ADV / "fp8_activation_in_fp8.patch"), opts=_opts(session_seeds, base_cache))
    text = v.render()
    assert v.status == "rejected" and v.reason == "correctness", text
    ref = [c for c in v.correctness.checks if c.against == "unquantized"]
    assert len(ref) == 6 and not any(c.ok for c in ref), text
    assert all(c.rel_l2 > 2 * c.base_rel_l2 for c in ref), text
    assert "farther" in text and "[vs unquantized]" in text and "base's" in text, text
    assert "no farther from the unquantized model than 1.05x the quantized base" in v.correctness.rule
