"""A model's forward inputs, declared in its workload file (`inputs:`), parsed and evaluated here.

Models are data (DESIGN decision 15): a workload file says which keyword arguments the model's
forward takes, each one's shape as an expression of the preset's dimensions, its dtype, how it is
made, and what changes in the unconditional pass of classifier-free guidance. This module is
torch-free: the bot parses and checks a declaration at load time (bot/workload.py) and the runner
makes the tensors from the same declaration (runner/inputs.py).

Expressions are a small, safe subset of Python, evaluated over names, never `eval`:
  batch, height, width, frames, text_tokens   the preset's shape (pixels; frames 1 for images)
  <dim>                                       every name under `inputs.dims`, in order
  config.<key>                                the preset's model config
  step.<key>                                  the workload's step (timestep, guidance, ...)
with integer and float literals, strings, True/False/None, + - * / // % **, comparisons, and/or/not,
a if c else b, tuples and lists (a list times an integer repeats it, as in Python).
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field
from typing import Any

# How an input is made (runner/inputs.py does each):
#   randn     seeded standard normal, drawn on the CPU in declaration order, then moved
#   full      every element `value`
#   timestep  every element step.timestep * step.timestep_scale (shape default [batch])
#   grid      position ids: the cartesian product of arange(n) over `axes`, shape [prod(axes), len(axes)]
#   literal   a Python value (`value`, strings evaluated as expressions), e.g. [(1, h, w)] * batch
#   hook      `function` of the workload's `hooks` file, for what no declaration can express
MAKES = ("randn", "full", "timestep", "grid", "literal", "hook")
# What the unconditional pass of true CFG gets: the same value, a fresh seeded draw, or zeros.
CFG_RULES = ("same", "redraw", "zeros")
DTYPES = ("model", "float32", "bfloat16", "float16", "int64", "int32", "bool")
FLOAT_DTYPES = ("model", "float32", "bfloat16", "float16")
BASE_DIMS = ("batch", "height", "width", "frames", "text_tokens")

# Roles label step inputs in the captured graph (runner/graph_capture.py): the detectors ask what a
# value depends on (a value that depends on "prompt" differs between CFG passes). An input's role
# is its `role:` key, else its keyword's default here, else "input:<name>" (treated as prompt-side).
ROLES = ("latents", "prompt", "text_mask", "timestep", "guidance", "pos_ids")
DEFAULT_ROLES = {
    "hidden_states": "latents", "x": "latents", "latents": "latents", "sample": "latents", "img": "latents",
    "encoder_hidden_states": "prompt", "context": "prompt", "prompt_embeds": "prompt", "txt": "prompt",
    "pooled_projections": "prompt", "y": "prompt", "encoder_hidden_states_image": "prompt",
    "encoder_hidden_states_mask": "text_mask", "encoder_attention_mask": "text_mask", "attention_mask": "text_mask",
    "txt_mask": "text_mask",
    "timestep": "timestep", "timesteps": "timestep", "t": "timestep",
    "guidance": "guidance",
    "img_ids": "pos_ids", "txt_ids": "pos_ids", "position_ids": "pos_ids", "image_rotary_emb": "pos_ids",
    "freqs_cis": "pos_ids",
}


class SpecError(Exception):
    """A declaration mistake: `key` is the dotted path under the workload's top level."""

    def __init__(self, key: str, value: Any, expected: str):
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"key {key!r}: got {value!r}; expected {expected}")


# --------------------------------------------------------------------------------------------
# expressions

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge}
_NAMESPACES = ("config", "step")


class ExprError(Exception):
    pass


