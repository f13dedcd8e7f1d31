"""Compile-region generator: wrap the hot repeated region of the model in torch.compile, as a candidate
commit like any other (its own worktree, one commit with Optbot-* trailers, validated the same way).

Which region: from the profile, kernel time is summed per *repeated container*, the part of a module
path before a block index (``transformer_blocks.3.attn.to_q`` -> ``transformer_blocks``). Containers
holding at least ``min_share`` of the step's kernel time are compiled; nothing is keyed on a model's
names. This is regional compilation: each block compiles in place with ``nn.Module.compile()``, so
blocks of a class share one compiled graph, the state-dict keys do not change (weights load as
before), and the non-repeated glue stays eager.

How: the engine's own ``self.compile_repeated_blocks()`` (diffusers) when the engine defines it and
the class declares ``_repeated_blocks`` naming every chosen container's block class; else a loop
calling ``.compile()`` on each block of the chosen containers.

Where the patch goes: the end of the model class's ``__init__`` (found with ast in the engine
worktree). Both construction paths keep it: the runner's seeded build (runner/weights.py: parameters
registered on meta, then replaced in place) and ``from_pretrained`` replace parameters, not blocks.

Why it engages now: the validator's first calls of the step run under runner.poison.PoisonEmpty, a
TorchDispatchMode. Dynamo does not trace under a mode that is not compile-transparent, and marks the
block's forward "skip" for the rest of the process, so the blocks ran eager in correctness, profile
and timing alike (the H200 verdict compile-region-4d08c68b: bit-identical outputs, identical
histogram). PoisonEmpty is compile-transparent (so is the FLOP counter, runner/profiler.py, which
left the blocks eager the same way), and the profiler puts no hooks inside a block that runs
compiled (docs/generate.md, Compile region).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from bot.errors import OptbotError
from bot.generate.candidate import Candidate, commit_message, make_trailers
from bot.generate.commits import commit_candidate

INDEXED = re.compile(r"^(?P<container>[A-Za-z_][\w.]*?)\.(?P<idx>\d+)(?:\.|$)")


@dataclass
class Region:
    container: str  # attribute path of the repeated container, e.g. "transformer_blocks"
    ms: float
    share: float  # of the step's kernel time
    blocks: int  # distinct indices seen in the profile


def choose_regions(profile: dict, min_share: float = 0.10) -> list[Region]:
    kernels = profile.get("kernels") or []
    total = sum(float(k.get("ms") or 0.0) for k in kernels) or float(profile.get("total_ms") or 0.0)
    if total <= 0:
        return []
    ms: dict[str, float] = {}
    idx: dict[str, set] = {}
    for k in kernels:
        m = INDEXED.match(k.get("module") or "")
        if not m:
            continue
        c = m["container"]
        ms[c] = ms.get(c, 0.0) + float(k.get("ms") or 0.0)
        idx.setdefault(c, set()).add(m["idx"])
    regions = [Region(c, v, v / total, len(idx[c])) for c, v in ms.items() if len(idx[c]) > 1 and v / total >= min_share]
    return sorted(regions, key=lambda r: -r.ms)


def model_source(worktree: Path, import_root: str, model_class: str) -> tuple[Path, str]:
    mod, _, cls = model_class.rpartition(".")
    base = Path(worktree) / import_root / Path(*mod.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p, cls
    raise OptbotError(f"model class {model_class}: no source file {base}.py in {worktree}")


def _call_name(node) -> str | None:
    f = node.func if isinstance(node, ast.Call) else None
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _element_class(init: ast.FunctionDef, attr: str) -> str | None:
    """The block class of ``self.<attr> = nn.ModuleList([Block(...) for ...])`` (or of a list of
    ``Block(...)`` calls), else None."""
    for n in ast.walk(init):
        if not (isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == attr and
                                                  isinstance(t.value, ast.Name) and t.value.id == "self"
                                                  for t in n.targets)):
            continue
        v = n.value
        if _call_name(v) in ("ModuleList", "Sequential") and len(v.args) == 1:
            v = v.args[0]
        elts = [v.elt] if isinstance(v, (ast.ListComp, ast.GeneratorExp)) else \
            list(v.elts) if isinstance(v, (ast.List, ast.Tuple)) else []
        names = {_call_name(e) for e in elts}
        return names.pop() if len(names) == 1 and None not in names else None
    return None


def _repeated_blocks(cls: ast.ClassDef) -> list[str]:
    """The class's own ``_repeated_blocks = [...]`` (diffusers' declaration for regional compile)."""
    for n in cls.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_repeated_blocks" for t in n.targets):
            try:
                value = ast.literal_eval(n.value)
            except ValueError:
                return []
            return [v for v in value if isinstance(v, str)] if isinstance(value, (list, tuple)) else []
    return []


def patch_model(text: str, class_name: str, containers: list[str], file: str = "<model>",
                engine_api: bool = False) -> tuple[str, str]:
    """Insert the regional compile at the end of class_name.__init__; returns (new text, how).

    how = "compile_repeated_blocks" when the engine has diffusers' ``compile_repeated_blocks``
    (engine_api) and the class declares ``_repeated_blocks`` naming the block class of every chosen
    container: the engine's own regional compile. Else "per-block": ``.compile()`` on each block of
    the chosen containers, which is what compile_repeated_blocks does for the classes it names."""
    tree = ast.parse(text)
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise OptbotError(f"{file}: no class {class_name}")
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        raise OptbotError(f"{file}: class {class_name} defines no __init__ to put the compile call in")
    assigned = {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    for c in containers:
        if c.split(".")[0] not in assigned:
            raise OptbotError(f"{file}: {class_name}.__init__ does not assign self.{c.split('.')[0]}")
    lines = text.splitlines(keepends=True)
    first = init.body[0]
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) and len(init.body) > 1:
        first = init.body[1]  # skip a docstring for the indentation
    indent = re.match(r"\s*", lines[first.lineno - 1])[0]
    end = init.body[-1].end_lineno
    declared = _repeated_blocks(cls)
    classes = [_element_class(init, c) for c in containers if "." not in c]
    names = ", ".join(containers)
    if engine_api and declared and len(classes) == len(containers) and all(k in declared for k in classes):
        how = "compile_repeated_blocks"
        block = [
            f"{indent}# optbot compile-region: regional torch.compile of the repeated blocks ({names}),\n",
            f"{indent}# by the engine's own compile_repeated_blocks (the classes in _repeated_blocks). Each\n",
            f"{indent}# block compiles in place (nn.Module.compile), so blocks of a class share one graph and\n",
            f"{indent}# the state-dict keys are unchanged.\n",
            f"{indent}self.compile_repeated_blocks()\n",
        ]
    else:
        how = "per-block"
        members = ", ".join(f"*self.{c}" for c in containers)
        block = [
            f"{indent}# optbot compile-region: regional torch.compile of the repeated blocks ({names}).\n",
            f"{indent}# Each block compiles in place (nn.Module.compile), so blocks share one graph and the\n",
            f"{indent}# state-dict keys are unchanged.\n",
            f"{indent}for _optbot_block in ({members},):\n",
            f"{indent}    _optbot_block.compile()\n",
        ]
    new = "".join(lines[:end] + block + lines[end:])
    ast.parse(new)  # the patched file must still parse
    return new, how


def patch_source(text: str, class_name: str, containers: list[str], file: str = "<model>",
                 engine_api: bool = False) -> str:
    """patch_model's new text."""
    return patch_model(text, class_name, containers, file, engine_api)[0]


