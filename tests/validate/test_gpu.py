"""GPU-only adversarial cases (skipped without CUDA; run by benchmarks/gpu_validate.sh on the H200).

tiny preset on cuda, bf16 tolerance, speed gates on (as on any GPU run). With OPTBOT_GPU_VALIDATE_OUT
set, each verdict is appended to $OPTBOT_GPU_VALIDATE_OUT/gpu-adversarial.json as evidence."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.validate.conftest import ADV

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def flux2_cuda(diffusers_engine):
    from bot.target import resolve_target

    return resolve_target("flux2", None, None, "tiny", "cuda")


def _record(name: str, v) -> None:
    out = os.environ.get("OPTBOT_GPU_VALIDATE_OUT")
    if not out:
        return
    f = Path(out) / "gpu-adversarial.json"
    data = json.loads(f.read_text()) if f.is_file() else {}
    data[name] = {"status": v.status, "reason": v.reason, "summary": v.summary, "health": v.health,
                  "speed": [s.__dict__ for s in v.speed], "env": v.env}
    f.write_text(json.dumps(data, indent=2, default=str))


def _validate(target, patch, **kw):
    from bot.validate import Options, validate

    v = validate(target, str(ADV / patch), opts=Options(iters=kw.pop("iters", 20), **kw))
    _record(patch.removesuffix(".patch"), v)
    print(v.render())
    return v


def test_side_stream_is_not_accepted(flux2_cuda):
    """Work hidden on a side stream: either its unfinished output fails correctness, or (all streams
    synchronized, wall clock counted) it is not faster."""
    v = _validate(flux2_cuda, "gpu_side_stream.patch")
    assert v.status == "rejected", v.render()
    assert v.reason in ("correctness", "slower", "no-change"), v.render()


def test_illegal_memory_access_is_crashed_and_device_probed(flux2_cuda):
    v = _validate(flux2_cuda, "gpu_illegal_address.patch", speed=False)
    assert v.status == "rejected" and v.reason == "crashed", v.render()
    assert v.health, "a health probe must run after a GPU fault"


def test_uninitialized_output_on_cuda(flux2_cuda):
    v = _validate(flux2_cuda, "uninitialized_output.patch", speed=False)
    assert v.status == "rejected" and v.reason == "correctness", v.render()


def test_honest_candidate_correct_and_engaged_on_cuda(flux2_cuda):
    """On the tiny preset the speed may be inside the noise (then: rejected no-change, which is
    right); what must hold is correctness and engagement."""
    v = _validate(flux2_cuda, "honest_merge_qkv.patch")
    assert v.correctness.ok and v.engagement.ok, v.render()
    assert v.reason in (None, "no-change", "slower"), v.render()


def test_a_halved_event_clock_changes_nothing(flux2_cuda):
    """torch.cuda.Event.elapsed_time patched to report half: a trial's time is max(events, the host's
    wall clock), so the candidate (otherwise a no-op) is measured as what it is, never faster."""
    v = _validate(flux2_cuda, "gpu_slow_event.patch", engagement=False)
    assert v.status == "rejected" and v.reason in ("no-change", "slower"), v.render()


def test_halved_clocks_are_held(flux2_cuda):
    """Both clocks of the timing loop halved (events and time.perf_counter): the claimed samples are
    half of what the bot's own clock saw the phase take: held for a person, not a 2x win."""
    v = _validate(flux2_cuda, "gpu_slow_clocks.patch", engagement=False, iters=60)  # a phase well past the slack
    assert v.status == "held" and v.reason == "implausible", v.render()
    assert "a clock in the child runs slow" in v.implausible, v.render()


@pytest.fixture(scope="module")
def qwen_cuda(diffusers_engine):
    from bot.target import resolve_target

    return resolve_target("qwen-image", None, None, "tiny", "cuda")


def test_a_mode_only_the_candidate_captures_is_checked_in_it(qwen_cuda):
    """Qwen-Image's base cannot capture a CUDA graph (a pageable host copy in its forward); this
    candidate hoists the copy, so its graph modes run, and scales its output inside the capture.
    The speed check credits a mode only the candidate runs ("enabled"), so its outputs there are
    compared with the base's without the graph: rejected on correctness, in the graph modes only."""
    v = _validate(qwen_cuda, "gpu_graph_only_wrong.patch", engagement=False)
    assert v.status == "rejected" and v.reason == "correctness", v.render()
    bad = [c.label for c in v.correctness.checks if not c.ok]
    assert bad and all(lb.endswith(("[graph; base eager]", "[compile+graph; base compile]")) for lb in bad), bad