@dataclass(frozen=True)
class Expr:
    """A parsed expression; `names` are the plain names and `refs` the config./step. keys it reads."""
    text: str
    tree: ast.Expression = field(compare=False, repr=False)
    names: frozenset[str] = frozenset()
    refs: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def parse(cls, text: str) -> "Expr":
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as e:
            raise ExprError(f"not an expression ({e.msg})") from None
        names, refs = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                if not (isinstance(node.value, ast.Name) and node.value.id in _NAMESPACES):
                    raise ExprError("attributes only as config.<key> or step.<key>")
                refs.add((node.value.id, node.attr))
            elif isinstance(node, ast.Name):
                if node.id not in _NAMESPACES:
                    names.add(node.id)
            elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Tuple, ast.List,
                                       ast.Compare, ast.BoolOp, ast.IfExp, ast.Load, ast.USub, ast.UAdd, ast.Not,
                                       ast.And, ast.Or, *_BINOPS, *_CMPOPS)):
                raise ExprError(f"{type(node).__name__} is not allowed in an expression")
        # a bare `config` or `step` (not followed by .key) reads a whole mapping: refuse it
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in _NAMESPACES:
                parent_ok = any(isinstance(p, ast.Attribute) and p.value is node for p in ast.walk(tree))
                if not parent_ok:
                    raise ExprError(f"{node.id} alone is a mapping; write {node.id}.<key>")
        return cls(text, tree, frozenset(names), frozenset(refs))

    def eval(self, env: "Env") -> Any:
        return _eval(self.tree.body, env)


@dataclass
class Env:
    """What expressions read: dimensions by name, the preset's config, the step."""
    dims: dict[str, Any]
    config: dict[str, Any]
    step: dict[str, Any]


def _eval(node, env: Env):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[node.id]
        if node.id not in env.dims:
            raise ExprError(f"unknown name {node.id!r}; known: {', '.join(env.dims)}, config.<key>, step.<key>")
        return env.dims[node.id]
    if isinstance(node, ast.Attribute):
        space = env.config if node.value.id == "config" else env.step
        if node.attr not in space:
            raise ExprError(f"{node.value.id}.{node.attr}: no such key; {node.value.id} has "
                            f"{', '.join(sorted(space)) or 'no keys'}")
        return space[node.attr]
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        try:
            return _BINOPS[type(node.op)](a, b)
        except (TypeError, ZeroDivisionError) as e:
            raise ExprError(f"{e}") from None
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not v
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        vals = (_eval(v, env) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.List):
        return [_eval(e, env) for e in node.elts]
    raise ExprError(f"{type(node).__name__} is not allowed")


def _expr_or_value(v):
    """A YAML value where strings are expressions: numbers and booleans stay as they are."""
    if isinstance(v, str):
        return Expr.parse(v)
    if isinstance(v, list):
        return [_expr_or_value(x) for x in v]
    return v


def _value(v, env: Env):
    if isinstance(v, Expr):
        return v.eval(env)
    if isinstance(v, list):
        return [_value(x, env) for x in v]
    return v


# --------------------------------------------------------------------------------------------
# declarations


@dataclass(frozen=True)
class InputDecl:
    name: str
    make: str
    shape: tuple[Expr, ...] = ()
    dtype: str = "model"
    value: Any = None  # full / literal: a number, a YAML value, or an Expr
    axes: tuple[Expr, ...] = ()  # grid
    function: str = ""  # hook
    cfg: str = "same"
    role: str = ""
    when: Expr | None = None

    @property
    def graph_role(self) -> str:
        return self.role or DEFAULT_ROLES.get(self.name, f"input:{self.name}")


