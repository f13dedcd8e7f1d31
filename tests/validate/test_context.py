"""bot/validate/context.py: what a validation's checks share, and the defaults that follow the device."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.validate.conftest import scratch_context


@pytest.mark.parametrize("device, options, gates, graph, flops", [
    ("cpu", {}, False, False, False),  # DESIGN decision 7: CPU speed is informational
    ("cuda", {}, True, True, True),
    ("cpu", {"speed_gates": True, "graph": True}, True, True, False),
    ("cuda", {"speed": False}, True, False, False),
])
def test_speed_defaults_follow_the_device(tmp_path, device, options, gates, graph, flops):
    ctx = scratch_context(tmp_path, device, **options)
    assert ctx.gates is gates
    cand, base = ctx.side_params("candidate"), ctx.side_params("base")
    assert cand["timing"]["graph"] is graph and cand["flops"] is flops
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
