"""Put the profile's measured time on the graph's ops, and price what a change would save.

Attribution: the profile groups kernels (GPU) or op self-times (CPU) by (module path, aten op).
Graph ops are keyed the same way, with both op names reduced to a shared family (aten::linear and
the aten::addmm that launched its kernel are both "gemm"; a cast and the aten::copy_ under it are
both "copy"). Each profile group's time is split over the graph ops with its key, in proportion to
their work (FLOPs for GEMMs, bytes otherwise). Profile time with no graph op of its key stays
unattributed; `coverage` says how much was placed.

Pricing (all from the same profile):
- removed work: the attributed time of the ops that go away;
- fused work: the attributed time of the ops fused, minus what one ideal kernel doing the same job
  would take: the bytes it must still read and write, at the copy bandwidth measured with the
  profile (``peaks.copy_gbps``).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from bot.analyze.graph import Graph, kind, op_family


@dataclass
class CostModel:
    op_ms: dict[int, float]
    device: str
    device_name: str
    total_ms: float
    copy_gbps: float
    matmul_tflops: float
    coverage: float
    profile_source: str = ""
    time_scale: float = 1.0  # < 1 when profiled times added up to more than the unprofiled step

    def ms(self, op_ids) -> float:
        # fsum: exact, so the total does not depend on the order a set of ids iterates in
        return math.fsum(self.op_ms.get(i, 0.0) for i in set(op_ids))

    def bytes_ms(self, nbytes: float) -> float:
        return nbytes / (self.copy_gbps * 1e9) * 1e3 if self.copy_gbps else 0.0

    def flops_ms(self, flops: float) -> float:
        return flops / (self.matmul_tflops * 1e12) * 1e3 if self.matmul_tflops else 0.0

    def pct(self, ms: float) -> float:
        return 100.0 * ms / self.total_ms if self.total_ms else 0.0


def attribute(graph: Graph, profile: dict, source: str = "") -> CostModel:
    prof_ms: dict[tuple[str, str], float] = defaultdict(float)
    for k in profile.get("kernels", []):
        prof_ms[(k.get("module", ""), op_family(k.get("op") or k.get("name", "")))] += float(k["ms"])
    by_key: dict[tuple[str, str], list] = defaultdict(list)
    for o in graph.ops:
        by_key[(o.module, op_family(o.op))].append(o)
    busy = sum(prof_ms.values())
    total = float(profile.get("total_ms", 0.0))
    # Profiled times can add up to more than the unprofiled step (the profiler's own overhead per
    # op on a CPU, a loaded machine): then they are scaled down to sum to the step, so estimates
    # stay fractions of the latency the user sees.
    scale = total / busy if busy and total and busy > total else 1.0
    op_ms: dict[int, float] = {}
    placed = 0.0
    for key, ms in prof_ms.items():
        ops = by_key.get(key)
        if not ops:
            continue
        weights = [_work(graph, o) for o in ops]
        tot = sum(weights)
        for o, w in zip(ops, weights):
            share = scale * ms * (w / tot if tot else 1.0 / len(ops))
            op_ms[o.id] = op_ms.get(o.id, 0.0) + share
        placed += ms
    env = profile.get("env", {})
    peaks = profile.get("peaks", {})
    return CostModel(op_ms=op_ms, device=profile.get("device", env.get("device_kind", "?")),
                     device_name=env.get("device_name", ""), total_ms=float(profile.get("total_ms", 0.0)),
                     copy_gbps=float(peaks.get("copy_gbps", 0.0)), matmul_tflops=float(peaks.get("matmul_tflops", 0.0)),
                     coverage=placed / busy if busy else 0.0, profile_source=source, time_scale=round(scale, 4))


def _work(graph: Graph, o) -> float:
    k = kind(o)
    if k == "gemm":
        return float(graph.gemm_flops(o)) or 1.0
    if o.alias:
        return 1.0
    return float(graph.op_bytes(o)) or 1.0


def fused_gain(graph: Graph, cost: CostModel, op_ids: list[int]) -> tuple[float, float, int]:
    """(gain_ms, measured_ms, ideal_bytes) of replacing `op_ids` by one kernel that reads their
    external inputs once and writes their external outputs once."""
    ids = {i for i in op_ids if not graph.ops[i].alias}
    ops = [graph.ops[i] for i in ids]
    produced = {v for o in ops for v in o.outputs}
    ext_in = {graph.root(v) for o in ops for v in o.inputs if v not in produced}
    ext_out = set()
    for o in ops:
        for v in o.outputs:
            if any(c.id not in ids for c in graph.real_consumers(v)) or not graph.real_consumers(v):
                ext_out.add(v)
    nbytes = sum(graph.nbytes(v) for v in ext_in) + sum(graph.nbytes(v) for v in ext_out)
    measured = cost.ms(ids)
    return max(0.0, measured - cost.bytes_ms(nbytes)), measured, nbytes