@dataclass(frozen=True)
class InputSpec:
    dims: tuple[tuple[str, Expr], ...]
    forward: tuple[InputDecl, ...]
    hooks: str = ""  # absolute path of the workload's hook file, or ""
    raw: dict = field(default_factory=dict, compare=False, repr=False)  # the declaration, for jobs

    def env(self, shape: dict, config: dict, step: dict) -> Env:
        """Dimensions for one shape: the base ones, then `inputs.dims` in order."""
        env = Env({"batch": shape["batch"], "height": shape["resolution"][0], "width": shape["resolution"][1],
                   "frames": shape.get("frames", 1), "text_tokens": shape["text_tokens"]}, config, step)
        for name, e in self.dims:
            try:
                env.dims[name] = e.eval(env)
            except ExprError as err:
                raise SpecError(f"inputs.dims.{name}", e.text, f"an expression that evaluates ({err})") from None
        return env

    def active(self, env: Env) -> list[InputDecl]:
        """The declarations whose `when` holds for this preset and shape."""
        out = []
        for d in self.forward:
            if d.when is not None:
                try:
                    on = d.when.eval(env)
                except ExprError as err:
                    raise SpecError(f"inputs.forward.{d.name}.when", d.when.text, f"an expression that evaluates ({err})") from None
                if not on:
                    continue
            out.append(d)
        return out

    def shape_of(self, d: InputDecl, env: Env) -> list[int]:
        exprs = d.shape or ((Expr.parse("batch"),) if d.make == "timestep" else ())
        dims = []
        for i, e in enumerate(exprs):
            try:
                v = e.eval(env)
            except ExprError as err:
                raise SpecError(f"inputs.forward.{d.name}.shape[{i}]", e.text, f"an expression that evaluates ({err})") from None
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"inputs.forward.{d.name}.shape[{i}]", e.text,
                                f"a positive integer (it evaluates to {v!r} at {_dims_label(env)})")
            dims.append(v)
        return dims

    def grid_axes(self, d: InputDecl, env: Env) -> list[int]:
        out = []
        for i, e in enumerate(d.axes):
            v = e.eval(env)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"inputs.forward.{d.name}.axes[{i}]", e.text, f"a positive integer (got {v!r})")
            out.append(v)
        return out

    def value_of(self, d: InputDecl, env: Env):
        try:
            return _value(d.value, env)
        except ExprError as err:
            raise SpecError(f"inputs.forward.{d.name}.value", getattr(d.value, "text", d.value),
                            f"an expression that evaluates ({err})") from None

    def roles(self) -> dict[str, str]:
        return {d.name: d.graph_role for d in self.forward}

    def to_json(self) -> dict:
        return dict(self.raw, hooks=self.hooks)

    def check(self, shape: dict, config: dict, step: dict) -> None:
        """Evaluate every expression for one preset shape, as the runner will (SpecError if one fails)."""
        env = self.env(shape, config, step)
        for d in self.active(env):
            if d.make == "grid":
                self.grid_axes(d, env)
            elif d.make in ("literal", "full"):
                self.value_of(d, env)
                if d.make == "full":
                    self.shape_of(d, env)
            elif d.make != "hook" or d.shape:
                self.shape_of(d, env)


def _dims_label(env: Env) -> str:
    return ", ".join(f"{k}={v}" for k, v in env.dims.items() if isinstance(v, (int, float)))


_DECL_KEYS = {"make", "shape", "dtype", "value", "axes", "function", "cfg", "role", "when"}


def parse(raw: Any, hooks: str = "") -> InputSpec:
    """The `inputs:` mapping of a workload file -> InputSpec (SpecError names the key)."""
    if not isinstance(raw, dict):
        raise SpecError("inputs", raw, "a mapping with `forward` (and optionally `dims`)")
    for k in raw:
        if k not in ("dims", "forward"):
            raise SpecError(f"inputs.{k}", raw[k], "one of the keys dims, forward")
    dims_raw = raw.get("dims") or {}
    if not isinstance(dims_raw, dict):
        raise SpecError("inputs.dims", dims_raw, "a mapping of name: expression")
    dims, known = [], set(BASE_DIMS)
    for name, text in dims_raw.items():
        key = f"inputs.dims.{name}"
        if not str(name).isidentifier() or name in _NAMESPACES:
            raise SpecError(key, name, "a Python identifier other than config and step")
        if name in BASE_DIMS:
            raise SpecError(key, name, f"a new name (the base dimensions {', '.join(BASE_DIMS)} are given)")
        e = _parse_expr(text, key)
        unknown = sorted(e.names - known)
        if unknown:
            raise SpecError(key, text, f"an expression of {', '.join(sorted(known))} (unknown: {', '.join(unknown)}; "
                                       f"a dimension can only use the ones above it)")
        dims.append((str(name), e))
        known.add(name)
    fwd = raw.get("forward")
    if not isinstance(fwd, dict) or not fwd:
        raise SpecError("inputs.forward", fwd, "a mapping of forward keyword: declaration")
    decls = []
    for name, d in fwd.items():
        decls.append(_parse_decl(str(name), d, known, hooks))
    return InputSpec(tuple(dims), tuple(decls), hooks, raw=raw)


