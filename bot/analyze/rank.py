"""Group findings over repeated blocks into Opportunities, price them, and rank by estimated gain."""
from __future__ import annotations

import math
from collections import defaultdict

from bot.analyze.cost import CostModel
from bot.analyze.graph import Graph, module_pattern
from bot.analyze.opportunity import (Estimate, Finding, Location, Opportunity, stable_id, stand_in_at,
                                     stand_in_spans)


def group(graph: Graph, cost: CostModel, findings: list[Finding]) -> list[Opportunity]:
    buckets: dict[tuple, list[Finding]] = defaultdict(list)
    for f in findings:
        where = f.region or (graph.ops[f.anchor].module if f.anchor >= 0 else "")
        buckets[(f.kind, f.detail, module_pattern(where), f.signature)].append(f)
    opps = []
    for (kind, detail, pattern, sig), fs in buckets.items():
        gain = math.fsum(f.gain_ms for f in fs)
        examples = []
        for f in fs:
            where = f.region or (graph.ops[f.anchor].module if f.anchor >= 0 else "")
            if where and where not in examples:
                examples.append(where)
        anchor = fs[0].anchor
        src = graph.ops[anchor].src if anchor >= 0 else ""
        efile, _, eline = src.rpartition(":")
        op_ids = sorted({i for f in fs for i in f.op_ids})
        ops_desc = []
        for i in op_ids:
            o = graph.ops[i]
            if o.alias:
                continue
            d = f"{o.op} @ {o.pattern}"
            if d not in ops_desc:
                ops_desc.append(d)
        basis = fs[0].basis + (f"; summed over {len(fs)} places" if len(fs) > 1 else "")
        opp_id = stable_id(kind, pattern, f"{detail}|{sig}")
        opps.append(Opportunity(
            id=opp_id, kind=kind, detail=detail, summary=fs[0].summary,
            location=Location(module_pattern=pattern or "(top level)", examples=examples[:4],
                              engine_file=efile, engine_line=int(eline) if eline.isdigit() else None, instances=len(fs),
                              call_site=graph.ops[anchor].call_site if anchor >= 0 else ""),
            ops=ops_desc[:24], op_ids=op_ids, gain_ms=round(gain, 5), gain_pct=round(cost.pct(gain), 3),
            confidence=round(math.fsum(f.confidence for f in fs) / len(fs), 2), confidence_reason=fs[0].confidence_reason,
            generator=fs[0].generator,
            estimate=Estimate(estimated_ms=round(gain, 5), estimated_pct=round(cost.pct(gain), 3), basis=basis,
                              profile_device=f"{cost.device} ({cost.device_name})" if cost.device_name else cost.device,
                              profile_total_ms=round(cost.total_ms, 4), profile_source=cost.profile_source),
            facts=fs[0].facts))
    opps.sort(key=lambda o: (-o.gain_ms, -o.confidence, o.id))
    return opps


def link_quantization(graph: Graph, opps: list[Opportunity]) -> None:
    """Set each opportunity's `quantized_by`: the FP8 activation quantizations (kind `quantization`)
    that read a value computed by one of its ops, looking through views. Only data flow counts: a
    norm + modulation whose output an FP8 GEMM quantizes, an activation feeding one, never a name."""
    readers: dict[int, set[str]] = defaultdict(set)  # producing op id -> quantization opportunity ids
    for q in opps:
        if q.kind != "quantization":
            continue
        own = set(q.op_ids)
        for i in q.op_ids:
            for v in graph.ops[i].inputs:
                p = graph.source_op(v)
                if p is not None and p.id not in own:
                    readers[p.id].add(q.id)
    for o in opps:
        if o.kind != "quantization":
            o.quantized_by = sorted({q for i in o.op_ids for q in readers.get(i, ())})


def claimed_total(cost: CostModel, opps: list[Opportunity]) -> float:
    """Attributed time of the ops the opportunities touch, each op counted once (an upper bound
    of what all of them together could remove, apart from launch-bound time)."""
    ids = {i for o in opps for i in o.op_ids}
    return cost.ms(ids)




def mark_stand_ins(graph: Graph, opps: list[Opportunity], code: dict[str, list[str]]) -> None:
    """Set `stand_in` on each opportunity one of whose ops the engine ran from stand-in code: the runner's
    environment record `stand_in_code` ({what stands in: ["engine/file.py:first-last", ...]}, e.g. SGLang's
    torch RoPE fallback where FlashInfer is absent, runner/engines/sglang.py)."""
    spans = stand_in_spans(code)
    if not spans:
        return
    for o in opps:
        for i in o.op_ids:
            path, _, line = graph.ops[i].src.rpartition(":")
            hit = stand_in_at(spans, path, int(line)) if line.isdigit() else None
            if hit:
                o.stand_in = f"{hit[0]}: {graph.ops[i].op} at {graph.ops[i].src}"
                break
