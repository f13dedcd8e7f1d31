"""fuse-elementwise-chain: memory-bound elementwise ops that hand each other intermediates nobody
else reads, so one kernel could do them all.

- "gated-activation": mul(act(a), b) where a and b are two parts of one GEMM output (the GLU /
  SwiGLU intermediate): one kernel (or the GEMM's epilogue) reads the GEMM output once and writes
  the product, instead of writing act(a) and reading it back.
- "chain": a connected group of >= 3 elementwise/cast/copy ops in which every intermediate has a
  single consumer inside the group.
"""
from __future__ import annotations

from bot.analyze.cost import fused_gain
from bot.analyze.graph import kind
from bot.analyze.opportunity import Finding
from bot.analyze.detectors.common import anchor_of, describe_ops

KIND = "fuse-elementwise-chain"
UNARY_ACTS = {"silu", "gelu", "relu", "sigmoid", "tanh", "mish", "hardswish", "softplus", "leaky_relu", "silu_", "gelu_"}
MIN_CHAIN = 3
ELIGIBLE = ("pointwise", "cast", "copy")


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    out = []
    # --- gated activations
    for o in g.ops:
        if o.name != "mul" or o.alias or not ctx.free(o.id) or len(o.inputs) != 2:
            continue
        srcs = []
        act_op = None
        for v in o.inputs:
            p = g.producer.get(v)
            if p is not None and p.name in UNARY_ACTS and ctx.free(p.id):
                act_op = p
                v = p.inputs[0]
            srcs.append(g.source_op(v))
        if act_op is None or srcs[0] is None or srcs[0] is not srcs[1] or kind(srcs[0]) != "gemm":
            continue
        gemm = srcs[0]
        ids = [act_op.id, o.id]
        gain, measured, nbytes = fused_gain(g, cost, ids)
        epi = cost.bytes_ms(2 * g.nbytes(gemm.outputs[0]))
        ctx.claim(ids)
        out.append(Finding(
            KIND, "gated-activation", ids, act_op.id, gain,
            f"{measured:.4f} ms measured for {act_op.name} and mul, minus one pass moving {nbytes / 1e6:.3f} MB at the "
            f"profile's copy bandwidth; in the GEMM epilogue a further {epi:.4f} ms (the [.., 2H] write and read)",
            0.85, "both halves of one GEMM output meet in act(a) * b", "store-replay",
            signature=f"glu:{act_op.name}",
            summary=f"gated activation {act_op.name}(a) * b on halves of one GEMM output: the intermediate is written and "
                    f"read back; fuse (or put in the GEMM epilogue)",
            facts={"activation": act_op.name, "gemm_out_shape": g.values[gemm.outputs[0]]["shape"],
                   "epilogue_extra_ms": round(epi, 5)}))
    # --- general chains: union of producer->consumer edges with a single consumer
    # ops inside a normalization (hand-written RMSNorm) are a norm, not a free chain
    elig = {o.id for o in g.ops if not o.alias and kind(o) in ELIGIBLE and ctx.free(o.id) and o.outputs
            and o.id not in g.norm_of_op}
    parent = {i: i for i in elig}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in sorted(elig):  # op order, so the components and their order do not depend on set layout
        o = g.ops[i]
        for v in o.outputs:
            cons = g.real_consumers(v)
            if len(cons) == 1 and cons[0].id in elig and cons[0].pass_idx == o.pass_idx:
                parent[find(i)] = find(cons[0].id)
    comps: dict[int, list[int]] = {}
    for i in sorted(elig):
        comps.setdefault(find(i), []).append(i)
    for ids in comps.values():
        if len(ids) < MIN_CHAIN:
            continue
        gain, measured, nbytes = fused_gain(g, cost, ids)
        ctx.claim(ids)
        ops_desc = describe_ops(g, ids)
        out.append(Finding(
            KIND, "chain", sorted(ids), anchor_of(g, ids), gain,
            f"{measured:.4f} ms measured for {len(ids)} ops, minus one pass moving {nbytes / 1e6:.3f} MB at the "
            f"profile's copy bandwidth", 0.7, "intermediates have a single consumer inside the group",
            "compile-region", signature=ops_desc,
            summary=f"{len(ids)} memory-bound ops in a row ({ops_desc[:110]}): fuse into one kernel",
            facts={"ops": ops_desc}))
    return out
