"""Load a captured step graph (runner/graph_capture.py) and answer structural questions about it.

Pure Python (the bot never imports torch). Every classification here is by aten op and by data
flow, never by a model's class or module names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from runner.module_pattern import module_pattern  # the profile's rule, so opportunities and kernel rows group alike

GEMM_OPS = {"linear", "mm", "addmm", "bmm", "baddbmm", "matmul", "_scaled_mm", "_addmm_activation", "conv1d",
            "conv2d", "conv3d", "convolution", "_convolution", "einsum"}
NORM_OPS = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm", "native_group_norm",
            "batch_norm", "instance_norm"}
REDUCTION_OPS = {"mean", "sum", "var", "var_mean", "std", "amax", "amin", "max", "min", "norm", "linalg_vector_norm",
                 "softmax", "_softmax", "log_softmax", "any", "all", "prod", "logsumexp", "argmax", "argmin"}
POINTWISE_OPS = {"add", "sub", "mul", "div", "neg", "silu", "gelu", "relu", "sigmoid", "tanh", "exp", "log", "sin",
                 "cos", "pow", "rsqrt", "sqrt", "reciprocal", "where", "clamp", "clamp_min", "clamp_max", "abs",
                 "masked_fill", "addcmul", "addcdiv", "lerp", "square", "erf", "gelu_", "silu_", "add_", "mul_",
                 "div_", "sub_", "hardswish", "mish", "softplus", "leaky_relu", "maximum", "minimum", "sign",
                 "floor", "ceil", "round", "exp2", "log1p", "expm1", "fill", "rsub", "copysign", "eq", "ne", "gt",
                 "lt", "ge", "le", "logical_not", "logical_and", "logical_or", "bitwise_not", "outer"}
CAST_OPS = {"to", "_to_copy", "type_as", "float", "half", "bfloat16", "_to_dtype"}
COPY_OPS = {"cat", "stack", "clone", "contiguous", "copy_", "copy", "repeat", "repeat_interleave", "reshape",
            "index", "index_select", "gather", "_unsafe_view", "flatten", "expand_copy", "narrow_copy", "tile",
            "split_with_sizes_copy", "constant_pad_nd", "pad", "roll", "flip", "lift_fresh"}
FACTORY_OPS = {"ones", "zeros", "full", "empty", "arange", "ones_like", "zeros_like", "full_like", "empty_like",
               "new_zeros", "new_ones", "new_full", "new_empty", "scalar_tensor", "linspace", "eye", "tensor",
               "empty_strided", "randn", "rand"}
QUANT_HINTS = ("quant", "fp8", "float8", "_scaled_mm", "e4m3")
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "b8": 1,
               "c64": 8, "c128": 16, "f8": 1}


def base_name(op: str) -> str:
    """aten::add_ -> add_ ; aten::linear -> linear."""
    return op.split("::")[-1]


def op_family(op: str) -> str:
    """A name that the profile's op and the graph's op share, e.g. aten::linear and aten::addmm ->
    gemm; aten::to and aten::copy_ -> copy (a cast launches a copy kernel)."""
    b = base_name(op).strip("_")
    if "attention" in b or "scaled_dot_product" in b or b.startswith("flash_attn"):
        return "attention"
    if b in GEMM_OPS or b in ("scaled_mm", "addmm_activation"):
        return "gemm"
    if b in ("layer_norm", "native_layer_norm"):
        return "layer_norm"
    if b in ("rms_norm", "fused_rms_norm"):
        return "rms_norm"
    if b in ("group_norm", "native_group_norm"):
        return "group_norm"
    if b in ("ones", "zeros", "full", "ones_like", "zeros_like", "full_like", "new_zeros", "new_ones", "new_full",
             "fill", "zero", "scalar_tensor"):
        return "fill"  # a factory op launches a fill kernel (aten::fill_ in the profile)
    if b in ("to", "to_copy", "type_as", "copy", "clone", "contiguous", "copy_from", "reshape", "unsafe_view",
             "float", "half", "bfloat16"):
        return "copy"
    return b


@dataclass
class Op:
    id: int
    op: str
    module: str
    module_class: str
    src: str
    pass_idx: int
    inputs: list[int]
    arg_names: list[str]
    outputs: list[int]
    scalars: dict
    alias: bool
    host: bool
    xdev: bool
    mask: dict | None
    call_site: str = ""  # the engine line that called the op's module
    # new values an in-place write gave to tensors it did not return: the buffer a slice of it was
    # written through, other views of that storage (runner/graph_capture.py, "In-place writes")
    writes: list[int] = field(default_factory=list)
    alloc: bool = False  # torch.empty and kin: uninitialized memory, no work (runner/graph_capture.py)

    @property
    def name(self) -> str:
        return base_name(self.op)

    @property
    def pattern(self) -> str:
        return module_pattern(self.module)


@dataclass
class Graph:
    raw: dict
    ops: list[Op]
    values: list[dict]
    labels: list[str]
    norm_groups: list["NormGroup"] = field(default_factory=list)

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> "Graph":
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def from_json(cls, raw: dict) -> "Graph":
        mods, srcs = raw["modules"], raw["sources"]
        ops = []
        for o in raw["ops"]:
            m = mods[o["m"]] if o["m"] >= 0 else ["", "", "", ""]
            ops.append(Op(id=o["id"], op=o["op"], module=m[0], module_class=m[1],
                          src=srcs[o["s"]] if o["s"] >= 0 else "", pass_idx=o["p"], inputs=o["in"],
                          arg_names=o.get("an", []), outputs=o["out"], scalars=o.get("sc", {}),
                          alias=bool(o.get("alias")), host=bool(o.get("host")), xdev=bool(o.get("xdev")),
                          mask=o.get("mask"), call_site=m[3] if len(m) > 3 else "", writes=o.get("wr", []),
                          alloc=bool(o.get("alloc"))))
        g = cls(raw=raw, ops=ops, values=raw["values"], labels=raw["labels"])
        g.norm_groups = find_norms(g)
        return g

    # ---- indices -----------------------------------------------------------------------
    @cached_property
    def producer(self) -> dict[int, Op]:
        return {v: o for o in self.ops for v in o.outputs + o.writes}

    @cached_property
    def consumers(self) -> dict[int, list[Op]]:
        cons: dict[int, list[Op]] = {}
        for o in self.ops:
            for v in dict.fromkeys(o.inputs):
                cons.setdefault(v, []).append(o)
        return cons

    @cached_property
    def norm_of_op(self) -> dict[int, "NormGroup"]:
        return {oid: ng for ng in self.norm_groups for oid in ng.op_ids}

    def label_mask(self, *names: str) -> int:
        m = 0
        for n in names:
            if n in self.labels:
                m |= 1 << self.labels.index(n)
        return m

    def deps(self, vid: int) -> set[str]:
        d = self.values[vid]["deps"]
        return {n for i, n in enumerate(self.labels) if d >> i & 1}

    def op_deps(self, op: Op) -> int:
        """What the op's results depend on: its outputs and, for an in-place write, the buffers it
        changed (a write into a prompt-dependent buffer is not prompt-independent work)."""
        d = 0
        for v in op.outputs + op.writes:
            d |= self.values[v]["deps"]
        return d

    # ---- sizes -------------------------------------------------------------------------
    def numel(self, vid: int) -> int:
        n = 1
        for s in self.values[vid]["shape"]:
            n *= s
        return n

    def nbytes(self, vid: int) -> int:
        return self.numel(vid) * DTYPE_BYTES.get(self.values[vid]["dtype"], 4)

    def op_bytes(self, op: Op) -> int:
        """Bytes a standalone kernel for this op moves: inputs read once, outputs written once."""
        if op.alias:
            return 0
        return sum(self.nbytes(v) for v in dict.fromkeys(op.inputs)) + sum(self.nbytes(v) for v in op.outputs)

    def gemm_flops(self, op: Op) -> int:
        if kind(op) != "gemm" or not op.outputs:
            return 0
        ins = [v for v in op.inputs]
        out = op.outputs[0]
        if op.name in ("addmm", "baddbmm") and len(ins) >= 3:
            a = ins[1]
        else:
            a = ins[0]
        k = self.values[a]["shape"][-1] if self.values[a]["shape"] else 1
        return 2 * self.numel(out) * k

    # ---- data-flow helpers --------------------------------------------------------------
    def root(self, vid: int) -> int:
        """Follow alias ops that keep every element (view, reshape, permute, unsqueeze, a no-op cast)
        back to the value that holds the data. Slices and chunks stop the walk: they are parts."""
        seen = 0
        while seen < 64:
            p = self.producer.get(vid)
            if p is None or not p.alias or not p.inputs or len(p.outputs) != 1:
                return vid
            src = p.inputs[0]
            if self.numel(vid) < self.numel(src):
                return vid
            vid, seen = src, seen + 1
        return vid

    def source_op(self, vid: int) -> Op | None:
        """The op that computed the data of `vid`, looking through every alias op (slices too)."""
        seen = 0
        p = self.producer.get(vid)
        while p is not None and p.alias and p.inputs and seen < 64:
            p = self.producer.get(p.inputs[0])
            seen += 1
        return p

    def real_consumers(self, vid: int) -> list[Op]:
        """Ops that do work on `vid`'s data, looking through alias ops (views, slices, no-op casts)."""
        out, stack, seen = [], [vid], set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            for c in self.consumers.get(v, []):
                if c.alias:
                    stack.extend(c.outputs)
                elif c not in out:
                    out.append(c)
        return out

    def is_weight(self, vid: int) -> bool:
        r = self.root(vid)
        return self.values[r]["origin"].startswith("weight:") or self.values[vid]["origin"].startswith("weight:")

    def gemm_operands(self, op: Op) -> tuple[int | None, int | None, int | None]:
        """(activation, weight, bias) of a GEMM whose weight is a parameter; Nones otherwise."""
        ins = op.inputs
        if op.name in ("linear",) and len(ins) >= 2:
            act, w = ins[0], ins[1]
            bias = ins[2] if len(ins) > 2 else None
        elif op.name in ("addmm",) and len(ins) >= 3:
            bias, act, w = ins[0], ins[1], ins[2]
        elif op.name in ("mm", "matmul", "bmm") and len(ins) >= 2:
            act, w, bias = ins[0], ins[1], None
            if self.is_weight(act) and not self.is_weight(w):
                act, w = w, act
        else:
            return None, None, None
        if not self.is_weight(w):
            return None, None, None
        return act, w, bias

    def is_small(self, vid: int, ref: int) -> bool:
        """`vid` broadcasts against `ref` over at least one dimension of size > 1 (a per-channel or
        per-sample vector: bias, scale, shift, gate)."""
        return self.numel(vid) * 2 <= self.numel(ref)


