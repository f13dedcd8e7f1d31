"""The checked rewrite of the engine: the one source statement the instance's ops came from gets
the emitted kernel call in place of the sub-expression that computes the program.

Only when every op (the lifted casts included) has the same engine line, that line belongs to a
simple assignment `name = <expr>` or a `return <expr>` (or the ops' lines are a run of such assignments, below), and some
sub-expression of <expr> has the program's op sequence structurally (`(1 + scale) * self.norm(x) + shift`: add(mul(., layer_norm(.)), .)). Program inputs
bind to the AST sub-expressions in their places (`1 + scale` is one input when its add was left to
another opportunity); a norm may be a module call `self.<attr>(x)` when the graph says that module
ran the norm op. The rewritten file is parsed again. Anything else is refused with the reason.

Several lines (FLUX.2's `norm_hidden_states = self.norm1(hidden_states)` then
`norm_hidden_states = (1 + scale_msa) * norm_hidden_states + shift_msa`): the statements must be
adjacent simple assignments of one block, each earlier one's value read exactly once by the later
ones, no name it reads reassigned before it would be inlined, and no earlier target (other than the
last statement's own) read after the run. They are inlined into the last one's expression, matched as
one statement, and replaced by one assignment to the last target.

Across a call (Qwen-Image's `img_normed = self.img_norm1(hidden_states)` then
`img_modulated, img_gate = self._modulate(img_normed, img_mod1)`, whose `return x * (1 + scale) +
shift, gate` holds the consumers): the norm statement is in a method and the consumers in one
statement of another method of the same class that it calls with the norm's value on the next line.
The helper gets a trailing parameter `_optbot_fused=None` and its matched sub-expression S becomes
`(S if _optbot_fused is None else _optbot_fused(<inputs>))`, its parameter then holding the norm's
input; the caller drops the norm statement and passes the norm's input and `_optbot_fused=<kernel>`.
The helper's edit names no kernel, so two candidates through one helper (img_norm1, img_norm2) make
the same edit there and stack; its other callers keep their behaviour. Refused: a norm with a weight
or bias (the helper serves several norm modules), the norm's value read other than once as that
call's argument, and a helper that reads the parameter outside S.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from pathlib import Path

from bot.generate.template.emit import Emitted
from bot.generate.template.lift import Node, Program, Refused

AST_BIN = {"add": ast.Add, "sub": ast.Sub, "mul": ast.Mult, "div": ast.Div}
CALL_NAMES = {"sigmoid": {"sigmoid"}, "tanh": {"tanh"}, "exp": {"exp"}, "rsqrt": {"rsqrt"}, "silu": {"silu"},
              "gelu": {"gelu"}, "mean": {"mean"}, "sum": {"sum"}, "pow": {"pow"},
              "cast": {"float", "half", "bfloat16", "to", "type_as"},
              "layer_norm": {"layer_norm"}, "rms_norm": {"rms_norm"}, "neg": {"neg"}}
NAMESPACES = {"torch", "F", "nn", "functional"}
# ops a module's forward may run on its one argument (nn.LayerNorm, nn.RMSNorm, nn.SiLU, nn.GELU, ...)
UNARY_MODULES = {"layer_norm", "rms_norm", "silu", "gelu", "sigmoid", "tanh"}
KERNEL_PACKAGE = "optbot_kernels"
PACKAGE_ALIAS = "_optbot_kernels"
# The package's __init__.py, the same text in every template commit: it imports every kernel module
# beside it, so an engine file needs one import line for all of them. Two template commits then add
# the same line at the same place (and the same __init__.py), which git merges cleanly, instead of
# two different import lines at one place, which conflict: on FLUX.2 (2026-12-02) 8 of 10 accepted
# template candidates could not be stacked for that.
PACKAGE_INIT = '''"""Kernels optbot's template generator wrote. Every module here is imported with the package, so
an engine file reaches each as an attribute of one import (optbot: bot/generate/template/wire.py)."""
import importlib as _importlib
import pkgutil as _pkgutil

for _m in _pkgutil.iter_modules(__path__):
    if not _m.name.startswith("test_"):  # each kernel's test sits beside it; tests are not imported with it
        _importlib.import_module(f"{__name__}.{_m.name}")
'''


@dataclass(frozen=True)
class Rewrite:
    engine_file: str  # relative to the import root
    line: int
    old_statement: str
    new_statement: str
    kernel_file: str  # where the kernel module goes, relative to the import root
    import_line: str
    source: str  # the engine file's new text
    # base-side line ranges the rewrite changes (first, last): where another candidate's edit would conflict
    spans: tuple[tuple[int, int], ...] = ()


def kernel_location(engine_file: str, op_name: str) -> tuple[str, str]:
    """(kernel module path relative to the import root, its dotted module name): a package folder
    beside the engine file, so the import is absolute from the import root."""
    parent = Path(engine_file).parent
    rel = parent / KERNEL_PACKAGE / f"{op_name}.py"
    dotted = ".".join([*parent.parts, KERNEL_PACKAGE, op_name])
    return str(rel), dotted


MAX_STATEMENTS = 4


def rewrite(p: Program, e: Emitted, import_root: Path) -> Rewrite:
    if not p.src:
        return _rewrite_run(p, e, _statements(p, import_root))
    efile, _, eline = p.src.rpartition(":")
    path = import_root / efile
    if not efile or not eline.isdigit() or not path.is_file():
        raise Refused(f"engine line {p.src!r} is not a file under the import root {import_root}")
    line = int(eline)
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    stmts = [s for s in ast.walk(tree) if isinstance(s, ast.stmt) and s.lineno <= line <= (s.end_lineno or s.lineno)]
    if not stmts:
        raise Refused(f"{p.src}: no statement at that line")
    stmt = min(stmts, key=lambda s: (s.end_lineno or s.lineno) - s.lineno)
    # a return hands its value on as an assignment does (SGLang's `return norm(x) * (1 + scale) + shift`)
    if not ((isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name))
            or (isinstance(stmt, ast.Return) and stmt.value is not None)):
        raise Refused(f"{p.src}: the statement is a {type(stmt).__name__} ({ast.unparse(stmt)[:80]!r}), "
                      "not a simple assignment `name = <expr>` or a `return <expr>`")
    sub, bind = _find(p, stmt.value, f"{p.src}: no sub-expression of")
    kfile, dotted = kernel_location(efile, e.op_name)
    alias = _callee(import_root, kfile, e)
    call = f"{alias}({', '.join(bind[i.name] for i in p.inputs)})"
    _, _, at = _offsets(text)
    a, b = at(sub.lineno, sub.col_offset), at(sub.end_lineno, sub.end_col_offset)
    new_text = text[:a] + call + text[b:]
    return _finish(p.src, efile, path, tree, new_text, stmt.lineno, ast.unparse(stmt), dotted, alias, e, kfile,
                   stmt.end_lineno or stmt.lineno)


def _with_import(where: str, path: Path, tree: ast.Module, new_text: str, dotted: str, alias: str,
                 e: Emitted) -> tuple[str, ast.Module, str, int]:
    """(text with the kernel's import after the module's imports, its tree, the import line, how many
    lines the import moved everything below it: 0 where the line is there already)."""
    pkg = dotted.rsplit(".", 1)[0]
    if alias.startswith(PACKAGE_ALIAS + "."):
        parent, _, name = pkg.rpartition(".")
        import_line = f"from {parent} import {name} as {PACKAGE_ALIAS}  # optbot template kernels\n"
    else:
        import_line = f"from {pkg}.{e.op_name} import {e.op_name} as {alias}  # optbot template kernel\n"
    new_lines = new_text.splitlines(keepends=True)
    shift = 0
    if import_line not in new_lines:
        at = _import_point(tree)
        new_text = "".join(new_lines[:at] + [import_line] + new_lines[at:])
        shift = 1
    try:
        new_tree = ast.parse(new_text, filename=str(path))
    except SyntaxError as err:
        raise Refused(f"{where}: the rewritten file does not parse ({err})") from None
    return new_text, new_tree, import_line.strip(), shift


def _finish(where: str, efile: str, path: Path, tree: ast.Module, new_text: str, lineno: int, old: str, dotted: str,
            alias: str, e: Emitted, kfile: str, last: int) -> Rewrite:
    """The import of the kernel added, the file parsed again, and the new statement (at `lineno`,
    one line down for the import) found holding the kernel call; base lines lineno..last changed."""
    new_text, new_tree, import_line, shift = _with_import(where, path, tree, new_text, dotted, alias, e)
    new_stmt = next((s for s in ast.walk(new_tree) if isinstance(s, (ast.Assign, ast.Return)) and s.lineno == lineno + shift),
                    None)
    if new_stmt is None or alias not in ast.unparse(new_stmt):
        raise Refused(f"{where}: the rewritten statement was not found after the rewrite")
    return Rewrite(efile, lineno, old, ast.unparse(new_stmt), kfile, import_line, new_text,
                   spans=((lineno, last),))


def _find(p: Program, expr: ast.expr, says: str) -> tuple[ast.expr, dict[str, str]]:
    """The first sub-expression of expr (outermost first) that computes the program, with the
    source text each program input binds to; else Refused, starting with `says`."""
    for sub in ast.walk(expr):
        if isinstance(sub, ast.expr):
            bind: dict[str, str] = {}
            if _match(p, p.output, sub, bind) and _complete(p, bind):
                return sub, bind
    raise Refused(f"{says} {ast.unparse(expr)[:120]!r} has the program's op sequence "
                  f"({' -> '.join(n.op for n in p.nodes)})")


def _callee(import_root: Path, kfile: str, e: Emitted) -> str:
    """How the rewritten statement names the kernel: through the package's one import where the
    package is new or is this generator's (PACKAGE_INIT), else through an import of its own."""
    init = import_root / Path(kfile).parent / "__init__.py"
    if not init.exists() or init.read_text() == PACKAGE_INIT:
        return f"{PACKAGE_ALIAS}.{e.op_name}.{e.op_name}"
    return f"_optbot_{e.op_name}"


