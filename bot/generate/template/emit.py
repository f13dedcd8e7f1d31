"""Write a lifted Program as a kernel module and its test, to the store's formats.

The module (like kernel_store/flux2-norm-modulate/norm_modulate.py): a Triton row kernel (one
program per row, fp32 math, each node rounded to the activation dtype where the unfused code
stores it, so bf16 tracks the unfused path), a stride-aware wrapper (broadcast rows by stride 0),
a torch.library custom op with a fake that only torch.compile calls (eager calls the function:
custom_op's Python dispatch costs more than the kernel at small shapes), and the torch reference
that replays the original ops in order. The test follows the kernel test contract (docs/store.md).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from bot.generate.template.lift import NORMS, REDUCE, Input, Node, Program
from bot.knowledge.store import UNDER_COMPILE_REFERENCE

ROUND_DT = {"bf16": "tl.bfloat16", "f16": "tl.float16"}
TORCH_DT = {"f32": "torch.float32", "bf16": "torch.bfloat16", "f16": "torch.float16", "f64": "torch.float64"}
PY_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


@dataclass(frozen=True)
class Emitted:
    op_name: str  # module, function and custom-op name, e.g. tpl_layer_norm_mul_add_1a2b3c
    kernel_name: str  # the Triton kernel's name (Optbot-Adds-Kernels, the profile's engagement check)
    module_source: str
    test_source: str
    config_space: dict[str, list]
    reduces: bool  # the program holds a row reduction (a norm or a mean): one block covers the row


def describe(p: Program) -> str:
    return " -> ".join(n.op for n in p.nodes)


def kernel_key(p: Program) -> str:
    """What the emitted kernel and wrapper are a function of: the ops, their arguments and attributes,
    and per input its role, dtype, layout and which dims it broadcasts over; not the leading dims'
    sizes (the kernel takes any row count) nor where in the graph or the source it was captured.
    Programs with one key run as one kernel (generate_templates groups their sites)."""
    return repr(([(n.name, n.op, n.args, sorted(n.attrs.items()), n.f32, n.per_row) for n in p.nodes],
                 [(i.name, i.role, i.dtype, i.contig, len(i.shape), _bcast_mask(i, p.out_shape)) for i in p.inputs],
                 p.output, p.n, len(p.out_shape)))


def emit(p: Program, sites: tuple[Program, ...] = ()) -> Emitted:
    """The kernel module and its test for program `p`, serving `p` and every program of `sites`
    (other places with p's kernel_key: their shapes join the test's and their graph ops the docstring)."""
    every = (p, *[s for s in sites if s is not p])
    if any(kernel_key(s) != kernel_key(p) for s in every):
        raise ValueError("emit: the sites are not one kernel (kernel_key differs)")
    # the source lines are in the name: two norms of one shape through one helper (Qwen-Image's
    # img_norm1 and img_norm2 via _modulate) are the same program, and one module name with two
    # texts (their docstrings name their graph ops) made the second commit conflict with the first
    sig = hashlib.sha1(repr([(n.op, n.args, sorted(n.attrs.items())) for n in p.nodes]).encode()
                       + repr([(i.role, i.shape) for i in p.inputs]).encode()
                       + repr([s.srcs for s in every] if sites else p.srcs).encode()).hexdigest()[:6]
    slug = "_".join(dict.fromkeys(n.op for n in p.nodes))[:40]
    name = f"tpl_{slug}_{sig}"
    reduces = any(n.op in NORMS or n.op in REDUCE for n in p.nodes)
    space = {"num_warps": [1, 2, 4, 8]} if reduces else {"block_n": [256, 512, 1024, 2048], "num_warps": [2, 4, 8]}
    return Emitted(name, f"_{name}_kernel", _module(p, name, reduces, every), _test(p, name, every), space, reduces)


# ---- the Triton kernel ---------------------------------------------------------------------------

def _tl_expr(n: Node, a: list[str]) -> list[str]:
    """Lines computing node n (fp32) into a variable named n.name from argument expressions `a`."""
    t, x = n.name, a[0] if a else ""
    if n.op in PY_BIN:
        return [f"{t} = {a[0]} {PY_BIN[n.op]} {a[1]}"]
    if n.op == "rsub":
        return [f"{t} = {a[1]} - {a[0]}"]
    simple = {"neg": f"-{x}", "sigmoid": f"tl.sigmoid({x})", "silu": f"{x} * tl.sigmoid({x})",
              "exp": f"tl.exp({x})", "rsqrt": f"tl.rsqrt({x})", "tanh": f"2.0 * tl.sigmoid(2.0 * {x}) - 1.0"}
    if n.op in simple:
        return [f"{t} = {simple[n.op]}"]
    if n.op == "gelu":
        if n.attrs.get("approximate") == "tanh":
            return [f"{t}_u = 0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})",
                    f"{t} = 0.5 * {x} * (2.0 * tl.sigmoid(2.0 * {t}_u))"]
        return [f"{t} = 0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"]
    if n.op == "pow":
        e = n.attrs["exponent"]
        if e == int(e) and 1 <= e <= 4:
            return [f"{t} = " + " * ".join([x] * int(e))]
        if e == 0.5:
            return [f"{t} = tl.sqrt({x})"]
        if e == -1:
            return [f"{t} = 1.0 / {x}"]
        return [f"{t} = tl.exp({e!r} * tl.log({x}))"]
    if n.op == "cast":
        return [f"{t} = {x}" + (f".to({ROUND_DT[n.attrs['dtype']]}).to(tl.float32)" if n.attrs["dtype"] in ROUND_DT else "")]
    if n.op in ("mean", "sum"):
        div = " / N" if n.op == "mean" else ""
        return [f"{t} = tl.sum(tl.where(m, {x}, 0.0), axis=0){div}"]
    if n.op == "layer_norm":
        lines = [f"{t}_mu = tl.sum(tl.where(m, {x}, 0.0), axis=0) / N",
                 f"{t}_xc = tl.where(m, {x} - {t}_mu, 0.0)",
                 f"{t} = {t}_xc * tl.rsqrt(tl.sum({t}_xc * {t}_xc, axis=0) / N + {n.attrs['eps']!r})"]
    elif n.op == "rms_norm":
        lines = [f"{t} = {x} * tl.rsqrt(tl.sum(tl.where(m, {x} * {x}, 0.0), axis=0) / N + {n.attrs['eps']!r})"]
    else:
        raise ValueError(f"no Triton rule for {n.op}")
    if "weight" in n.attrs:
        lines.append(f"{t} = {t} * {n.attrs['weight']}")
    if "bias" in n.attrs:
        lines.append(f"{t} = {t} + {n.attrs['bias']}")
    return lines


def _arg(v) -> str:
    return repr(float(v)) if isinstance(v, float) else v


def _kernel(p: Program, name: str, reduces: bool) -> str:
    ins = p.inputs
    strides = ", ".join(f"s{i}_0, s{i}_1, s{i}_2, s{i}_3" for i in range(len(ins)))
    ptrs = ", ".join(i.name.upper() for i in ins)
    head = [
        "    @triton.jit",
        f"    def _{name}_kernel({ptrs}, OUT, L1, L2, N, {strides},",
        "                       BLOCK_N: tl.constexpr, ROUND: tl.constexpr):",
        "        row = tl.program_id(0)  # one row of the output per program; rows index up to 3 leading dims",
        "        i2 = row % L2",
        "        i1 = (row // L2) % L1",
        "        i0 = row // (L1 * L2)",
    ]
    body = []
    for k, i in enumerate(ins):
        body.append(f"{i.name} = tl.load({i.name.upper()} + i0 * s{k}_0 + i1 * s{k}_1 + i2 * s{k}_2 + cols * s{k}_3, "
                    f"mask=m, other=0.0).to(tl.float32)")
    for n in p.nodes:
        body += _tl_expr(n, [_arg(a) for a in n.args])
        if not n.f32 and n.op != "cast":
            body.append(f"if ROUND:  # the unfused op stores {n.name} in the activation dtype")
            body.append(f"    {n.name} = {n.name}.to(OUT.dtype.element_ty).to(tl.float32)")
    body.append(f"tl.store(OUT + row * N + cols, {p.output}.to(OUT.dtype.element_ty), mask=m)")
    if reduces:  # the reduction needs the whole row in one block
        loop = ["        cols = tl.arange(0, BLOCK_N)", "        m = cols < N"] + ["        " + b for b in body]
    else:
        loop = ["        for start in range(0, N, BLOCK_N):",
                "            cols = start + tl.arange(0, BLOCK_N)",
                "            m = cols < N"] + ["            " + b for b in body]
    return "\n".join(head + loop)


# ---- the torch reference -------------------------------------------------------------------------

def _torch_expr(n: Node, a: list[str]) -> str:
    x = a[0] if a else ""
    if n.op in PY_BIN:
        return f"{a[0]} {PY_BIN[n.op]} {a[1]}"
    if n.op == "rsub":
        return f"{a[1]} - {a[0]}"
    simple = {"neg": f"-{x}", "sigmoid": f"torch.sigmoid({x})", "silu": f"F.silu({x})", "exp": f"torch.exp({x})",
              "rsqrt": f"torch.rsqrt({x})", "tanh": f"torch.tanh({x})"}
    if n.op in simple:
        return simple[n.op]
    if n.op == "gelu":
        return f"F.gelu({x}, approximate={n.attrs.get('approximate', 'none')!r})"
    if n.op == "pow":
        return f"{x}.pow({n.attrs['exponent']!r})"
    if n.op == "cast":
        return f"{x}.to({TORCH_DT.get(n.attrs['dtype'], 'torch.float32')})"
    if n.op in ("mean", "sum"):
        return f"{x}.{n.op}(-1, keepdim=True)"
    w, b = n.attrs.get("weight", "None"), n.attrs.get("bias", "None")
    if n.op == "layer_norm":
        return f"F.layer_norm({x}, ({x}.shape[-1],), {w}, {b}, {n.attrs['eps']!r})"
    if n.op == "rms_norm":
        return f"F.rms_norm({x}, ({x}.shape[-1],), {w}, {n.attrs['eps']!r})"
    raise ValueError(f"no torch rule for {n.op}")


def _reference(p: Program) -> str:
    args = ", ".join(i.name for i in p.inputs)
    lines = [f"def reference({args}):", "    # the captured ops, in their order (graph ops " +
             ", ".join(str(n.op_id) for n in p.nodes) + ")"]
    for n in p.nodes:
        lines.append(f"    {n.name} = {_torch_expr(n, [_arg(a) for a in n.args])}")
    lines.append(f"    return {p.output}")
    return "\n".join(lines)


# ---- the module ----------------------------------------------------------------------------------

def _module(p: Program, name: str, reduces: bool, every: tuple[Program, ...]) -> str:
    args = ", ".join(i.name for i in p.inputs)
    typed = ", ".join(f"{i.name}: torch.Tensor" for i in p.inputs)
    rows = [i.name for i in p.inputs if i.role == "row"] or [p.inputs[0].name]
    out_node = p.node(p.output)
    out_dtype = "torch.float32" if out_node.f32 else f"{rows[0]}.dtype"
    doc = (f'"""Template-generated (optbot, bot/generate/template): {describe(p)} in one row kernel.\n\n'
           f"    {name}({args}) -> [..., N], N = {p.n} where captured\n"
           + "".join(f"    {i.name}: {i.role} {list(i.shape)} ({i.dtype}), graph value {i.value}\n" for i in p.inputs)
           + "\nReplaces graph ops " + "; ".join(f"{s.op_ids} ({s.src or ', '.join(s.srcs)})" for s in every)
           + ". Dispatch: Triton on CUDA tensors and on\n"
           "CPU under TRITON_INTERPRET=1, else the torch reference; under torch.compile the reference (UNDER_COMPILE),\n"
           "or the registered op optbot::" + name + " with UNDER_COMPILE = \"op\". No `from __future__ import annotations`: custom_op reads the\n"
           'annotations as types.\n"""')
    cfg_default = "num_warps: int = 4" if reduces else "block_n: int = 1024, num_warps: int = 4"
    cfg_call = "int(num_warps)" if reduces else "int(block_n), int(num_warps)"
    cfg_params = "num_warps: int" if reduces else "block_n: int, num_warps: int"
    cfg_names = "num_warps" if reduces else "block_n, num_warps"
    block = "triton.next_power_of_2(N)" if reduces else "min(int(block_n), triton.next_power_of_2(N))"
    return f'''{doc}
import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_last_path = ""


def last_path() -> str:
    return _last_path


{_reference(p)}


if triton is not None:

{_kernel(p, name, reduces)}


# Under torch.compile the kernel steps aside and the reference's ops run, which inductor fuses into
# one kernel of its own: these are the pointwise / row chains inductor generates best, and as a
# registered op the kernel also keeps inductor from fusing it with its neighbours (FLUX.2's SwiGLU
# on the H200, 2026-12-02: eager 1.034x, compile 0.989x with the op). "op" calls the registered op.
{UNDER_COMPILE_REFERENCE}


def _aside() -> bool:
    return UNDER_COMPILE == "reference" and torch.compiler.is_compiling()


def _use_triton(x: torch.Tensor) -> bool:
    return not _aside() and triton is not None and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _out_dtype({args}) -> torch.dtype:
    return {out_dtype}


def _strides4(t: torch.Tensor, shape) -> list:
    """t broadcast to shape (stride 0 over broadcast dims), strides padded to rank 4."""
    s = list(t.expand(shape).stride())
    return [0] * (4 - len(s)) + s


def _run({typed}, {cfg_params}) -> torch.Tensor:
    shape = torch.broadcast_shapes({", ".join(i.name + ".shape" for i in p.inputs)},)
    out = torch.empty(shape, dtype=_out_dtype({args}), device={rows[0]}.device)
    lead = [1] * (4 - len(shape)) + list(shape)
    N = lead[3]
    if out.numel():
        _{name}_kernel[(lead[0] * lead[1] * lead[2],)](
            {args}, out, lead[1], lead[2], N,
            {", ".join(f"*_strides4({i.name}, shape)" for i in p.inputs)},
            BLOCK_N={block}, ROUND=out.dtype != torch.float32, num_warps=int(num_warps))
    return out


def _register(name: str, fn, fake):
    """One registration per process: a second copy of this file (store and engine worktree) reuses it."""
    try:
        return getattr(torch.ops.optbot, name)
    except (AttributeError, RuntimeError):
        pass
    op = torch.library.custom_op(f"optbot::{{name}}", mutates_args=())(fn)
    op.register_fake(fake)
    return op


def _fake({args}, {cfg_names}):
    shape = torch.broadcast_shapes({", ".join(i.name + ".shape" for i in p.inputs)},)
    return {rows[0]}.new_empty(shape, dtype=_out_dtype({args}))


_OP = _register("{name}", _run, _fake)


# The config site (variant search rewrites these defaults).
def _launch({args}, {cfg_default}):
    fn = _OP if torch.compiler.is_compiling() else _run
    return fn({args}, {cfg_call})


def {name}({args}):
    global _last_path
    if not _use_triton({rows[0]}):
        _last_path = "torch"
        return reference({args})
    _last_path = "triton"
    return _launch({args})
'''