def kind(op: Op) -> str:
    """gemm | attention | norm | reduction | pointwise | cast | copy | factory | view | quant | other"""
    if op.alias:
        return "view"
    n = op.name
    b = n.lstrip("_")
    fam = op_family(op.op)
    if fam == "attention":
        return "attention"
    if fam == "gemm":
        return "gemm"
    if any(h in n for h in QUANT_HINTS):
        return "quant"
    if n in NORM_OPS or b in NORM_OPS:
        return "norm"
    if n in CAST_OPS or b in CAST_OPS:
        return "cast"
    if n in REDUCTION_OPS or b in REDUCTION_OPS:
        return "reduction"
    if n in POINTWISE_OPS or n.rstrip("_") in POINTWISE_OPS or b in POINTWISE_OPS:
        return "pointwise"
    if n in COPY_OPS or b in COPY_OPS:
        return "copy"
    if n in FACTORY_OPS or b in FACTORY_OPS or not op.inputs:
        return "factory"
    return "other"


MEMORY_BOUND = ("pointwise", "cast", "copy", "reduction", "norm", "quant")


@dataclass
class NormGroup:
    """A normalization: one norm op, or the ops of a hand-written one (pow, mean, rsqrt, mul...)."""
    op_ids: list[int]
    input: int  # value normalized
    output: int  # normalized value (after the gain, when the norm has one)
    how: str  # "op" | "rms-pattern"


