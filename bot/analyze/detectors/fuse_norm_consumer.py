"""fuse-norm-consumer: a normalization whose output goes straight into elementwise consumers
(modulation scale and shift, a gate, a residual add) or into quantization.

From each normalization (a norm op, or the hand-written RMS pattern, bot/analyze/graph.find_norms)
the output is followed while it has exactly one consumer that is elementwise (or a cast, or a
quantization, which ends the chain) and keeps the full size. Small side operands (per-sample or
per-channel vectors such as ``1 + scale``) and the tiny ops that make them are part of the fusion.
One kernel then reads x once and writes the modulated result once.
"""
from __future__ import annotations

from bot.analyze.cost import fused_gain
from bot.analyze.graph import kind
from bot.analyze.opportunity import Finding
from bot.analyze.detectors.common import describe_ops

KIND = "fuse-norm-consumer"


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    out = []
    for ng in g.norm_groups:
        if not all(ctx.free(i) for i in ng.op_ids):
            continue
        chain, side = [], []
        cur = ng.output
        quant = False
        while True:
            cons = g.real_consumers(cur)
            if len(cons) != 1:
                break
            c = cons[0]
            kd = kind(c)
            if not ctx.free(c.id) or not c.outputs:
                break
            if kd == "quant":
                chain.append(c.id)
                quant = True
                break
            if kd not in ("pointwise", "cast") or g.numel(c.outputs[0]) != g.numel(cur):
                break
            chain.append(c.id)
            for v in c.inputs:
                if g.root(v) == g.root(cur) or not g.is_small(v, cur):
                    continue
                p = g.source_op(v)
                if p is not None and kind(p) == "pointwise" and ctx.free(p.id) and \
                        all(x.id in chain for o in p.outputs for x in g.real_consumers(o)):
                    side.append(p.id)
            cur = c.outputs[0]
        if not chain:
            continue
        ids = list(ng.op_ids) + chain + side
        gain, measured, nbytes = fused_gain(g, cost, ids)
        nxt = g.real_consumers(cur)
        feeds = sorted({kind(c) for c in nxt})
        ctx.claim(ids)
        consumers = describe_ops(g, chain)
        out.append(Finding(
            KIND, "norm+quant" if quant else "norm+elementwise", ids, ng.op_ids[0], gain,
            f"{measured:.4f} ms measured for the norm and {len(chain) + len(side)} consumer ops, minus one pass moving "
            f"{nbytes / 1e6:.3f} MB at the profile's copy bandwidth",
            0.85, "the normalized value has a single elementwise consumer chain; per-row work fuses into the norm kernel",
            "store-replay", signature=f"{ng.how}:{consumers}",
            summary=f"norm ({ng.how}) then {describe_ops(g, chain + side)}: fuse into one kernel" + (f" feeding {'/'.join(feeds)}" if feeds else ""),
            facts={"consumers": consumers, "feeds": feeds, "norm": ng.how}))
    return out
