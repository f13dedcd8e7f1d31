"""fuse-gemm-epilogue: a GEMM whose only consumer is an activation (GELU, ReLU, SiLU, ...) of its
whole output, as a separate kernel.

The activation reads the GEMM's output back from memory and writes it again; a GEMM with the
activation in its epilogue applies it to the accumulator before the one store (cuBLASLt has GELU
(tanh) and ReLU epilogues, with the bias; a Triton GEMM can apply any). The estimate is the
activation's measured time: the whole pass goes. What it does not price: the GEMM with an epilogue
may run a slower kernel than the plain one (measured on the H200 for Qwen-Image's MLP: 0.445 against
0.426 ms, so 0.036 of the GELU's 0.057 ms were realized: benchmarks/results/h200-qwen-epilogue-20261204/).
"""
from __future__ import annotations

from bot.analyze.graph import kind
from bot.analyze.opportunity import Finding

KIND = "fuse-gemm-epilogue"
ACTIVATIONS = ("gelu", "relu", "silu", "sigmoid", "tanh")


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    out = []
    for o in g.ops:
        if kind(o) != "gemm" or not o.outputs:
            continue
        _, w, bias = g.gemm_operands(o)
        if w is None:  # a GEMM of two activations (attention scores and the like) has no weight epilogue
            continue
        cons = g.real_consumers(o.outputs[0])
        if len(cons) != 1:
            continue
        act = cons[0]
        name = act.name.rstrip("_")
        if name not in ACTIVATIONS or not ctx.free(act.id) or not act.outputs or \
                g.numel(act.outputs[0]) != g.numel(o.outputs[0]):
            continue
        approx = act.scalars.get("approximate") if isinstance(act.scalars, dict) else None
        what = name + (f"(approximate={approx})" if approx else "")
        ms = cost.ms([act.id])
        ctx.claim([act.id])
        out.append(Finding(
            KIND, f"gemm+{name}", [o.id, act.id], act.id, ms,
            f"{ms:.4f} ms measured for the {what} pass, all of it (the GEMM's own time not counted)",
            0.7, f"the GEMM's output has one consumer, the {what} of all of it; an epilogue applies it before the "
                 "store, though the GEMM with an epilogue may run a slower kernel",
            "store-replay", signature=f"{'bias' if bias is not None else 'nobias'}:{what}",
            summary=f"GEMM{' + bias' if bias is not None else ''} then {what} as its own kernel: apply it in the GEMM's epilogue",
            facts={"activation": name, "approximate": approx, "gemm_has_bias": bias is not None}))
    return out