def find_norms(g: Graph) -> list[NormGroup]:
    groups = []
    for o in g.ops:
        if kind(o) == "norm" and o.outputs and o.inputs:
            groups.append(NormGroup([o.id], o.inputs[0], o.outputs[0], "op"))
    # Hand-written RMSNorm: r = rsqrt(mean(x^2, -1) + eps); y = x * r [* w]; with optional casts.
    for o in g.ops:
        if o.name != "rsqrt" or not o.inputs:
            continue
        ids = [o.id]
        p = g.producer.get(o.inputs[0])
        if p is not None and p.name == "add" and p.inputs:
            ids.append(p.id)
            p = g.producer.get(p.inputs[0])
        if p is None or p.name not in ("mean", "sum") or not p.inputs:
            continue
        ids.append(p.id)
        sq = g.producer.get(p.inputs[0])
        if sq is None or sq.name not in ("pow", "square", "mul") or not sq.inputs:
            continue
        ids.append(sq.id)
        x = sq.inputs[0]
        # the mul by r
        muls = [c for c in g.real_consumers(o.outputs[0]) if c.name == "mul"]
        if not muls:
            continue
        m = muls[0]
        ids.append(m.id)
        out = m.outputs[0]
        # optional gain (a weight vector) and cast back
        for _ in range(3):
            nxt = g.real_consumers(out)
            if len(nxt) != 1:
                break
            c = nxt[0]
            other = [v for v in c.inputs if g.root(v) != g.root(out)]
            if c.name == "mul" and other and all(g.is_weight(v) for v in other):
                ids.append(c.id)
                out = c.outputs[0]
            elif kind(c) == "cast" and len(c.outputs) == 1:
                ids.append(c.id)
                out = c.outputs[0]
            else:
                break
        # a cast feeding the norm belongs to it too
        src = g.producer.get(x)
        if src is not None and kind(src) == "cast":
            ids.append(src.id)
            x = src.inputs[0]
        groups.append(NormGroup(sorted(ids), x, out, "rms-pattern"))
    return groups
