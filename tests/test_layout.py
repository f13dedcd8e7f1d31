"""The layout rules of the redesign (issue 13): no import cycles between bot/ and runner/ modules,
no bot module over 450 lines. The import graph is built from the AST, function-level imports
included (a lazy import only hides a cycle, it does not remove it); imports under
`if TYPE_CHECKING:` are left out (annotations only: never executed)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "runner")
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is one of our modules (an import of a function or
    class resolves to the module defining it)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours that `mod` imports, at any level of the file."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package
                base = mod.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from bot.knowledge import store` imports a module; `from bot.knowledge.store import Entry` a name
            names = [f"{prefix}.{a.name}" for a in node.names] + [prefix]
        else:
            continue
        for n in names:
            target = _resolve(n, known)
            if target and target != mod:
                out.add(target)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(old)
    return out


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (module -> module, function-level imports included):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_has_lazy_imports_and_not_annotation_only_ones(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bot.y import Y\n"
                 "def f():\n    from bot.z import g\n    import bot.w\n")
    known = {m: f for m in ("bot.x", "bot.y", "bot.z", "bot.w")}
    assert imports_of("bot.x", f, known) == {"bot.z", "bot.w"}


def test_no_bot_module_over_450_lines():
    over = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "bot").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"


def test_the_heavy_first_schedule_names_test_files_that_exist():
    """tests/conftest.py HEAVY_FIRST orders xdist's work by file path: a renamed or deleted file there
    would silently fall back to the end of the run instead of failing."""
    from tests.conftest import HEAVY_FIRST

    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
    missing = [p for p in HEAVY_FIRST if not (ROOT / p).is_file() or not Path(p).name.startswith("test_")]
    assert not missing, missing
