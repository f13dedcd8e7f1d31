"""cfg-invariant-cache: work of a later classifier-free-guidance pass that recomputes a value of the
first pass because it does not depend on the prompt.

An op of pass >= 2 qualifies when (1) its dependency set holds no prompt-side label (prompt,
text_mask, or an input of unknown role), (2) it depends on some step input (timestep, latents,
positions, guidance; work on weights alone is hoist-constant's), and (3) its value number was
already computed in pass 1: the same op on inputs with the same content, and (4) where the graph
holds output fingerprints, its output equals pass 1's. Caching it for the later pass removes its
whole time. Dependencies are the op's results' (Graph.op_deps), which include
what was written into a buffer in place before it was read (runner/graph_capture.py), so a read of
a buffer holding prompt values is never taken for prompt-independent work.
"""
from __future__ import annotations

from collections import defaultdict

from bot.analyze.opportunity import Finding
from bot.analyze.detectors.common import describe_ops, labels_of, region, wrapper_prefix

KIND = "cfg-invariant-cache"


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    prefix = wrapper_prefix(g)
    if g.raw.get("passes", 1) < 2:
        return []
    prompt_side = g.label_mask("prompt", "text_mask") | sum(1 << i for i, n in enumerate(g.labels) if n.startswith("input:"))
    static = g.label_mask("weights", "const")
    first_vns = {g.values[v]["vn"] for o in g.ops if o.pass_idx == 0 for v in o.outputs}
    # where the graph job recorded output fingerprints (runner/graph_capture.py; on by default on
    # CPU), a value number match must also be a value match: an op whose pass-2 output differs
    # from pass 1's is not cached, whatever its dependencies say
    raw_ops = g.raw.get("ops", [])
    first_fp = {g.values[o.outputs[0]]["vn"]: raw_ops[o.id]["fp"] for o in g.ops
                if o.pass_idx == 0 and o.outputs and "fp" in raw_ops[o.id]}
    refuted: list[int] = []
    by_region: dict[tuple[int, str], list] = defaultdict(list)
    for o in g.ops:
        if o.pass_idx < 1 or o.alias or not o.outputs or not ctx.free(o.id):
            continue
        d = g.op_deps(o)
        if d & prompt_side or not (d & ~static):
            continue
        if not all(g.values[v]["vn"] in first_vns for v in o.outputs):
            continue
        fp = raw_ops[o.id].get("fp") if o.id < len(raw_ops) else None
        if fp is not None and first_fp.get(g.values[o.outputs[0]]["vn"], fp) != fp:
            refuted.append(o.id)
            continue
        by_region[(o.pass_idx, region(o.module, prefix))].append(o)
    out = []
    for (pidx, reg), ops in by_region.items():
        ids = [o.id for o in ops]
        checked = sum(1 for o in ops if "fp" in raw_ops[o.id])
        labels = sorted({lab for o in ops for lab in labels_of(g, o)})
        ms = cost.ms(ids)
        ctx.claim(ids)
        out.append(Finding(
            KIND, "recomputed-in-later-pass", ids, ops[0].id, ms,
            f"time of {len(ids)} ops of pass {pidx + 1} that recompute pass-1 values (value numbers match)",
            0.9, f"they depend only on {', '.join(labels)}: not on the prompt", "store-replay",
            signature="cfg", region=reg,
            summary=f"pass {pidx + 1} recomputes prompt-independent work ({describe_ops(g, ids)[:110]}): cache it from pass 1",
            facts={"depends_on": labels, "pass": pidx + 1,
                   "values_checked": f"{checked} of {len(ids)} ops' outputs equal pass 1's (fingerprints)"
                   if checked else "not checked (no fingerprints in the graph)",
                   **({"refuted_ops": len(refuted)} if refuted else {})}))
    return out