def engine_defines(root: Path, name: str) -> bool:
    """Does a Python file under the engine's import root define function `name`?"""
    pat = re.compile(rf"^\s*def {re.escape(name)}\(", re.M)
    for p in Path(root).rglob("*.py"):
        try:
            if name in (t := p.read_text(errors="ignore")) and pat.search(t):
                return True
        except OSError:
            continue
    return False


def generate(checkout, base_sha: str, profile: dict, model_class: str, import_root: str, run_id: str,
             opportunity: dict | None = None, min_share: float = 0.10) -> Candidate | None:
    """A compile-region candidate in its own worktree, or None when no repeated region is hot enough."""
    from bot.engine import add_worktree

    regions = choose_regions(profile, min_share)
    if not regions:
        return None
    containers = [r.container for r in regions]
    wt = add_worktree(checkout, f"compile-region-{run_id}", ref=base_sha)
    src, cls = model_source(wt, import_root, model_class)
    text, how = patch_model(src.read_text(), cls, containers, str(src),
                            engine_api=engine_defines(Path(wt) / import_root, "compile_repeated_blocks"))
    src.write_text(text)
    opp = opportunity or {}
    kind = str(opp.get("kind") or "launch-bound")
    trailers = make_trailers(str(opp.get("id") or "none"), kind, [], [], generator="compile-region", run_id=run_id)
    title = f"torch.compile the repeated blocks: {', '.join(containers)}"
    body = "Regions chosen from the profile (share of the step's kernel time):\n" + "\n".join(
        f"- {r.container}: {r.ms:.3f} ms ({100 * r.share:.1f}%, {r.blocks} blocks seen)" for r in regions) + (
        "\n\nCompiled at the end of the model's __init__ with the engine's compile_repeated_blocks()."
        if how == "compile_repeated_blocks" else
        "\n\nCompiled at the end of the model's __init__, each block with nn.Module.compile().")
    sha = commit_candidate(wt, base_sha, title, body, trailers)
    return Candidate(id=f"compile-region-{sha[:8]}", opportunity_id=str(opp.get("id") or "none"), kind=kind,
                     generator="compile-region", worktree=str(wt), commit_sha=sha, base_sha=base_sha,
                     trailers=trailers, title=title, description=commit_message(title, body, trailers))
