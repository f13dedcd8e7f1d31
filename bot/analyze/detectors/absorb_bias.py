"""absorb-bias: a bias add, or elementwise work right before a norm or a residual update, that a
neighbouring kernel can absorb.

- "bias-add-after-gemm": an add of a weight-only vector to a GEMM's output, as a separate op:
  the GEMM epilogue adds it for free.
- "gemm-epilogue": a GEMM (with its bias, if it has one) whose output goes through elementwise ops
  (a gate multiply) into a residual add: bias, gate and residual fit in the GEMM's epilogue.
- "add-before-norm": a residual add whose result is normalized next: a fused add+norm kernel saves
  reading the sum back.
"""
from __future__ import annotations

from bot.analyze.graph import kind
from bot.analyze.opportunity import Finding
from bot.analyze.detectors.common import describe_ops

KIND = "absorb-bias"


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    out = []
    static = g.label_mask("weights", "const")
    # 1. standalone bias add after a GEMM
    for o in g.ops:
        if o.name not in ("add", "add_") or o.alias or not ctx.free(o.id) or len(o.inputs) < 2:
            continue
        a, b = o.inputs[0], o.inputs[1]
        for big, small in ((a, b), (b, a)):
            src = g.source_op(big)
            d = g.values[small]["deps"]
            if src is not None and kind(src) == "gemm" and g.is_small(small, big) and d and not (d & ~static):
                ctx.claim([o.id])
                out.append(Finding(KIND, "bias-add-after-gemm", [src.id, o.id], o.id, cost.ms([o.id]),
                                   "time of the separate bias add", 0.9,
                                   "adds a weight-only vector to a GEMM output", "store-replay", signature="bias",
                                   summary="bias added by a separate kernel after the GEMM: put it in the GEMM epilogue"))
                break
    # 2. GEMM -> (gate) -> residual add
    for o in g.ops:
        if kind(o) != "gemm" or not o.outputs:
            continue
        act, w, bias = g.gemm_operands(o)
        if w is None:
            continue
        cur, chain, resid = o.outputs[0], [], None
        while len(chain) < 4:
            cons = g.real_consumers(cur)
            if len(cons) != 1 or not ctx.free(cons[0].id) or kind(cons[0]) not in ("pointwise", "cast"):
                break
            c = cons[0]
            if not c.outputs or g.numel(c.outputs[0]) != g.numel(cur):
                break
            chain.append(c.id)
            full_others = [v for v in c.inputs if g.root(v) != g.root(cur) and not g.is_small(v, cur)]
            if c.name in ("add", "add_", "sub") and full_others:
                resid = full_others[0]
                break
            cur = c.outputs[0]
        if resid is None or not chain:
            continue
        smalls = {g.root(v) for i in chain for v in g.ops[i].inputs if g.is_small(v, o.outputs[0])}
        extra = g.nbytes(resid) + sum(g.nbytes(v) for v in smalls)
        ms = cost.ms(chain)
        gain = max(0.0, ms - cost.bytes_ms(extra))
        ctx.claim(chain)
        has_bias = bias is not None
        what = ("bias, " if has_bias else "") + describe_ops(g, chain)
        out.append(Finding(KIND, "gemm-epilogue", [o.id] + chain, chain[0], gain,
                           f"{ms:.4f} ms measured for {describe_ops(g, chain)}, minus reading the residual and "
                           f"side vectors ({extra / 1e6:.3f} MB) in the epilogue",
                           0.75, "a GEMM output whose only consumers are elementwise ops ending in a residual update",
                           "store-replay", signature=f"{'bias' if has_bias else 'nobias'}:{describe_ops(g, chain)}",
                           summary=f"GEMM then {describe_ops(g, chain)} into the residual: absorb {what} into the GEMM epilogue",
                           facts={"gemm_has_bias": has_bias, "chain": describe_ops(g, chain)}))
    # 3. residual add right before a norm
    for ng in g.norm_groups:
        p = g.producer.get(ng.input)
        while p is not None and p.alias and p.inputs:
            p = g.producer.get(p.inputs[0])
        if p is None or p.name not in ("add", "add_") or not ctx.free(p.id) or not p.outputs:
            continue
        if len(p.inputs) < 2 or any(g.is_small(v, p.outputs[0]) for v in p.inputs):
            continue
        saved = cost.bytes_ms(g.nbytes(p.outputs[0]))
        gain = min(cost.ms([p.id]), saved)
        ctx.claim([p.id])
        out.append(Finding(KIND, "add-before-norm", [p.id] + list(ng.op_ids), p.id, gain,
                           "reading the sum back, at the profile's copy bandwidth (capped at the add's own time)",
                           0.7, "a residual add whose result is normalized next", "store-replay", signature="add-norm",
                           summary="residual add followed by a norm: fuse into one add+norm kernel"))
    return out
