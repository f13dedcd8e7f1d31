"""Helpers for the analysis tests: capture and profile a small torch model in-process, then analyze.
The graph and profile are written to tmp_path (graph.json, profile.json).

The profile is the real one (runner/profiler.profile_step on CPU); the ceilings are fixed test
values (copy 20 GB/s, matmul 0.2 TFLOP/s) so estimates do not depend on this machine's load.
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


ROLES = {"pixels": "latents", "words": "prompt", "tau": "timestep", "mask": "text_mask"}


def run_toy(model, passes: list[dict], tmp_path: Path, only=None, profile_extra: dict | None = None):
    import torch

    from bot.analyze.graph import Graph
    from bot.analyze.run import analyze
    from runner.graph_capture import capture
    from runner.profiler import profile_step

    model = model.eval().requires_grad_(False)

    def step():
        with torch.inference_mode():
            return [model(**kw) for kw in passes]

    step()
    rec = capture(model, step, str(HERE), ROLES)
    graph = Graph.from_json({**rec.to_json(), "device": "cpu", "probes": []})
    prof = profile_step(model, step, "cpu", tmp_path / "trace.json.gz")
    profile = {**prof, "device": "cpu", "total_ms": prof["busy_ms"] * 1.5, "idle_ms": None, "passes": len(passes),
               "peaks": {"copy_gbps": 20.0, "matmul_tflops": 0.2}, "env": {"device_kind": "cpu", "device_name": "test"}}
    profile.update(profile_extra or {})
    # kept beside the trace, for tests that analyze the same inputs again (in other processes)
    (tmp_path / "graph.json").write_text(json.dumps(graph.raw))
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    return analyze(graph, profile, {}, "test", only), graph


def kinds(analysis, kind=None, detail=None):
    return [o for o in analysis["opportunities"]
            if (kind is None or o["kind"] == kind) and (detail is None or o["detail"] == detail)]