# ---- the test ------------------------------------------------------------------------------------

def _bcast_mask(i: Input, out_shape: tuple[int, ...]) -> tuple[bool, ...]:
    """Per dim of the input (right-aligned to the output): True where it has the output's size."""
    return tuple(a != 1 or b == 1 for a, b in zip(i.shape, out_shape[len(out_shape) - len(i.shape):]))


def test_shapes(p: Program) -> list[tuple[int, ...]]:
    r = len(p.out_shape)
    shapes = [p.out_shape, tuple([1] * (r - 1) + [p.n]), tuple([2, 37, 3][:r - 1] + [96]),
              tuple([1, 19, 1][:r - 1] + [100])]
    return list(dict.fromkeys(shapes))


def _test(p: Program, name: str, every: tuple[Program, ...]) -> str:
    masks = {i.name: _bcast_mask(i, p.out_shape) for i in p.inputs}
    lines = []
    for i in p.inputs:
        if i.role == "row" and not i.contig:  # captured as a strided view: half of a row twice as wide
            lines.append(f"    {i.name} = torch.randn(*shape[:-1], 2 * shape[-1], generator=g).to(device, dt)"
                         f"[..., :shape[-1]]")
        elif i.role == "row":
            lines.append(f"    {i.name} = torch.randn(*shape, generator=g).to(device, dt)")
        else:
            m = masks[i.name]
            dims = ", ".join(f"shape[{len(p.out_shape) - len(m) + k}]" if keep else "1" for k, keep in enumerate(m))
            lines.append(f"    {i.name} = (0.5 * torch.randn({dims or '()'}, generator=g)).to(device, dt)")
    args = ", ".join(i.name for i in p.inputs)
    return f'''"""Kernel test for {name}.py (the kernel test contract, docs/store.md), template-generated:
{describe(p)} on inputs {args}; shapes: the captured one, M=1 and odd ones."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import {name} as op  # noqa: E402

SHAPES = {list(dict.fromkeys(x for s in every for x in test_shapes(s)))!r}
# bf16: every node is rounded where the unfused op stores it, and a norm's fp32 statistics differ in
# the last bits between kernels, so one rounding can flip and be carried through the chain (a few
# ulps at |x| ~ 4, where one is 0.03): wider than the store's hand-tuned 3e-2 / 2e-2
CASES = [("float32", 2e-5, 2e-5), ("bfloat16", 6e-2, 3e-2)]
BENCH_SHAPES = {list(dict.fromkeys(tuple(s.out_shape) for s in every))!r}


def make_inputs(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
{chr(10).join(lines)}
    return ({args},)


def reference(*inputs):
    return op.reference(*inputs)


def kernel(*inputs):
    return op.{name}(*inputs)


def kernel_with_config(*inputs, **config):
    return op._launch(*inputs, **config) if op._use_triton(inputs[0]) else op.reference(*inputs)


def kernel_path() -> str:
    return op.last_path()


@pytest.mark.parametrize("dtype, atol, rtol", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_{name}(shape, dtype, atol, rtol):
    inputs = make_inputs(shape, dtype, "cuda" if torch.cuda.is_available() else "cpu", 0)
    torch.testing.assert_close(kernel(*inputs), reference(*inputs), atol=atol, rtol=rtol)
    assert op.last_path() == ("triton" if op._use_triton(inputs[0]) else "torch")
'''
