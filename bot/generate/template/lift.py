"""Lift one opportunity instance from the captured graph into a row program (SSA nodes).

The program is what one Triton program per row computes: its inputs are full rows ([..., N], the
output's shape), broadcast rows ([B, 1, N], [N]: read with stride 0 over the missing dims) or
per-tensor scalars; its nodes come from a fixed table of elementwise ops, the norms and a mean/sum
over the last (contiguous) dimension. Anything else is refused with a reason, so the caller can
hand the opportunity to the agent instead. Pure Python over bot/analyze/graph.py (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bot.analyze.graph import Graph, Op
from bot.analyze.opportunity import Opportunity

UNARY = {"neg", "tanh", "sigmoid", "silu", "gelu", "exp", "rsqrt"}
BINARY = {"add", "sub", "mul", "div", "rsub"}
CASTS = {"to", "_to_copy", "type_as", "float", "half", "bfloat16"}
NORMS = {"layer_norm", "rms_norm"}
REDUCE = {"mean", "sum"}
VIEWS_OK = CASTS  # alias ops lifted as nodes (a cast that is a no-op in the captured dtype)
MAX_RANK = 4  # the kernel indexes rows by up to 3 leading dims
# aten::rms_norm with eps=None uses the dtype's machine epsilon
FINFO_EPS = {"f32": 1.1920928955078125e-07, "bf16": 0.0078125, "f16": 0.0009765625}


class Refused(Exception):
    """The instance is outside what the template covers; str() is the reason."""


@dataclass(frozen=True)
class Input:
    name: str  # a0, a1, ... : the kernel's argument order
    value: int  # graph value id
    role: str  # "row" (full [..., N]) | "bcast" (broadcast over some dims)
    shape: tuple[int, ...]
    dtype: str  # graph dtype: f32, bf16, ...
    origin: str = ""  # the graph's origin of the value, e.g. "weight:blocks.0.norm.weight" for a parameter
    contig: bool = True  # as captured: a slice of a wider row (x[..., :half]) is not


@dataclass(frozen=True)
class Node:
    name: str  # t0, t1, ...
    op: str  # a key of UNARY | BINARY | CASTS->"cast" | NORMS | REDUCE | "pow"
    args: tuple  # node/input names (str) or Python float constants
    op_id: int  # the graph op it replays
    attrs: dict = field(default_factory=dict)  # eps, exponent, approximate, dtype, weight/bias names
    per_row: bool = False  # a reduction result: one number per row (broadcasts over the row)
    f32: bool = False  # computed in an explicit float32 (after .float()): never rounded to the activation dtype


@dataclass(frozen=True)
class Program:
    inputs: list[Input]
    nodes: list[Node]
    output: str  # the node whose value the instance hands on
    out_value: int
    out_shape: tuple[int, ...]
    n: int  # the row length (last dim)
    op_ids: list[int]  # graph ops replaced (the lifted casts included)
    src: str  # "file:line" shared by all ops, or "" when they come from several lines
    srcs: list[str]
    module: str  # module path of the instance's statement (the caller: the shortest of its ops' modules)
    norm_modules: dict[str, str]  # node name -> submodule that ran it (self.norm(x), self.gate_fn(x) in the source)

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)


def instances(g: Graph, opp: Opportunity) -> list[list[int]]:
    """The opportunity's op ids (a union over its repeated blocks) split into instances: connected
    by data flow, looking through alias ops; in op order."""
    ids = set(opp.op_ids)
    parent = {i: i for i in ids}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in sorted(ids):
        for v in g.ops[i].outputs:
            for c in g.real_consumers(v):
                if c.id in ids:
                    parent[find(i)] = find(c.id)
    comps: dict[int, list[int]] = {}
    for i in sorted(ids):
        comps.setdefault(find(i), []).append(i)
    return sorted(comps.values(), key=lambda c: c[0])


def lift(g: Graph, opp: Opportunity, instance: list[int] | None = None) -> Program:
    ids = sorted(instance if instance is not None else instances(g, opp)[0])
    if opp.kind not in ("fuse-norm-consumer", "fuse-elementwise-chain"):
        raise Refused(f"kind {opp.kind}: the template covers fuse-norm-consumer and fuse-elementwise-chain")
    ops = [g.ops[i] for i in ids]
    # casts the capture saw as aliases (fp32 .float()) sit between the instance's ops: lift them too
    lifted = set(ids)
    for o in list(ops):
        for v in o.inputs:
            p = g.producer.get(v)
            while p is not None and p.alias and p.name in VIEWS_OK and p.id not in lifted and p.inputs:
                lifted.add(p.id)
                p = g.producer.get(p.inputs[0])
    _trim(g, lifted)
    ops = [g.ops[i] for i in sorted(lifted)]
    inside = {v for o in ops for v in o.outputs}
    outs = [v for o in ops for v in o.outputs
            if not g.consumers.get(v) or any(c.id not in lifted for c in g.consumers.get(v, []))]
    if len(outs) != 1:
        raise Refused(f"{len(outs)} values leave the instance (ops {sorted(lifted)}); the template writes one output")
    out = outs[0]
    out_shape = tuple(g.values[out]["shape"])
    if not out_shape or len(out_shape) > MAX_RANK:
        raise Refused(f"output shape {list(out_shape)}: the template takes rank 1-{MAX_RANK}")
    n = out_shape[-1]
    inputs: dict[int, Input] = {}
    names: dict[int, str] = {}  # value id -> node or input name
    nodes: list[Node] = []

    def arg(v: int) -> str:
        if v in names:
            return names[v]
        if v in inside:
            raise Refused(f"value {v} is used before the op that makes it (op order)")
        shp = tuple(g.values[v]["shape"])
        if shp == out_shape:
            role = "row"
        elif _broadcasts(shp, out_shape):
            role = "bcast"
        else:
            raise Refused(f"input value {v} of shape {list(shp)} neither is a row of {list(out_shape)} nor broadcasts to one")
        inp = Input(f"a{len(inputs)}", v, role, shp, g.values[v]["dtype"], g.values[v].get("origin", ""),
                    bool(g.values[v].get("contig", True)))
        inputs[v] = inp
        names[v] = inp.name
        return inp.name

    def f32_of(args) -> bool:
        return any(isinstance(a, str) and a.startswith("t") and _node(nodes, a).f32 for a in args)

    call_modules: dict[str, str] = {}
    for o in ops:
        nm = o.name if o.name == "_to_copy" else o.name.rstrip("_")
        if len(o.outputs) != 1:
            raise Refused(f"op {o.id} {o.op} has {len(o.outputs)} outputs")
        per_row = False
        attrs: dict = {}
        if nm in BINARY:
            if o.scalars.get("alpha", 1) != 1:
                raise Refused(f"op {o.id} {o.op} with alpha={o.scalars['alpha']}")
            if nm == "div" and o.scalars.get("rounding_mode") is not None:
                raise Refused(f"op {o.id} aten::div with rounding_mode={o.scalars['rounding_mode']}")
            args = tuple(_operand(o, k, arg) for k in ("self", "other"))
            op = nm
        elif nm in UNARY:
            args, op = (arg(o.inputs[0]),), nm
            if nm == "gelu":
                attrs["approximate"] = o.scalars.get("approximate", "none")
        elif nm == "pow":
            if len(o.inputs) != 1 or not isinstance(o.scalars.get("exponent"), (int, float)):
                raise Refused(f"op {o.id} aten::pow: the template takes a tensor to a Python-number power")
            args, op, attrs = (arg(o.inputs[0]),), "pow", {"exponent": float(o.scalars["exponent"])}
        elif nm in CASTS:
            dt = g.values[o.outputs[0]]["dtype"]
            args, op, attrs = (arg(o.inputs[0]),), "cast", {"dtype": dt}
        elif nm in NORMS:
            if list(o.scalars.get("normalized_shape", [n])) != [n]:
                raise Refused(f"op {o.id} {o.op} normalizes over {o.scalars.get('normalized_shape')}, not the last dim {n}")
            if nm == "rms_norm" and not o.scalars.get("eps"):
                eps = FINFO_EPS.get(g.values[o.inputs[0]]["dtype"], FINFO_EPS["f32"])
            else:
                eps = float(o.scalars.get("eps", 1e-5))
            args, op, attrs = (arg(o.inputs[0]),), nm, {"eps": eps}  # x first: the kernel's argument order
            extra = dict(zip(o.arg_names[1:], o.inputs[1:]))
            for k in ("weight", "bias"):
                if k in extra:
                    attrs[k] = arg(extra[k])
        elif nm in REDUCE:
            dims = o.scalars.get("dim")
            nd = len(g.values[o.inputs[0]]["shape"])
            if dims is None or [d % nd for d in (dims if isinstance(dims, list) else [dims])] != [nd - 1]:
                raise Refused(f"op {o.id} aten::{nm} over dim {dims}: the template reduces only the last (contiguous) dim")
            if not o.scalars.get("keepdim", False):
                raise Refused(f"op {o.id} aten::{nm} without keepdim: the row shape changes")
            if o.scalars.get("dtype") is not None:
                raise Refused(f"op {o.id} aten::{nm} with dtype=")
            args, op, per_row = (arg(o.inputs[0]),), nm, True
        else:
            raise Refused(f"op {o.id} {o.op} is not in the template's table")
        if op not in REDUCE and op not in NORMS:
            # elementwise on per-row numbers only (the `+ eps` and rsqrt of the RMS pattern) stays per row
            tensors = [a for a in args if isinstance(a, str)]
            per_row = bool(tensors) and all(a.startswith("t") and _node(nodes, a).per_row for a in tensors)
        shp = tuple(g.values[o.outputs[0]]["shape"])
        if not per_row and shp != out_shape and not (op not in NORMS and _broadcasts(shp, out_shape)):
            raise Refused(f"op {o.id} {o.op} makes shape {list(shp)}, not a row of {list(out_shape)}")
        f32 = (attrs.get("dtype") == "f32") if op == "cast" else f32_of(args)
        node = Node(f"t{len(nodes)}", op, args, o.id, attrs, per_row, f32)
        call_modules[node.name] = o.module
        nodes.append(node)
        names[o.outputs[0]] = node.name
    if not any(i.role == "row" for i in inputs.values()):
        raise Refused("no input is a full row (the output's shape): nothing to run one program per row over")
    if nodes[-1].per_row or names.get(out) != nodes[-1].name:
        raise Refused("the instance's output is not its last full-row op")
    srcs = sorted({o.src for o in ops})
    # the statement's module is the caller: the shortest path; ops in its submodules ran inside a
    # module call (self.norm(x), self.gate_fn(x)) that wire.py may match
    module = min((o.module for o in ops), key=lambda m: (len(m.split(".")) if m else 0, m))
    sub = {k: m for k, m in call_modules.items() if m != module}
    return Program(inputs=list(inputs.values()), nodes=nodes, output=nodes[-1].name, out_value=out,
                   out_shape=out_shape, n=n, op_ids=sorted(lifted), src=srcs[0] if len(srcs) == 1 else "",
                   srcs=srcs, module=module, norm_modules=sub)


def _trim(g: Graph, lifted: set[int]) -> None:
    """Leave outside an op whose result reaches the instance only through a view (`(1 + scale)[:, None]`):
    the view changes how it broadcasts, so the viewed value is the kernel's input instead."""
    changed = True
    while changed:
        changed = False
        for i in sorted(lifted):
            o = g.ops[i]
            real_in = [c for v in o.outputs for c in g.real_consumers(v) if c.id in lifted]
            direct_in = [c for v in o.outputs for c in g.consumers.get(v, []) if c.id in lifted]
            if real_in and not direct_in:
                lifted.discard(i)
                changed = True


def _broadcasts(shp: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """shp broadcasts to out_shape ([B, 1, N], [N], [B, 1, 1]): the kernel reads it by stride 0; a
    node of such a shape (the `1 + scale` of a modulation) is recomputed per row, on loaded values."""
    return len(shp) <= len(out_shape) and all(a in (1, b) for a, b in zip(shp[::-1], out_shape[::-1]))


def _node(nodes: list[Node], name: str) -> Node:
    return next(n for n in nodes if n.name == name)


def _operand(o: Op, key: str, arg) -> object:
    """A binary op's `self`/`other`: a tensor input (by schema name) or a Python number."""
    for name, v in zip(o.arg_names, o.inputs):
        if name == key:
            return arg(v)
    if key in o.scalars and isinstance(o.scalars[key], (int, float)) and not isinstance(o.scalars[key], bool):
        return float(o.scalars[key])
    raise Refused(f"op {o.id} {o.op}: operand {key} is neither a tensor nor a number ({o.scalars.get(key)!r})")
