"""bot/validate/context.py: what a validation's checks share, and the defaults that follow the device."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.validate.conftest import scratch_context


ALL = ["eager", "graph", "compile", "compile+graph"]


@pytest.mark.parametrize("device, options, gates, modes, flops", [
    ("cpu", {}, False, ["eager"], False),  # DESIGN decision 7: CPU speed is informational
    ("cuda", {}, True, ALL, True),  # every production mode on the GPU
    ("cpu", {"speed_gates": True, "modes": ("eager", "compile")}, True, ["eager", "compile"], False),
    # correctness only on the GPU: no timed processes, no roofline, but each mode's outputs still compared
    ("cuda", {"speed": False}, True, ALL, False),
    ("cpu", {"speed": False}, False, None, False),
])
def test_speed_defaults_follow_the_device(tmp_path, device, options, gates, modes, flops):
    ctx = scratch_context(tmp_path, device, **options)
    assert ctx.gates is gates
    cand, base = ctx.side_params("candidate"), ctx.side_params("base")
    assert cand["timing"].get("modes") == modes and cand["flops"] is flops
    assert cand["timing"].get("save_outputs", modes is None)  # the first process keeps each mode's outputs
    assert ctx.timing_params()["save_outputs"] is False
    assert base["flops"] is False and base["timing"] == cand["timing"]  # the roofline floor is the candidate's


def test_a_job_has_the_validations_seeds_weights_and_shapes(tmp_path):
    ctx = scratch_context(tmp_path)
    wt = tmp_path / "wt"
    (wt / "src").mkdir(parents=True)
    job = ctx.job("validate_step", wt, "c" * 40, "candidate", {"correctness": True})
    assert (job.seeds, job.weight_seed, job.warmup, job.iters) == ([11, 12], 13, 1, 2)
    assert [s["resolution"] for s in job.shapes] == [[256, 256], [176, 240]]
    assert job.out_dir == str(tmp_path / "run" / "candidate") and job.engine_sha == "c" * 40
    one = ctx.job("validate_step", wt, "c" * 40, "t", {}, seeds=ctx.seeds[:1], shapes=ctx.shapes[:1])
    assert one.seeds == [11] and len(one.shapes) == 1
    assert Path(ctx.job("compare", None, "", "compare", {}).engine_root).is_dir()  # no engine: optbot's root