def _parse_expr(text, key: str) -> Expr:
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise SpecError(key, text, "an expression (a number or a string such as 'height // 16')")
    try:
        return Expr.parse(str(text))
    except ExprError as err:
        raise SpecError(key, text, f"an expression ({err})") from None


def _parse_decl(name: str, d: Any, dims: set[str], hooks: str) -> InputDecl:
    key = f"inputs.forward.{name}"
    if not name.isidentifier():
        raise SpecError(key, name, "a keyword argument name")
    if not isinstance(d, dict):
        raise SpecError(key, d, "a mapping with at least `make`")
    for k in d:
        if k not in _DECL_KEYS:
            raise SpecError(f"{key}.{k}", d[k], f"one of the keys {', '.join(sorted(_DECL_KEYS))}")
    make = d.get("make")
    if make not in MAKES:
        raise SpecError(f"{key}.make", make, f"one of {', '.join(MAKES)}")
    dtype = d.get("dtype", "int64" if make == "grid" else "model")
    if dtype not in DTYPES:
        raise SpecError(f"{key}.dtype", dtype, f"one of {', '.join(DTYPES)} (model: the workload's dtype on the device)")
    if make in ("randn",) and dtype not in FLOAT_DTYPES:
        raise SpecError(f"{key}.dtype", dtype, f"a floating dtype for make: randn ({', '.join(FLOAT_DTYPES)})")
    cfg = d.get("cfg", "same")
    if cfg not in CFG_RULES:
        raise SpecError(f"{key}.cfg", cfg, f"one of {', '.join(CFG_RULES)} (what the unconditional pass gets)")
    role = d.get("role", "")
    if role and role not in ROLES:
        raise SpecError(f"{key}.role", role, f"one of {', '.join(ROLES)}")

    def exprs(k: str) -> tuple[Expr, ...]:
        v = d.get(k)
        if v is None:
            return ()
        if not isinstance(v, list):
            raise SpecError(f"{key}.{k}", v, "a list of expressions")
        out = tuple(_parse_expr(x, f"{key}.{k}[{i}]") for i, x in enumerate(v))
        for i, e in enumerate(out):
            unknown = sorted(e.names - dims)
            if unknown:
                raise SpecError(f"{key}.{k}[{i}]", e.text,
                                f"an expression of {', '.join(sorted(dims))}, config.<key>, step.<key> "
                                f"(unknown: {', '.join(unknown)})")
        return out

    shape, axes = exprs("shape"), exprs("axes")
    if make in ("randn", "full") and not shape:
        raise SpecError(f"{key}.shape", d.get("shape"), f"a list of dimension expressions (make: {make} needs a shape)")
    if make == "grid" and not axes:
        raise SpecError(f"{key}.axes", d.get("axes"), "a list of axis sizes, e.g. [1, h, w, 1]")
    if make in ("full", "literal") and "value" not in d:
        raise SpecError(f"{key}.value", None, f"a value (make: {make} needs one)")
    value = None
    if "value" in d:
        try:
            value = _expr_or_value(d["value"])
        except ExprError as err:
            raise SpecError(f"{key}.value", d["value"], f"a value or an expression ({err})") from None
    function = d.get("function", "")
    if make == "hook":
        if not hooks:
            raise SpecError(f"{key}.make", make, "a `hooks:` file at the workload's top level (make: hook calls a function in it)")
        if not isinstance(function, str) or not function.isidentifier():
            raise SpecError(f"{key}.function", function, "the name of a function in the hooks file")
    when = _parse_expr(d["when"], f"{key}.when") if "when" in d else None
    return InputDecl(name=name, make=make, shape=shape, dtype=dtype, value=value, axes=axes, function=function,
                     cfg=cfg, role=role, when=when)


def from_json(d: dict) -> InputSpec:
    """The runner's side: a job carries the declaration as the workload file had it."""
    raw = {k: v for k, v in d.items() if k != "hooks"}
    return parse(raw, d.get("hooks", ""))
