"""The template's rewrite across a call (wire.py's docstring, "Across a call"): the norm statement in
one method, its consumers in one statement of a helper method it calls with the norm's value."""
from __future__ import annotations

import ast
import copy
from pathlib import Path

from bot.generate.template.emit import Emitted, describe
from bot.generate.template.lift import Program, Refused
from bot.generate.template import wire
from bot.generate.template.wire import (Rewrite, _alone, _bodies, _statements, _callee, _find, _function_of, _Inline, _Lines,
                                        _loads, _offsets, _with_import, kernel_location)

FUSED_PARAM = "_optbot_fused"


def rewrite_across_call(p: Program, e: Emitted, ls: _Lines) -> Rewrite:
    """The norm statement in one method, its consumers in one statement of a helper method it calls
    with the norm's value (module docstring): the helper takes the kernel as `_optbot_fused`."""
    where, efile, text, tree = ls.where, ls.efile, ls.text, ls.tree
    groups: dict[int, tuple[ast.FunctionDef, list[ast.stmt]]] = {}
    for st in ls.stmts:
        fn = _function_of(tree, st)
        groups.setdefault(id(fn), (fn, []))[1].append(st)
    if len(groups) != 2 or any(fn is None for fn, _ in groups.values()):
        raise Refused(f"the instance's ops come from {len(groups)} functions ({where}); the template follows one "
                      "call from a method into a helper method")
    (fa, sa), (fb, sb) = groups.values()
    if _calls(fa, fb.name) and not _calls(fb, fa.name):
        caller, cstmts, helper, hstmts = fa, sa, fb, sb
    elif _calls(fb, fa.name) and not _calls(fa, fb.name):
        caller, cstmts, helper, hstmts = fb, sb, fa, sa
    else:
        raise Refused(f"{where}: neither {fa.name} nor {fb.name} calls the other as self.<method>(...)")
    cls = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and caller in c.body and helper in c.body), None)
    if cls is None:
        raise Refused(f"{where}: {caller.name} and {helper.name} are not methods of one class")
    if len(cstmts) != 1 or len(hstmts) != 1:
        raise Refused(f"{where}: {len(cstmts)} statement(s) in {caller.name} and {len(hstmts)} in {helper.name}; "
                      "across a call the template takes one norm statement and one helper statement")
    norm_stmt, use = cstmts[0], hstmts[0]
    norms = [n for n in p.nodes if n.op in ("layer_norm", "rms_norm")]
    if len(norms) != 1 or norms[0].args[0] not in {i.name for i in p.inputs}:
        raise Refused(f"{where}: across a call the template takes one norm of a program input ({describe(p)})")
    norm = norms[0]
    if "weight" in norm.attrs or "bias" in norm.attrs:
        raise Refused(f"{efile}:{norm_stmt.lineno}: the norm has a weight or bias; across a call the template "
                      f"passes only the norm's input, and {helper.name} may serve several norm modules")
    if not (isinstance(norm_stmt, ast.Assign) and len(norm_stmt.targets) == 1 and isinstance(norm_stmt.targets[0], ast.Name)
            and isinstance(norm_stmt.value, ast.Call) and norm_stmt.value.args):
        raise Refused(f"{efile}:{norm_stmt.lineno}: {ast.unparse(norm_stmt)[:80]!r} is not `name = <norm>(x, ...)`")
    normed = norm_stmt.targets[0].id
    body = next((b for node in ast.walk(caller) for b in _bodies(node) if norm_stmt in b), [])
    k = body.index(norm_stmt)
    reads = [n for st in ast.walk(caller) if isinstance(st, ast.stmt) and st.lineno > (norm_stmt.end_lineno or norm_stmt.lineno)
             for n in _loads(st) if n.id == normed]
    reads = list({id(n): n for n in reads}.values())  # a Name sits under every statement that encloses it
    call_stmt = body[k + 1] if k + 1 < len(body) else None
    call = next((c for c in ast.walk(call_stmt) if isinstance(c, ast.Call) and _is_self_call(c, helper.name)), None) \
        if call_stmt is not None else None
    if call is None or len(reads) != 1:
        raise Refused(f"{efile}:{norm_stmt.lineno}: {normed!r} is read {len(reads)} time(s) after it; the template "
                      f"moves the norm into {helper.name} only for a value passed to it once, on the next line")
    (read,) = reads
    a = helper.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or not a.args or a.args[0].arg != "self" \
            or any(x.arg == FUSED_PARAM for x in a.args):
        raise Refused(f"{efile}:{helper.lineno}: {helper.name}'s parameters are not `(self, plain, ...)`")
    pos = next((i for i, x in enumerate(call.args) if x is read), None)
    if pos is not None and pos + 1 < len(a.args):
        param = a.args[pos + 1].arg
    else:
        param = next((kw.arg for kw in call.keywords if kw.value is read and kw.arg in {x.arg for x in a.args}), None)
    if param is None:
        raise Refused(f"{efile}:{call_stmt.lineno}: {normed!r} is not passed to {helper.name} as a plain argument")
    if not isinstance(use, (ast.Return, ast.Assign)) or use.value is None:
        raise Refused(f"{efile}:{use.lineno}: the helper statement is a {type(use).__name__}, not a return or an assignment")
    # the helper's expression with its parameter standing for the norm's call on it: matched as one statement
    marker = copy.deepcopy(norm_stmt.value)
    marker.args[0] = ast.Name(param, ast.Load())
    expr = _Inline(param, marker).visit(copy.deepcopy(use.value))
    sub, bind = _find(p, expr, f"{where}: no sub-expression of {helper.name}'s")
    if bind.get(norm.args[0]) != param:
        raise Refused(f"{where}: the norm's input binds to {bind.get(norm.args[0])!r}, not {helper.name}'s {param!r}")
    span = ((sub.lineno, sub.col_offset), (sub.end_lineno, sub.end_col_offset))
    outside = [n for n in _loads(helper) if n.id == param and not span[0] <= (n.lineno, n.col_offset) < span[1]]
    stored = [n for n in ast.walk(helper) if isinstance(n, ast.Name) and n.id == param and not isinstance(n.ctx, ast.Load)]
    if outside or stored:
        n = (outside or stored)[0]
        raise Refused(f"{efile}:{n.lineno}: {helper.name} {'reads' if outside else 'assigns'} {param!r} outside "
                      "the fused expression; it would see the norm's input instead of its output")
    lines, starts, at = _offsets(text)
    kfile, dotted = kernel_location(efile, e.op_name)
    alias = _callee(ls.import_root, kfile, e)
    s_text = text[at(*span[0]):at(*span[1])]
    args = ", ".join(bind[i.name] for i in p.inputs)
    last_param = a.args[-1]
    sig_end = a.defaults[-1] if a.defaults else last_param
    call_end = max([*call.args, *(kw.value for kw in call.keywords)], key=lambda x: (x.end_lineno, x.end_col_offset))
    raw = ast.get_source_segment(text, norm_stmt.value.args[0])
    n_first, n_last = norm_stmt.lineno, norm_stmt.end_lineno or norm_stmt.lineno
    if not _alone(lines, norm_stmt, norm_stmt):
        raise Refused(f"{efile}:{n_first}: the norm statement shares its lines with other code")
    edits = [  # (start, end, new text), base-file offsets; applied from the end
        (at(*span[0]), at(*span[1]), f"({s_text} if {FUSED_PARAM} is None else {FUSED_PARAM}({args}))"),
        (at(sig_end.end_lineno, sig_end.end_col_offset),) * 2 + (f", {FUSED_PARAM}=None",),
        (starts[n_first - 1], starts[n_last], ""),
        (at(read.lineno, read.col_offset), at(read.end_lineno, read.end_col_offset), raw),
        (at(call_end.end_lineno, call_end.end_col_offset),) * 2 + (f", {FUSED_PARAM}={alias}",),
    ]
    new_text = text
    for a0, b0, t in sorted(edits, key=lambda x: x[0], reverse=True):
        new_text = new_text[:a0] + t + new_text[b0:]
    new_text, new_tree, import_line, _ = _with_import(where, ls.path, tree, new_text, dotted, alias, e)
    # the innermost statement holding the call (the class and method around it hold it too)
    new_call = min((st for st in ast.walk(new_tree) if isinstance(st, ast.stmt) and not hasattr(st, "body")
                    and f"{FUSED_PARAM}={alias}" in ast.unparse(st)),
                   key=lambda st: (st.end_lineno or st.lineno) - st.lineno, default=None)
    new_use = next((st for st in ast.walk(new_tree) if isinstance(st, type(use)) and not isinstance(st, ast.FunctionDef)
                    and f"{FUSED_PARAM} is None else {FUSED_PARAM}(" in ast.unparse(st)), None)
    if new_call is None or new_use is None:
        raise Refused(f"{where}: the rewritten statements were not found after the rewrite")
    old = f"{ast.unparse(norm_stmt)}\n{ast.unparse(call_stmt)}\n{helper.name}: {ast.unparse(use)}"
    new = f"{ast.unparse(new_call)}\n{helper.name}: {ast.unparse(new_use)}"
    spans = ((n_first, call_stmt.end_lineno or call_stmt.lineno), (helper.lineno, sig_end.end_lineno),
             (use.lineno, use.end_lineno or use.lineno))
    return Rewrite(efile, n_first, old, new, kfile, import_line, new_text, spans=spans)


def _is_self_call(c: ast.Call, name: str) -> bool:
    return isinstance(c.func, ast.Attribute) and c.func.attr == name and isinstance(c.func.value, ast.Name) \
        and c.func.value.id == "self"


def _calls(fn: ast.AST, name: str) -> bool:
    return any(isinstance(c, ast.Call) and _is_self_call(c, name) for c in ast.walk(fn))


def rewrite(p: Program, e: Emitted, import_root: Path) -> Rewrite:
    """wire.rewrite, and the rewrite across a call where the ops' lines are in two functions (the
    file parsed once for either)."""
    if p.src:
        return wire.rewrite(p, e, import_root)
    ls = _statements(p, import_root)
    if len({id(_function_of(ls.tree, s)) for s in ls.stmts}) > 1:
        return rewrite_across_call(p, e, ls)
    return wire._rewrite_run(p, e, ls)