def _loads(node: ast.AST) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


class _Inline(ast.NodeTransformer):
    """Replaces each load of `name` with a copy of `value`."""

    def __init__(self, name: str, value: ast.expr):
        self.name, self.value = name, value

    def visit_Name(self, node: ast.Name):
        return copy.deepcopy(self.value) if node.id == self.name and isinstance(node.ctx, ast.Load) else node


@dataclass(frozen=True)
class _Lines:
    """The statements the instance's ops came from (several lines of one file)."""
    import_root: Path
    where: str
    efile: str
    path: Path
    text: str
    tree: ast.Module
    stmts: list[ast.stmt]


def _statements(p: Program, import_root: Path) -> _Lines:
    where = ", ".join(p.srcs)
    files = {s.rpartition(":")[0] for s in p.srcs}
    lines = sorted({int(s.rpartition(":")[2]) for s in p.srcs if s.rpartition(":")[2].isdigit()})
    if len(files) != 1 or len(lines) != len(p.srcs):
        raise Refused(f"the instance's ops come from {len(p.srcs)} source lines in {len(files)} file(s) ({where}); "
                      "the template rewrites statements of one file")
    efile = files.pop()
    path = import_root / efile
    if not efile or not path.is_file():
        raise Refused(f"engine file {efile!r} is not a file under the import root {import_root}")
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    stmts: list[ast.stmt] = []
    for line in lines:
        cover = [s for s in ast.walk(tree) if isinstance(s, ast.stmt) and s.lineno <= line <= (s.end_lineno or s.lineno)]
        if not cover:
            raise Refused(f"{efile}:{line}: no statement at that line")
        stmt = min(cover, key=lambda s: (s.end_lineno or s.lineno) - s.lineno)
        if stmt not in stmts:
            stmts.append(stmt)
    return _Lines(import_root, where, efile, path, text, tree, stmts)


