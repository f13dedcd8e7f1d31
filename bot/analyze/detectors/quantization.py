"""quantization: the activation quantization in front of FP8 GEMMs (issue 16).

An FP8 linear (`_scaled_mm` on a float8 activation with one scale per row) is fed by a quantization
of its input x, as torchao's dynamic recipe and optbot's emulation of it both run it: a scale path
(abs -> amax over the row -> cast / clamp / divide: one float32 scale per token) and a value path
(cast -> divide by the scale -> clamp -> cast to float8). In eager each op is a kernel, and x itself
was written by the op before it (a norm + modulation, an activation) only to be read back here.

Two findings:
- `shared-input`: one x quantized for several FP8 GEMMs (sibling projections of one input): quantize
  once, or merge the GEMMs; the estimate is the measured time of every chain but the first.
- `norm+quant`, `activation+quant`, `quant`: one kernel that computes x's producer (a norm and its
  modulation, an activation, or nothing fusable: the quantization alone) and emits the float8 values
  and per-token scales in the same pass. The estimate is one chain's measured time; that the producer
  then stores 1-byte values instead of x, and the GEMM reads them, is not counted.

A static quantization (one scale per tensor, calibrated ahead: SGLang's ModelOpt FP8) has no scale
path: the GEMM's activation scale is a one-element parameter (copied, cast or broadcast to rows), and the
value path divides by that same parameter, clamps and casts to float8 (`facts["scale"] == "static"`).

Recognized by data flow only: the float8 value feeding the GEMM's first operand and the float32
scale feeding its third, each walked back through pointwise, cast and reduction ops to one source
value, the x both paths start from. A chain that does not close on one x is not a finding. torchao's
recipe (what runs on the GPU) makes the scale in one op of its own, `torchao::choose_scale_float8`
(abs, amax and the division inside), which counts as the row reduction when it gives one scale per row.
"""
from __future__ import annotations

from bot.analyze.graph import Graph, Op, kind
from bot.analyze.opportunity import Finding

KIND = "quantization"
ACTIVATIONS = ("gelu", "silu", "relu", "sigmoid", "tanh")
MAX_STEPS = 12  # ops on one path; the recipes take 3-5
# torchao (0.18) computes a float8 scale in one registered op: abs -> amax over the block (one row
# with PerRow) -> divide by the format's max, as CompositeImplicitAutograd, so inductor decomposes and
# fuses it; the dispatcher, and so the captured graph, sees the one op (torchao::choose_scale_float8)
TORCHAO_SCALE_OPS = ("choose_scale_float8",)


def _step_back(g: Graph, v: int) -> tuple[Op | None, int]:
    """The first non-alias op that produced `v`'s data, and the value it produced (views skipped)."""
    for _ in range(MAX_STEPS):
        p = g.producer.get(v)
        if p is None or not p.alias:
            return p, v
        if not p.inputs:
            return None, v
        v = p.inputs[0]
    return None, v


def _scale_path(g: Graph, scale: int, rows: int) -> tuple[list[int], int] | None:
    """Ops from the per-row scale back to the row reduction (and the abs before it); x's root."""
    ops, v = [], scale
    for _ in range(MAX_STEPS):
        p, _ = _step_back(g, v)
        if p is None or not p.outputs:
            return None
        k = kind(p)
        if p.name in TORCHAO_SCALE_OPS and g.numel(p.outputs[0]) == rows:
            ops.append(p.id)  # abs, amax over the row and the division in one op of torchao's
            return ops, g.root(p.inputs[0])
        if k == "reduction" and p.name in ("amax", "max"):
            ops.append(p.id)
            src, _ = _step_back(g, p.inputs[0])
            if src is not None and src.name == "abs" and g.numel(src.outputs[0]) == g.numel(p.inputs[0]):
                ops.append(src.id)
                return ops, g.root(src.inputs[0])
            return ops, g.root(p.inputs[0])
        if k not in ("pointwise", "cast") or g.numel(p.outputs[0]) != rows:
            return None
        ops.append(p.id)
        tensors = [i for i in p.inputs if g.numel(i) > 1]
        if len(tensors) != 1:
            return None
        v = tensors[0]
    return None


