"""Compile-region generator: region choice from a real profile, the patch on the real engine source,
and (slow) the compiled candidate's outputs against the base on CPU."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import git
import pytest

from bot.generate import compile_region
from bot.generate.candidate import Candidate
from bot.trailers import parse_trailers
from bot.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
H200_PROFILE = ROOT / "benchmarks" / "results" / "h200-20261129" / "profile-flux2-full.json"


def test_choose_regions_from_h200_profile():
    profile = json.loads(H200_PROFILE.read_text())
    regions = compile_region.choose_regions(profile)
    names = [r.container for r in regions]
    assert names == ["single_transformer_blocks", "transformer_blocks"]
    assert regions[0].blocks == 48 and regions[1].blocks == 8
    assert sum(r.share for r in regions) > 0.8


def test_choose_regions_structural():
    prof = {"kernels": [{"module": "layers.0.mlp", "ms": 4.0}, {"module": "layers.1.mlp", "ms": 4.0},
                        {"module": "embed", "ms": 1.0}, {"module": "heads.0", "ms": 1.0}]}
    assert [r.container for r in compile_region.choose_regions(prof)] == ["layers"]  # heads: one block only


def test_patch_source_rejects_missing_container():
    src = "class M:\n    def __init__(self):\n        self.blocks = []\n"
    assert "for _optbot_block in (*self.blocks,):" in compile_region.patch_source(src, "M", ["blocks"])
    with pytest.raises(Exception, match="does not assign self.layers"):
        compile_region.patch_source(src, "M", ["layers"])


def _profile():
    return {"kernels": [{"module": f"{c}.{i}.attn", "ms": 1.0} for c in ("transformer_blocks", "single_transformer_blocks")
                        for i in range(2)] + [{"module": "x_embedder", "ms": 0.1}]}


def test_generate_commit_on_flux2(diffusers_engine):
    wl = load_workload("flux2")
    cand = compile_region.generate(diffusers_engine, diffusers_engine.base_sha, _profile(), wl.engine(None).model_class,
                                   "src", "test-cr", opportunity={"id": "opp-lb", "kind": "launch-bound"})
    assert isinstance(cand, Candidate) and cand.generator == "compile-region"
    repo = git.Repo(cand.worktree)
    message = repo.commit(cand.commit_sha).message
    assert cand.description == message and cand.trailers == parse_trailers(message)
    tr = parse_trailers(message)
    assert tr["Optbot-Kind"] == "launch-bound" and tr["Optbot-Generator"] == "compile-region"
    assert tr["Optbot-Run"] == "test-cr" and tr["Optbot-Opportunity"] == "opp-lb"
    diff = repo.git.diff(diffusers_engine.base_sha, cand.commit_sha)
    assert "_optbot_block.compile()" in diff and diff.count("\n+") >= 5
    src = (Path(cand.worktree) / "src/diffusers/models/transformers/transformer_flux2.py").read_text()
    ast.parse(src)
    assert "(*self.transformer_blocks, *self.single_transformer_blocks,)" in src


@pytest.mark.slow
def test_compiled_candidate_matches_base_on_cpu(diffusers_engine, base_worktree, tmp_path):
    """Inductor on CPU (gcc): the compiled step's outputs stay within the workload's fp32 tolerance,
    and inductor really compiled (the candidate commit's own compile cache, emptied first, fills up)."""
    import shutil

    torch = pytest.importorskip("torch")
    from bot.jobs import run_job
    from bot.sandbox import compile_cache
    from runner.job import Job

    wl = load_workload("flux2")
    cand = compile_region.generate(diffusers_engine, diffusers_engine.base_sha, _profile(), wl.engine(None).model_class,
                                   "src", "test-cr-run")
    inductor_dir = compile_cache(cand.commit_sha) / "inductor"
    shutil.rmtree(inductor_dir, ignore_errors=True)
    pr = wl.preset("tiny")
    shape = {"resolution": list(pr.shapes.resolution), "text_tokens": pr.shapes.text_tokens, "batch": 1}
    outs = {}
    for name, wt, sha in (("base", base_worktree, diffusers_engine.base_sha), ("cand", Path(cand.worktree), cand.commit_sha)):
        job = Job(kind="step", workload=wl.to_json(), preset="tiny", device="cpu", dtype="float32",
                  engine_root=str(wt / "src"), engine_sha=sha, model_class=wl.engine(None).model_class,
                  shapes=[shape], seeds=[7], warmup=0, iters=0, out_dir=str(tmp_path / name))
        out = run_job(job, tmp_path / name, timeout_s=900, name="step")
        assert out.ok, out.log_tail
        outs[name] = torch.load(out.result["outputs"][0]["file"])["noise_pred"]
    assert any(inductor_dir.rglob("*.py")), "inductor wrote no generated code: the region was not compiled"
    tol = wl.tolerance["float32"]
    a, b = outs["cand"], outs["base"]
    assert torch.isfinite(a).all()
    assert float((a - b).norm() / b.norm()) <= tol.rel_l2
    torch.testing.assert_close(a, b, atol=tol.atol, rtol=tol.rtol)
