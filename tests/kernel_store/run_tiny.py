"""Test helper, run as a child process: one tiny-preset step of a workload from an engine import
root, outputs saved to OUT.pt, and which path each optbot kernel module took written to OUT.json.

    PYTHONPATH=<engine_root>:<optbot root> python tests/kernel_store/run_tiny.py WORKLOAD ENGINE_ROOT OUT [PRECISION]

PRECISION: float32 (default) or a quantized one, float32+fp8 (the recipe applied after the weights
load, as every workload command does with --quant fp8).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from bot.workload import load_workload
from runner.harness import build, make_step
from runner.job import Job


def tiny_cpu_job(workload: str, engine_root: str, precision: str = "float32") -> Job:
    """A step job of the workload's tiny preset on CPU at `precision`, every shape of the preset."""
    wl = load_workload(workload)
    pre = wl.preset("tiny")
    return Job(kind="step", workload=wl.to_json(), preset="tiny", device="cpu", dtype=precision,
               engine_root=engine_root, engine_sha="", model_class=wl.engine(None).model_class,
               shapes=[s.to_json() for s in (pre.shapes, *pre.extra_shapes)])


def main(workload: str, engine_root: str, out: str, precision: str = "float32") -> None:
    job = tiny_cpu_job(workload, engine_root, precision)
    built = build(job)
    outs = {}
    for si, shape in enumerate(job.shapes):
        step, _ = make_step(built, job, shape, seed=si)
        for k, v in step().items():
            outs[f"{si}.{k}"] = v.detach().clone()
    torch.save(outs, out + ".pt")
    paths = {name: mod.last_path() for name, mod in sys.modules.items()
             if name.startswith("diffusers.models.optbot_kernels.") and hasattr(mod, "last_path")}
    # merge-siblings entries: which attention modules run merged projections, and whether the
    # base-format projections are views into the merged weight (no weight stored twice)
    merged = [m for m in built.model.modules() if getattr(m, "fused_projections", False)]
    views = all(m.to_q.weight.data_ptr() == m.to_qkv.weight.data_ptr() for m in merged if hasattr(m, "to_qkv"))
    Path(out + ".json").write_text(json.dumps({"kernel_paths": paths, "engine_file": built.engine_file,
                                               "merged_attn": len(merged), "merged_views": views}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