def _value_path(g: Graph, a8: int, x: int) -> list[int] | None:
    """Ops from the float8 value back to x (the same root the scale path reached)."""
    ops, v, n = [], a8, g.numel(a8)
    for _ in range(MAX_STEPS):
        if g.root(v) == x:
            return ops
        p, v = _step_back(g, v)
        if p is None or kind(p) not in ("pointwise", "cast") or g.numel(v) != n:
            return None
        ops.append(p.id)
        big = [i for i in p.inputs if g.numel(i) == n]
        if len(big) != 1:
            return None
        v = big[0]
    return None


def _static_leaf(g: Graph, v: int) -> int | None:
    """The one-element parameter `v` is a copy, view, cast or broadcast of (a static per-tensor scale
    calibrated ahead: ModelOpt FP8's `input_scale`), or None."""
    for _ in range(MAX_STEPS):
        p = g.producer.get(v)
        if p is None:
            ok = g.numel(v) == 1 and g.values[v]["origin"].startswith("weight:")
            return v if ok else None
        if not (p.alias or kind(p) in ("copy", "cast")) or len(p.inputs) != 1:
            return None
        v = p.inputs[0]
    return None


def _static_chain(g: Graph, a8: int, scale: int) -> tuple[int, list[int]] | None:
    """(x's root, the op ids) of a static quantization: x divided (or multiplied) by one fixed scale, the
    GEMM's own, then clamped and cast to float8, with no scale computed from x (SGLang's ModelOpt FP8,
    whose CPU path is these torch ops; on the GPU its Triton kernel is invisible to the capture)."""
    leaf = _static_leaf(g, scale)
    if leaf is None:
        return None
    ops, v, n, scaled = [], a8, g.numel(a8), False
    for _ in range(MAX_STEPS):
        p, v = _step_back(g, v)
        if p is None or kind(p) not in ("pointwise", "cast") or p.name.rstrip("_") in ACTIVATIONS:
            break
        big = [i for i in p.inputs if g.numel(i) == n]
        small = [i for i in p.inputs if g.numel(i) == 1]
        if len(big) != 1 or len(big) + len(small) != len(p.inputs):
            break
        if p.name in ("div", "mul") and small and _static_leaf(g, small[0]) == leaf:
            scaled = True
        ops.append(p.id)
        v = big[0]
    if not scaled or len(ops) < 2:
        return None
    return g.root(v), sorted(ops)


ALLOC_LIKE = ("empty_like", "new_empty", "new_empty_strided")


def _unseen_chain(g: Graph, a8: int, scale: int, rows: int) -> tuple[int, list[int], str] | None:
    """A quantization by a kernel the capture cannot see (SGLang's Triton `_static_quant_fp8` on the
    GPU): the float8 activation is a buffer allocated like x (`empty_like(x, dtype=float8)`) and written
    unseen; its scale is a static parameter ("static") or a per-row buffer written unseen too ("unseen").
    (x's root, [the allocations], how the scale is known)."""
    p = g.producer.get(a8)
    if p is None or not p.alloc or p.name not in ALLOC_LIKE or not p.inputs or g.numel(p.inputs[0]) != g.numel(a8):
        return None
    if _static_leaf(g, scale) is not None:
        return g.root(p.inputs[0]), [p.id], "static"
    sp = g.producer.get(scale)
    if sp is not None and sp.alloc and g.numel(scale) == rows:
        return g.root(p.inputs[0]), sorted({p.id, sp.id}), "unseen"
    return None


def _chain(g: Graph, gemm: Op) -> tuple[int, list[int], str] | None:
    """(x's root, the quantization's op ids, "row" | "static" | "unseen") for an FP8 GEMM fed by a
    per-row quantization, a static one (one scale fixed ahead), or one by a kernel the capture cannot
    see (its ops are the buffers' allocations)."""
    if len(gemm.inputs) < 3 or g.values[gemm.inputs[0]]["dtype"] != "f8":
        return None
    a8, scale = gemm.inputs[0], gemm.inputs[2]
    rows = g.numel(a8) // max(1, (g.values[a8]["shape"] or [1])[-1])
    sp = _scale_path(g, scale, rows)
    if sp is None:
        st = _static_chain(g, a8, scale)
        return (*st, "static") if st is not None else _unseen_chain(g, a8, scale, rows)
    s_ops, x = sp
    v_ops = _value_path(g, a8, x)
    if v_ops is None or g.numel(x) != g.numel(a8):
        return None
    return x, sorted(set(s_ops + v_ops)), "row"


