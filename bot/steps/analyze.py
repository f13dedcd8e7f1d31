"""Step 4, analyze: the op graph of one base step (runner `graph` job) and the profile -> ranked
Opportunities (bot/analyze/, docs/analyze.md). `optbot analyze` runs the same code through
``analyze_base``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bot.analyze.graph import Graph
from bot.errors import OptbotError
from bot.analyze.opportunity import Opportunity
from bot.analyze.run import analyze
from bot.jsonable import from_json, write_json_atomic
from bot.run.context import RunContext
from bot.steps.jobs import run_ok
from bot.target import Target
from bot.workload import Workload


@dataclass
class Result:
    status: str  # done | skipped
    reason: str
    opportunities: list[Opportunity] = field(default_factory=list)
    reused_from: str = ""  # an earlier run's analysis of this very base (bot/run/base_cache.py)

    def summary(self) -> str:
        return self.reason + (f"; reused from {self.reused_from}" if self.reused_from else "")


def analyze_base(t: Target, worktree: Path | str, out_dir: Path, profile: dict, profile_source: str,
                 meta: dict, only: list[str] | None = None, timeout_s: float = 3600,
                 fingerprints: bool | None = None) -> dict:
    """Capture the op graph of one step of `worktree` and run the detectors over it and `profile`:
    the analysis (bot/analyze/run.py), with the graph job's environment and capture time in `meta`."""
    params = {} if fingerprints is None else {"fingerprints": fingerprints}
    g = run_ok(t, "graph", Path(worktree), out_dir, timeout_s, iters=0, warmup=0, save_outputs=False, params=params)
    meta = {**meta, "capture_s": g.get("capture_s"), "graph_file": g["graph"]}
    graph = Graph.load(g["graph"])
    check_passes(t.workload, graph)
    result = analyze(graph, profile, meta, profile_source, only)
    result["env"] = {"profile": profile.get("env"), "graph": g.get("env")}
    return result


def check_passes(wl: Workload, graph: Graph) -> None:
    """The captured graph must be the step the workload declares: as many forward passes, and under
    true CFG passes whose inputs differ. Otherwise the CFG detector would judge a step that is not
    the one profiled (every value of two identical passes looks prompt-independent)."""
    captured = int(graph.raw.get("passes", 1))
    if captured != wl.step.passes:
        raise OptbotError(f"{wl.file}: key 'step.cfg': the workload declares {wl.step.passes} forward pass(es) per step "
                          f"(cfg: {wl.step.cfg}) but the captured step ran the model's forward {captured} time(s)")
    if wl.step.passes == 2:
        digests = {}
        for i in graph.raw.get("inputs", []):
            digests.setdefault(i["key"], {}).setdefault(i["pass"], []).append(i["digest"])
        differ = sorted(k for k, by in digests.items() if by.get(0) != by.get(1))
        if not differ:
            declared = [d.name for d in wl.inputs.forward if d.cfg != "same"]
            raise OptbotError(f"{wl.file}: key 'inputs.forward': step.cfg is true-cfg, but both captured passes got "
                              f"identical inputs (declared to differ: {', '.join(declared)}); the unconditional pass "
                              f"must differ from the conditional one")


def run(ctx: RunContext) -> Result:
    from bot.run import base_cache

    co, prof = ctx.results.checkout, ctx.results.profile
    full = ctx.run_dir / "analysis.full.json"
    key = ctx.base_key()
    # only with the profile it was made from: a profile measured afresh is analyzed afresh
    hit = base_cache.lookup(key) if key and prof.reused_from else None
    if hit:
        analysis = _reused(hit[0], ctx.jobs_dir() / "graph", prof.profile_file, hit[1])
        reused = hit[1].line()
    else:
        analysis = analyze_base(ctx.target, co.base_worktree, ctx.jobs_dir() / "graph", prof.load(), prof.profile_file,
                                {"workload": co.workload, "preset": co.preset, "engine": co.engine})
        reused = ""
    write_json_atomic(full, analysis)
    if key and not hit:
        base_cache.store(key, ctx.run_id, {"profile.full.json": Path(prof.profile_file),
                                           "graph.json": Path(analysis["meta"]["graph_file"]),
                                           "analysis.full.json": full})
    opps = [from_json(Opportunity, o) for o in analysis.get("opportunities", [])]
    claimed = analysis.get("claimed_ms")
    return Result("done", f"{len(opps)} opportunities"
                  + (f", {claimed:.3f} ms claimed ({analysis['profile'].get('device')})" if claimed else ""), opps,
                  reused_from=reused)


def _reused(cached: Path, graph_dir: Path, profile_file: str, origin) -> dict:
    """The cached analysis, its graph copied into this run and every path in it pointing at this
    run's copies (the generators read the graph; estimates name their profile)."""
    import json
    import shutil

    graph_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached / "graph.json", graph_dir / "graph.json")
    text = (cached / "analysis.full.json").read_text()
    a = json.loads(text)
    for old, new in ((a["meta"].get("graph_file"), str(graph_dir / "graph.json")),
                     (a["profile"].get("source"), profile_file)):
        if old:
            text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    a = json.loads(text)
    a["meta"]["reused_from"] = {"run_id": origin.run_id, "created_at": origin.created_at, "key": origin.key}
    return a
