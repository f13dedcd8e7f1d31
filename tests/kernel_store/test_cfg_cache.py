"""qwen-image-cfg-modulation-cache: all blocks' modulation is a few GEMMs over weights merged at load (runs
of whole block linears of bounded size), the cache is hit by the second CFG pass, missed when the timestep
changes, and a hit gives the same output as a recompute."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.generate.replay import apply_entry
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cfg_modulation_cache_hits_and_misses(diffusers_engine):
    r = apply_entry(diffusers_engine, get_entry("qwen-image-cfg-modulation-cache", SHIPPED_STORE), name="test-cfg-cache")
    assert r.status == "applied", r.reason
    src = Path(r.worktree) / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]))
    p = subprocess.run([sys.executable, str(Path(__file__).with_name("cfg_cache_probe.py")), str(src)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["blocks"] > 1
    assert res["one_run"], "the tiny model's modulation should fit one merged linear"
    n = 2 * res["blocks"]  # block linears, merged again in runs of at most 3
    assert res["runs"] == [3] * (n // 3) + ([n % 3] if n % 3 else []), res["runs"]
    assert res["counts"] == [1, 1, 2]  # pass 1 computes (one GEMM per run), pass 2 (same t) reuses, a new t recomputes
    assert res["changed_t_equal"] and res["cond_ne_uncond"]
    assert res["views"], "the blocks' modulation linears should be views of the merged weight"
    assert res["mods_match"], "the merged modulation differs from the blocks' own"
    assert res["replaced_ok"], "a block whose modulation linear was replaced after the merge must compute its own"