def _producer(g: Graph, x: int) -> tuple[str, str]:
    """(detail, the producing op's name): what a fused kernel would compute before quantizing."""
    p = g.source_op(x)
    first = p.name if p is not None else "input"
    for _ in range(3):  # a norm's modulation (mul, add) sits between it and x
        if p is None:
            break
        if p.id in g.norm_of_op or kind(p) == "norm":
            return "norm+quant", first
        name = p.name.rstrip("_")
        if name in ACTIVATIONS:
            return "activation+quant", first
        if name == "mul" and any((s := g.source_op(i)) is not None and s.name.rstrip("_") in ACTIVATIONS
                                 for i in p.inputs):
            return "activation+quant", first  # a gated activation (SwiGLU: silu(a) * b)
        if kind(p) != "pointwise":
            break
        big = [i for i in p.inputs if g.numel(i) == g.numel(x)]
        if not big:
            break
        p = g.source_op(big[0])
    return "quant", first


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    by_x: dict[int, list[tuple[Op, list[int]]]] = {}
    how: dict[int, str] = {}
    by_id = {o.id: o for o in g.ops}
    for o in g.ops:
        if o.name != "_scaled_mm":
            continue
        c = _chain(g, o)
        if c is None or not all(ctx.free(i) for i in c[1]):
            continue
        by_x.setdefault(c[0], []).append((o, c[1]))
        how[c[0]] = c[2]
    out = []
    for x, chains in by_x.items():
        first = chains[0][1]
        fixed = how[x] == "static"  # one scale calibrated ahead: no scale path, values only
        unseen = all(by_id[i].alloc for i in first)  # its work runs in a kernel the capture cannot see
        width = (g.values[x]["shape"] or [1])[-1]
        if len(chains) > 1:
            rest = sorted({i for _, ids in chains[1:] for i in ids})
            ms = cost.ms(rest)
            ctx.claim(rest)
            out.append(Finding(
                KIND, "shared-input", rest, chains[1][1][-1], ms,
                f"{ms:.4f} ms measured for {len(chains) - 1} repeated quantization chain(s) of one input "
                f"({len(rest)} ops), all of it",
                0.8, f"{len(chains)} FP8 GEMMs quantize the same value (one data-flow root) with the same "
                     "per-row recipe: the scales and float8 values are equal, so one quantization serves all",
                "store-replay", signature=f"x{len(chains)}:k{width}",
                summary=f"the same input quantized to FP8 {len(chains)} times, once per GEMM: quantize once "
                        "(or merge the GEMMs)",
                facts={"gemms": len(chains), "row_len": width, "ops_per_chain": len(first)}))
        detail, prod = _producer(g, x)
        ms = cost.ms(first)
        how_ms = (f"{ms:.4f} ms measured for the {len(first)} quantization ops, all of it (the producer's smaller "
                  "float8 store not counted)")
        if unseen:  # no op of its own carries its time: what it must move (read x, write float8) at the copy rate
            nbytes = g.nbytes(x) + g.numel(x)
            ms = cost.bytes_ms(nbytes)
            how_ms = (f"{ms:.4f} ms for its {nbytes / 1e6:.1f} MB (read x, write float8) at the copy bandwidth: the "
                      "quantization kernel is invisible to the capture, so no measured op carries its time")
        ctx.claim(first)
        names = " -> ".join(dict.fromkeys(by_id[i].name for i in first))
        what = {"norm+quant": f"the normalization ({prod} last)", "activation+quant": f"the activation ({prod})",
                "quant": "one pass"}[detail]
        out.append(Finding(
            KIND, detail, first, first[-1], ms, how_ms,
            0.7, (f"a static FP8 quantization (divide by one scale fixed ahead -> clamp -> float8) between its input's "
                  f"producer ({prod}) and the FP8 GEMM; one kernel can emit the float8 values where the input is "
                  "computed") if fixed else
                 ("a per-row FP8 quantization (abs -> amax scale path, divide -> clamp -> float8 value path) between "
                  f"its input's producer ({prod}) and the FP8 GEMM; one kernel can emit the float8 values and "
                  "scales where the input is computed"),
            "store-replay", signature=f"{detail}:k{width}" + (":static" if fixed else ""),
            summary=(f"FP8 activation quantization in a kernel the capture cannot see (into {names})" if unseen
                     else f"FP8 activation quantization as {len(first)} ops ({names})")
                    + ": emit float8 values " + ("with the static scale " if fixed else "and per-token scales ")
                    + f"from {what}",
            facts={"producer": prod, "row_len": width, "ops": len(first), "scale": how[x], "unseen": unseen}))
    return out
