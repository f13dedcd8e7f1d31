"""analyze(): graph + profile -> the analysis dict (the JSON that `optbot analyze --json` writes)."""
from __future__ import annotations

from dataclasses import asdict

from bot.analyze.cost import attribute
from bot.analyze.detectors import Context, run_all
from bot.analyze.graph import Graph
from bot.analyze.rank import claimed_total, group, link_quantization, mark_stand_ins

ANALYSIS_VERSION = 1


def analyze(graph: Graph, profile: dict, meta: dict | None = None, profile_source: str = "",
            only: list[str] | None = None) -> dict:
    cost = attribute(graph, profile, profile_source)
    ctx = Context(graph=graph, cost=cost, profile=profile)
    findings = run_all(ctx, only)
    opps = group(graph, cost, findings)
    link_quantization(graph, opps)
    mark_stand_ins(graph, opps, (profile.get("env") or {}).get("stand_in_code") or {})
    claimed = claimed_total(cost, opps)
    return {
        "version": ANALYSIS_VERSION,
        "meta": meta or {},
        "profile": {"device": f"{cost.device} ({cost.device_name})" if cost.device_name else cost.device,
                    "total_ms": cost.total_ms, "passes": profile.get("passes", 1), "coverage": round(cost.coverage, 4),
                    "copy_gbps": cost.copy_gbps, "matmul_tflops": cost.matmul_tflops, "source": profile_source,
                    "time_scale": cost.time_scale,
                    "shape": profile.get("shape")},
        "graph": {"device": graph.raw.get("device"), "ops": len(graph.ops), "passes": graph.raw.get("passes", 1),
                  "shape": graph.raw.get("shape"), "probes": graph.raw.get("probes", [])},
        "claimed_ms": round(claimed, 5),
        "claimed_pct": round(cost.pct(claimed), 3),
        "opportunities": [asdict(o) for o in opps],
    }