def _function_of(tree: ast.Module, stmt: ast.stmt) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost function holding stmt."""
    fs = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
          and any(s is stmt for s in ast.walk(f))]
    return min(fs, key=lambda f: (f.end_lineno or f.lineno) - f.lineno) if fs else None


def _rewrite_run(p: Program, e: Emitted, ls: _Lines) -> Rewrite:
    """The ops' lines are a run of adjacent simple assignments: inline them into the last one
    (module docstring), match that, and replace the run by one assignment."""
    where, efile, path, text, tree, stmts = ls.where, ls.efile, ls.path, ls.text, ls.tree, ls.stmts
    import_root = ls.import_root
    if len(stmts) > MAX_STATEMENTS:
        raise Refused(f"the instance's ops come from {len(stmts)} statements ({where}); the template joins at most "
                      f"{MAX_STATEMENTS}")
    for s in stmts:
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
            raise Refused(f"{efile}:{s.lineno}: the statement is a {type(s).__name__} ({ast.unparse(s)[:80]!r}), "
                          "not a simple assignment `name = <expr>`")
    body = next((b for node in ast.walk(tree) for b in _bodies(node) if stmts[0] in b), None)
    k = body.index(stmts[0]) if body else -1
    if body is None or body[k:k + len(stmts)] != stmts:
        raise Refused(f"the statements at {where} are not adjacent in one block")
    func = _function_of(tree, stmts[0])
    last = stmts[-1]
    final = last.targets[0].id
    expr = copy.deepcopy(last.value)
    for i in range(len(stmts) - 2, -1, -1):
        s = stmts[i]
        name = s.targets[0].id
        reads = [n for n in _loads(expr) if n.id == name]
        if len(reads) != 1:
            raise Refused(f"{efile}:{s.lineno}: {name!r} is read {len(reads)} times by the statements after it; "
                          "the template inlines a value read once")
        later = {t.targets[0].id for t in stmts[i + 1:-1]}
        moved = sorted({n.id for n in _loads(s.value)} & later)
        if moved:
            raise Refused(f"{efile}:{s.lineno}: {', '.join(moved)} is reassigned before {name!r} would be computed")
        expr = _Inline(name, s.value).visit(expr)
    if func is not None:
        after = {n.id for st in ast.walk(func) if isinstance(st, ast.stmt) and st.lineno > (last.end_lineno or last.lineno)
                 for n in _loads(st)}
        live = sorted({s.targets[0].id for s in stmts[:-1]} - {final} & after)
        if live:
            raise Refused(f"{efile}:{last.lineno}: {', '.join(live)} is read after the statements; "
                          "joining them would drop it")
    sub, bind = _find(p, expr, f"{where}: no sub-expression of the joined")
    kfile, dotted = kernel_location(efile, e.op_name)
    alias = _callee(import_root, kfile, e)
    call = ast.parse(f"{alias}({', '.join(bind[i.name] for i in p.inputs)})", mode="eval").body
    expr = ast.fix_missing_locations(_Replace(sub, call).visit(expr))
    src_lines = text.splitlines(keepends=True)
    first_line = src_lines[stmts[0].lineno - 1]
    indent = first_line[:len(first_line) - len(first_line.lstrip())]
    if not _alone(src_lines, stmts[0], last):
        raise Refused(f"{where}: the statements share their lines with other code")
    new_text = "".join(src_lines[:stmts[0].lineno - 1] + [f"{indent}{final} = {ast.unparse(expr)}\n"]
                       + src_lines[last.end_lineno or last.lineno:])
    old = "\n".join(ast.unparse(s) for s in stmts)
    return _finish(where, efile, path, tree, new_text, stmts[0].lineno, old, dotted, alias, e, kfile,
                   last.end_lineno or last.lineno)


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, new: ast.expr):
        self.target, self.new = target, new

    def visit(self, node):
        return self.new if node is self.target else super().visit(node)


def _bodies(node: ast.AST) -> list[list[ast.stmt]]:
    return [getattr(node, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(node, f, None), list)]


def _offsets(text: str):
    """(the text's lines, each line's start offset, at(line, ast byte col) -> text offset)."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))

    def at(line: int, col: int) -> int:
        return starts[line - 1] + _col(lines[line - 1], col)
    return lines, starts, at


