"""hoist-constant: work repeated every step whose result does not change from step to step.

Tiers, by the op's dependency set (union of its inputs' labels):
- "load-time": only weights and constants (casting a weight, building a table from arange):
  compute once when the model loads;
- "per-request": no latents and no timestep, but a per-request input (prompt embedding, text mask,
  position ids, guidance): compute once per generation, not once per denoising step;
- "repeated-in-step": an op whose value number was already computed earlier in the same pass
  (the same op on the same values; e.g. every block rebuilding one mask or one activation of the
  embedding): compute once per step.
Dependencies and value numbers follow in-place writes (runner/graph_capture.py): a buffer made
from a weight and then filled with prompt values is per-request work at best, never load-time.
"""
from __future__ import annotations

from collections import defaultdict

from bot.analyze.graph import kind
from bot.analyze.opportunity import Finding
from bot.analyze.detectors.common import describe_ops, labels_of, region, wrapper_prefix

KIND = "hoist-constant"
TIERS = {
    "load-time": (0.8, "depends only on weights and constants"),
    "per-request": (0.6, "depends on no latents and no timestep: the same in every denoising step of a request "
                         "(needs the caller to keep it between steps)"),
    "repeated-in-step": (0.85, "the same op on the same values was already computed earlier in this pass"),
}


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    prefix = wrapper_prefix(g)
    static = g.label_mask("weights", "const")
    unknown = sum(1 << i for i, n in enumerate(g.labels) if n.startswith("input:"))
    varying = g.label_mask("latents", "timestep") | unknown
    seen_vn: dict[int, set[int]] = defaultdict(set)
    groups: dict[tuple[str, int, str], list] = defaultdict(list)
    for o in g.ops:
        if o.alias or not o.outputs:
            continue
        vns = [g.values[v]["vn"] for v in o.outputs]
        repeated = all(vn in seen_vn[o.pass_idx] for vn in vns)
        seen_vn[o.pass_idx].update(vns)
        # an allocation is no work to hoist: what fills it is an op of its own, or unseen (docs/analyze.md)
        if not ctx.free(o.id) or kind(o) == "view" or o.alloc:
            continue
        d = g.op_deps(o)
        if not (d & ~static):
            tier = "load-time"
        elif not (d & varying):
            tier = "per-request"
        elif repeated:
            tier = "repeated-in-step"
        else:
            continue
        groups[(tier, o.pass_idx, region(o.module, prefix))].append(o)
    out = []
    for (tier, pidx, reg), ops in groups.items():
        ids = [o.id for o in ops]
        conf, why = TIERS[tier]
        labels = sorted({lab for o in ops for lab in labels_of(g, o)})
        ctx.claim(ids)
        out.append(Finding(
            KIND, tier, ids, ops[0].id, cost.ms(ids), f"time of {len(ids)} ops that give the same result every step",
            conf, f"{why} ({', '.join(labels)})", "agent", signature=tier, region=reg,
            summary=f"{tier}: {describe_ops(g, ids)[:120]}",
            facts={"depends_on": labels, "pass": pidx + 1}))
    return out
