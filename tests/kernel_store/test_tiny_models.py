"""Each store entry without kernel files wired into the engine's real code path, alone: the patched
tiny model matches the base engine on CPU fp32 within the workload's tolerance (bit for bit where no
arithmetic changed), and a merge-siblings entry runs merged projections whose base-format weights
are views. The entries with Triton kernels are checked against the base engine in their stacks
(test_compile_blocks.py). An entry for quantized
precisions only (an FP8 entry) runs both at that precision (float32+fp8: the recipe applied), where
its path engages."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bot.generate.replay import apply_entry
from bot.knowledge.check import _entry_precision
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry, load_store
from bot.workload import load_workload
from tests.kernel_store.conftest import assert_matches_base

# The entries with kernels are checked against the base engine in their stacks (test_compile_blocks.py:
# one interpreted run per stack instead of one per entry, which took ~330 s of the suite); an entry
# that changes no arithmetic, or only regroups it, is checked here on its own, bit for bit where it can be.
SEEDS = [(e.id, wl) for e in load_store(SHIPPED_STORE)
         if e.engine.name == "diffusers" and not e.kernel_files() for wl in e.workloads]


@pytest.mark.slow
@pytest.mark.parametrize("entry_id, workload", SEEDS)
def test_patched_tiny_model_matches_base(entry_id, workload, diffusers_engine, tiny_base, tiny_runner, tmp_path):
    entry = get_entry(entry_id, SHIPPED_STORE)
    r = apply_entry(diffusers_engine, entry, name=f"test-tiny-{entry_id}")
    assert r.status == "applied", r.reason
    precision = _entry_precision(entry, "float32")
    base = tiny_base(workload, precision)
    got = tiny_runner(workload, Path(r.worktree) / "src", tmp_path / "out", precision=precision)
    assert got["engine_file"].startswith(r.worktree)  # the patched engine was the one imported
    if entry.pattern == "merge-siblings":
        assert got["merged_attn"] > 0 and got["merged_views"], got
    assert_matches_base(got["outputs"], base["outputs"], load_workload(workload).tolerance[precision])
    if not entry.test_files() and entry.pattern != "merge-siblings":  # no arithmetic changed
        for k, ref in base["outputs"].items():
            assert torch.equal(got["outputs"][k], ref), k