def _alone(lines: list[str], first: ast.stmt, last: ast.stmt) -> bool:
    """No other code before `first` on its first line nor after `last` on its last line (a comment may follow)."""
    head, tail = lines[first.lineno - 1], lines[(last.end_lineno or last.lineno) - 1]
    return not head[:_col(head, first.col_offset)].strip() and not tail[_col(tail, last.end_col_offset):].split("#")[0].strip()


def _col(line: str, byte_col: int) -> int:
    """ast columns are UTF-8 byte offsets."""
    return len(line.encode()[:byte_col].decode(errors="replace"))


def _import_point(tree: ast.Module) -> int:
    """Line index after the module's leading imports (after the docstring when there are none)."""
    at = 0
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            at = node.end_lineno or node.lineno
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and at == 0 and node is tree.body[0]:
            at = node.end_lineno or node.lineno
        elif at:
            break
    return at


def _complete(p: Program, bind: dict[str, str]) -> bool:
    texts = [bind.get(i.name) for i in p.inputs]
    return None not in texts and len(set(texts)) == len(texts)


def _const(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        c = _const(node.operand)
        return None if c is None else -c
    return None


def _match(p: Program, name, node: ast.expr, bind: dict[str, str]) -> bool:
    """Whether AST `node` computes program value `name`; binds inputs to source text (on success)."""
    if isinstance(name, float):
        return _const(node) == name
    if name.startswith("a"):
        text = ast.unparse(node)
        if bind.get(name, text) != text:
            return False
        bind[name] = text
        return True
    n = p.node(name)
    return _try(lambda b: _match_node(p, n, node, b), bind)


def _try(f, bind: dict[str, str]) -> bool:
    trial = dict(bind)
    if f(trial):
        bind.update(trial)
        return True
    return False


def _args_match(p: Program, names, exprs, bind) -> bool:
    return len(names) == len(exprs) and _try(lambda b: all(_match(p, a, x, b) for a, x in zip(names, exprs)), bind)


def _match_node(p: Program, n: Node, node: ast.expr, bind: dict[str, str]) -> bool:
    if n.op in AST_BIN and isinstance(node, ast.BinOp) and isinstance(node.op, AST_BIN[n.op]):
        pairs = [n.args]
        if n.op in ("add", "mul"):
            pairs.append(n.args[::-1])  # Python's `1 + t` reaches aten as add(t, 1)
        return any(_args_match(p, list(pr), [node.left, node.right], bind) for pr in pairs)
    if n.op == "rsub" and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        return _args_match(p, [n.args[1], n.args[0]], [node.left, node.right], bind)
    if n.op == "neg" and isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _match(p, n.args[0], node.operand, bind)
    if n.op == "pow" and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _const(node.right) == n.attrs["exponent"] and _match(p, n.args[0], node.left, bind)
    if not isinstance(node, ast.Call):
        return False
    tensor_args = _call_tensor_args(n, node)
    if tensor_args is not None:
        if n.op in ("layer_norm", "rms_norm"):  # F.layer_norm(x, shape, weight, bias, eps) / F.rms_norm(x, shape, weight, eps)
            spots = {"weight": 2, "bias": 3}
            kw = {k.arg: k.value for k in node.keywords}
            for k, i in spots.items():
                if k in n.attrs:
                    x = kw.get(k, node.args[i] if len(node.args) > i else None)
                    if x is None or not _match(p, n.attrs[k], x, bind):
                        return False
        return _match(p, n.args[0], tensor_args, bind)
    if n.name in p.norm_modules and n.op in UNARY_MODULES and _module_call(node, p, p.norm_modules[n.name]):
        # the module's own parameters: bound to `self.<module>.weight` when the graph says they are
        mod = ast.unparse(node.func)
        for k in ("weight", "bias"):
            if k in n.attrs:
                inp = next(i for i in p.inputs if i.name == n.attrs[k])
                if inp.origin != f"weight:{p.norm_modules[n.name]}.{k}" or bind.get(inp.name, f"{mod}.{k}") != f"{mod}.{k}":
                    return False
                bind[inp.name] = f"{mod}.{k}"
        return _match(p, n.args[0], node.args[0], bind)
    return False


def _call_tensor_args(n: Node, node: ast.Call) -> ast.expr | None:
    """The expression a call applies op n to: `x.sigmoid()` -> x, `torch.sigmoid(x)` / `F.silu(x)` -> x."""
    f = node.func
    fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if fname not in CALL_NAMES.get(n.op, ()):
        return None
    if isinstance(f, ast.Attribute) and not _namespace(f.value):
        return f.value  # a method of the tensor
    return node.args[0] if node.args else None


def _namespace(x: ast.expr) -> bool:
    root = x
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and (root.id in NAMESPACES or (x is root and root.id in NAMESPACES))


def _module_call(node: ast.Call, p: Program, norm_module: str) -> bool:
    """`self.a.b(x)` where the graph's norm op ran in submodule <statement's module>.a.b."""
    chain, f = [], node.func
    while isinstance(f, ast.Attribute):
        chain.append(f.attr)
        f = f.value
    if not (isinstance(f, ast.Name) and f.id == "self" and chain and len(node.args) == 1 and not node.keywords):
        return False
    rel = ".".join(reversed(chain))
    return norm_module == (f"{p.module}.{rel}" if p.module else rel)

