"""End-to-end numbers for store entries: base engine vs the entry's patched engine, per workload.

Two engines cannot share one process, so each measurement is a `step` runner job (bot/jobs.run_job,
runner/harness.py; timing by runner/timing.time_interleaved inside it). Jobs alternate per round:
base, entry 1, entry 2, ..., base, entry 1, ... so drift hits every variant alike; each variant's
figure is the median of its jobs' median step latencies, with every job's stats kept.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable

from bot.engine import add_worktree, checkout_engine
from bot.generate.replay import apply_entry
from bot.jobs import run_job
from bot.knowledge.check import import_root_for
from bot.knowledge.store import Entry
from bot.target import Target
from bot.workload import load_workload


def bench_entries(entries: list[Entry], device: str, preset: str, rounds: int, iters: int, timeout: float,
                  run_dir: Path, echo: Callable[[str], None] = print) -> dict:
    by_wl: dict[tuple[str, str, str], list[Entry]] = {}
    for e in entries:
        for wl in e.workloads:
            by_wl.setdefault((wl, e.engine.source, e.engine.base_sha), []).append(e)
    out: dict = {"device": device, "preset": preset, "rounds": rounds, "iters": iters, "e2e": {}, "errors": []}
    for (wl_name, source, base_sha), ents in by_wl.items():
        wl = load_workload(wl_name)
        spec = wl.engines.get(ents[0].engine.name) or wl.engine(None)
        checkout = checkout_engine(source, base_sha, import_root_for(ents[0]), ents[0].engine.name)
        variants = {"base": (add_worktree(checkout, f"base-{checkout.base_sha[:12]}"), checkout.base_sha)}
        for e in ents:
            rr = apply_entry(checkout, e, name=f"bench-{e.id}")
            if rr.status != "applied":
                out["errors"].append(f"{e.id} on {wl_name}: {rr.reason}")
                echo(f"skip {e.id} on {wl_name}: {rr.reason}")
                continue
            variants[e.id] = (Path(rr.worktree), rr.candidate.commit_sha)
        dtype = wl.dtype_for(device)
        target = Target(wl, checkout.name, spec.model_class, checkout, preset, device, dtype)
        shape = wl.preset(preset).shapes.to_json()
        jobs: dict[str, list[dict]] = {k: [] for k in variants}
        for rnd in range(rounds):
            for name, (wt, sha) in variants.items():
                job = target.job("step", wt, run_dir / wl_name / name / f"r{rnd}", engine_sha=sha, warmup=3,
                                 iters=iters, save_outputs=False)
                res = run_job(job, run_dir / wl_name / name, timeout_s=timeout, name=f"step-r{rnd}")
                if not res.ok:
                    echo(f"{wl_name} {name} round {rnd}: {res.reason()}")
                    jobs[name].append({"status": res.status, "reason": res.reason(), "log_tail": res.log_tail[-800:]})
                    continue
                r = res.result
                echo(f"{wl_name} {name} round {rnd}: median {r['latency']['median_ms']:.2f} ms per step ({device})")
                jobs[name].append({"status": "ok", "latency": r["latency"], "per_pass_ms": r["per_pass_ms"],
                                   "passes": r["passes"], "digest": r["outputs"][0]["tensors"], "env": r["env"]})
        base_ok = [j["latency"]["median_ms"] for j in jobs["base"] if j["status"] == "ok"]
        base_ms = statistics.median(base_ok) if base_ok else None
        for e in ents:
            if e.id not in jobs:
                continue
            ok = [j["latency"]["median_ms"] for j in jobs[e.id] if j["status"] == "ok"]
            ms = statistics.median(ok) if ok else None
            passes = next((j["passes"] for j in jobs[e.id] if j["status"] == "ok"), None)
            out["e2e"].setdefault(e.id, {"device": device, "preset": preset, "workloads": {}})["workloads"][wl_name] = {
                "shape": shape, "dtype": dtype, "base_step_ms": base_ms, "patched_step_ms": ms, "passes": passes,
                "base_per_pass_ms": base_ms / passes if base_ms and passes else None,
                "patched_per_pass_ms": ms / passes if ms and passes else None,
                "speedup": base_ms / ms if base_ms and ms else None,
                "base_jobs": jobs["base"], "patched_jobs": jobs[e.id],
            }
    return out
