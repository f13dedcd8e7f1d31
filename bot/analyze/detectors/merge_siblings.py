"""merge-siblings: GEMMs with parameter weights that read the same activation (Q/K/V projections,
the text stream's added Q/K/V, per-block modulation projections of one embedding).

"The same activation" is decided by data flow: the activation operands resolve (through views that
keep every element) to one value, or to values with one value number (the same op on the same
inputs, computed more than once). Concatenating the weights at load time makes one GEMM that reads
the input once and launches once.

Estimate: the siblings' measured time minus the merged GEMM's time, where the merged GEMM is priced
at its roofline (max of FLOPs at the measured matmul rate, bytes at the measured copy bandwidth)
divided by the best efficiency any GEMM of similar size reached in this profile.
"""
from __future__ import annotations

from collections import defaultdict

from bot.analyze.graph import kind
from bot.analyze.opportunity import Finding

KIND = "merge-siblings"


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    groups: dict[tuple, list] = defaultdict(list)
    info = {}
    for o in g.ops:
        if kind(o) != "gemm" or not ctx.free(o.id):
            continue
        act, w, bias = g.gemm_operands(o)
        if w is None:
            continue
        r = g.root(act)
        groups[(o.pass_idx, g.values[r]["vn"])].append(o)
        info[o.id] = (act, w, bias)
    effs = _efficiencies(g, cost)
    out = []
    for (pidx, _), ops in groups.items():
        weights = {g.root(info[o.id][1]) for o in ops}
        if len(ops) < 2 or len(weights) < 2:
            continue
        ids = [o.id for o in ops]
        measured = cost.ms(ids)
        flops = sum(g.gemm_flops(o) for o in ops)
        act = info[ops[0].id][0]
        merged_bytes = g.nbytes(act) + sum(g.nbytes(info[o.id][1]) + g.nbytes(o.outputs[0]) for o in ops)
        ideal = max(cost.flops_ms(flops), cost.bytes_ms(merged_bytes))
        sib_eff = [effs[i] for i in ids if i in effs]
        near = [e for oid, e in effs.items() if 0.5 * flops <= g.gemm_flops(g.ops[oid]) <= 2 * flops]
        eff = min(1.0, max(sib_eff + near, default=0.0))
        if eff <= 0:
            continue
        merged_ms = ideal / eff
        gain = max(0.0, measured - merged_ms)
        shape = g.values[act]["shape"]
        ns = [g.values[o.outputs[0]]["shape"][-1] for o in ops]
        patterns = sorted({o.pattern for o in ops})
        out.append(Finding(
            KIND, "shared-input-gemms", ids, ops[0].id, gain,
            f"{measured:.4f} ms measured for {len(ops)} GEMMs; merged GEMM priced at {merged_ms:.4f} ms "
            f"(roofline {ideal:.4f} ms / best efficiency {eff:.2f} of similar GEMMs in this profile)",
            0.85, "the GEMMs read one activation (data flow, not names); weights concatenate at load time",
            "store-replay", signature="|".join(patterns),
            summary=f"{len(ops)} GEMMs read the same input [{'x'.join(map(str, shape))}] -> N = {'+'.join(map(str, ns[:6]))}"
                    f"{'+...' if len(ns) > 6 else ''}: merge into one GEMM",
            facts={"members": [o.module for o in ops][:12], "n_out": ns[:12], "input_shape": shape,
                   "has_bias": [info[o.id][2] is not None for o in ops][:12], "pass": pidx}))
    return out


def _efficiencies(g, cost) -> dict[int, float]:
    """Per GEMM op: roofline time / measured time (how close to the ceilings it ran)."""
    eff = {}
    for o in g.ops:
        if kind(o) != "gemm":
            continue
        ms = cost.op_ms.get(o.id, 0.0)
        if ms <= 0:
            continue
        nbytes = sum(g.nbytes(v) for v in o.inputs) + sum(g.nbytes(v) for v in o.outputs)
        ideal = max(cost.flops_ms(g.gemm_flops(o)), cost.bytes_ms(nbytes))
        if ideal > 0:
            eff[o.id] = min(1.0, ideal / ms)
    return eff
