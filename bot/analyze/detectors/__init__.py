"""Detectors: one module per opportunity kind, each ``detect(ctx) -> list[Finding]``.

They run in ORDER. A detector may *claim* ops (ctx.claim) so that a later, more general detector
does not count the same time twice (e.g. the ops of a norm+modulation fusion are not reported
again as a plain elementwise chain). No detector looks at class or module names: only at aten
ops, shapes, data flow and dependency labels (bot/analyze/graph.py).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from bot.analyze.cost import CostModel
from bot.analyze.graph import Graph

ORDER = ("cfg_invariant", "quantization", "hoist_constant", "attention_waste", "merge_siblings", "fuse_norm_consumer",
         "absorb_bias", "fuse_gemm_epilogue", "fuse_elementwise_chain", "launch_bound")


@dataclass
class Context:
    graph: Graph
    cost: CostModel
    profile: dict
    claimed: set[int] = field(default_factory=set)

    def claim(self, op_ids) -> None:
        self.claimed.update(op_ids)

    def free(self, op_id: int) -> bool:
        return op_id not in self.claimed


def run_all(ctx: Context, only: list[str] | None = None) -> list:
    findings = []
    for name in ORDER:
        mod = importlib.import_module(f"bot.analyze.detectors.{name}")
        if only and mod.KIND not in only:
            continue
        findings.extend(mod.detect(ctx))
    return findings
