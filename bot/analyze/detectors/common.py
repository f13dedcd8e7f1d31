"""Helpers shared by detectors."""
from __future__ import annotations

import re

from bot.analyze.graph import Graph, Op


def region(path: str, prefix: str = "") -> str:
    """The unit a module belongs to: the path up to its first numbered component
    (transformer_blocks.3.attn.to_q -> transformer_blocks.3), else the model's child it is in
    (time_text_embed.timestep_embedder.linear_1 -> time_text_embed). `prefix` is a wrapper path
    common to every module (a model wrapped in another module), kept but not counted."""
    m = re.match(r"^(.*?\.\d+)(?:\.|$)", path)
    if m:
        return m.group(1)
    if prefix and (path + ".").startswith(prefix):
        rest = path[len(prefix):]
        return prefix + rest.split(".")[0] if rest else path
    return path.split(".")[0]


def wrapper_prefix(g: Graph) -> str:
    """"inner." when every module path is "inner" or under it (a model wrapped in another module),
    repeatedly; "" for most models."""
    paths = [m[0] for m in g.raw.get("modules", [])]
    prefix = ""
    while paths:
        first = paths[0][len(prefix):].split(".")[0]
        cand = prefix + first
        if not first or not all(p == cand or p.startswith(cand + ".") for p in paths):
            break
        prefix = cand + "."
        paths = [p for p in paths if p != cand]
    return prefix


def describe_ops(g: Graph, ids) -> str:
    names = []
    for i in sorted(set(ids)):
        o = g.ops[i]
        if not o.alias:
            names.append(o.name)
    out, last, n = [], None, 0
    for x in names + [None]:
        if x == last:
            n += 1
            continue
        if last is not None:
            out.append(f"{last}x{n}" if n > 1 else last)
        last, n = x, 1
    return " -> ".join(out)


def work_ops(g: Graph, ids) -> list[int]:
    return sorted({i for i in ids if not g.ops[i].alias})


def anchor_of(g: Graph, ids) -> int:
    for i in sorted(ids):
        if g.ops[i].src and not g.ops[i].alias:
            return i
    return min(ids) if ids else -1


def labels_of(g: Graph, op: Op) -> list[str]:
    d = g.op_deps(op)
    return [n for i, n in enumerate(g.labels) if d >> i & 1]
