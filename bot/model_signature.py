"""The model class's forward and __init__ parameters, read from the engine's source without importing it.

A workload names its model's forward inputs and its __init__ config by keyword; a misspelt name
would otherwise surface as a TypeError inside a runner, minutes later. Here the engine's Python
files are parsed with `ast`: no torch, no engine dependency, no engine code runs.

The check never gives a false error. A method is read from the class, else from its bases in the
order Python would (C3), as long as each base is a class defined in the engine. A base from outside
the engine (torch.nn.Module), a name bound conditionally or by assignment, a class decorator that may
add the method: the method is then None, "unknown", and nothing about it is checked.
"""
from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass, field
from pathlib import Path

from bot.errors import ConfigError


@dataclass(frozen=True)
class MethodSignature:
    params: tuple[str, ...]  # the names after self, in order: positional, then keyword-only
    required: tuple[str, ...]  # params without a default
    var_keyword: bool  # **kwargs: any keyword name is accepted
    var_positional: bool  # *args
    line: int
    file: str = ""  # relative to the engine root: where the def is (a base's file when inherited)
    owner: str = ""  # the class whose body defines it
    positional_only: tuple[str, ...] = ()  # params before "/": never given by keyword


@dataclass(frozen=True)
class ModelSignature:
    name: str
    file: str  # relative to the engine root
    line: int
    forward: MethodSignature | None  # None: unknown, do not check
    init: MethodSignature | None


UNKNOWN = object()  # a name whose meaning the source does not settle (outside the engine, dynamic, ambiguous)
_AMBIGUOUS = ("ambiguous",)  # a module-level name bound by two different statements


@dataclass(frozen=True)
class _Missing:
    module: "_Module"
    name: str


@dataclass
class _Parsed:
    """One file's module-level bindings: cached per file, independent of the module's dotted name."""
    bindings: dict  # name -> ("class", node) | ("import", dotted) | ("from", level, module, name) | ("other",)
    stars: list  # (level, module) of each `from X import *`
    dynamic: bool  # a module-level __getattr__ can answer any name


_CACHE: dict[tuple[str, int, int], _Parsed] = {}


def _parse(path: Path) -> _Parsed:
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        p = _Parsed({}, [], False)
        _collect(p, ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path)).body)
        _CACHE[key] = p
    return _CACHE[key]


def _bind(p: _Parsed, name: str, b: tuple) -> None:
    old = p.bindings.get(name)
    p.bindings[name] = b if old is None or old == b else _AMBIGUOUS


def _stores(node) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _collect(p: _Parsed, stmts) -> None:
    # Names bound under `if`/`try` count (diffusers imports its classes under
    # `if TYPE_CHECKING or DIFFUSERS_SLOW_IMPORT:`); two different bindings of one name make it ambiguous.
    for s in stmts:
        if isinstance(s, ast.ClassDef):
            _bind(p, s.name, ("class", s))
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _bind(p, s.name, ("other",))
            p.dynamic |= s.name == "__getattr__"
        elif isinstance(s, ast.Import):
            for a in s.names:
                name = a.asname or a.name.split(".")[0]  # `import a.b` binds a; `import a.b as c` binds c to a.b
                _bind(p, name, ("import", a.name if a.asname else name))
        elif isinstance(s, ast.ImportFrom):
            for a in s.names:
                if a.name == "*":
                    p.stars.append((s.level, s.module))
                else:
                    _bind(p, a.asname or a.name, ("from", s.level, s.module, a.name))
        elif getattr(s, "body", None) is not None:  # if, try, with, for, while
            headers = [getattr(s, "target", None), *[i.optional_vars for i in getattr(s, "items", [])]]
            for n in [n for h in headers if h is not None for n in _stores(h)]:
                _bind(p, n, ("other",))
            for h in getattr(s, "handlers", []):
                if h.name:
                    _bind(p, h.name, ("other",))
                _collect(p, h.body)
            for part in ("body", "orelse", "finalbody"):
                _collect(p, getattr(s, part, []))
        else:
            for n in _stores(s):
                _bind(p, n, ("other",))


@dataclass(frozen=True)
class _Module:
    name: str = field(compare=False)  # dotted; one file is one module, however it was reached
    path: Path
    is_package: bool = field(compare=False)

    @property
    def parsed(self) -> _Parsed:
        return _parse(self.path)

    def absolute(self, level: int, module: str | None) -> str | None:
        """The dotted name `from <level dots><module> import ...` means inside this module."""
        if not level:
            return module
        parts = self.name.split(".") if self.is_package else self.name.split(".")[:-1]
        if level - 1 > len(parts) or (level - 1 == len(parts) and not module):
            return None
        parts = parts[:len(parts) - (level - 1)]
        return ".".join([*parts, module] if module else parts) or None


@dataclass(frozen=True)
class _Class:
    module: _Module
    node: ast.ClassDef

    @property
    def key(self):
        return (str(self.module.path), self.node.lineno, self.node.name)


@dataclass(frozen=True)
class _Opaque:
    """A base class the engine does not define (torch.nn.Module): C3 orders it, nothing is read from it."""
    what: str  # its dotted name where the imports say it, so that two spellings of one class are one


_OBJECT = _Opaque("builtins.object")


class _Engine:
    def __init__(self, engine_root: Path, import_root: str):
        self.root = Path(engine_root)
        self.src = self.root / import_root

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def module(self, dotted: str | None):
        """The engine's module of that dotted name; UNKNOWN when it lies outside the engine or is not
        Python source; None when its package is in the engine but the module is not."""
        if not dotted:
            return UNKNOWN
        parts = dotted.split(".")
        top = self.src / parts[0]
        if not (top.is_dir() or top.with_suffix(".py").is_file() or _compiled(top)):
            return UNKNOWN
        base = self.src.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return _Module(dotted, base.with_suffix(".py"), False)
        if (base / "__init__.py").is_file():
            return _Module(dotted, base / "__init__.py", True)
        if _compiled(base) or base.is_dir():  # an extension module, or a namespace package
            return UNKNOWN
        return None

    def lookup(self, mod: _Module, name: str, seen: frozenset = frozenset()):
        """What `mod.name` is: a _Class, a _Module, UNKNOWN, or _Missing (certainly not there)."""
        if (mod.path, name) in seen:
            return UNKNOWN  # an import cycle
        seen = seen | {(mod.path, name)}
        p = mod.parsed
        b = p.bindings.get(name)
        if b is not None:
            return self._follow(mod, b, seen)
        if p.dynamic:
            return UNKNOWN
        for level, star in p.stars:
            m = self.module(mod.absolute(level, star))
            if not isinstance(m, _Module):
                return UNKNOWN
            r = self.lookup(m, name, seen)
            if not isinstance(r, _Missing):
                return r
        if mod.is_package:  # `pkg.sub` is the submodule when pkg/__init__.py binds no `sub`
            sub = self.module(f"{mod.name}.{name}")
            if sub is not None:
                return sub
        return _Missing(mod, name)

    def _follow(self, mod: _Module, b: tuple, seen):
        if b[0] == "class":
            return _Class(mod, b[1])
        if b[0] == "import":
            return self.module(b[1]) or UNKNOWN
        if b[0] == "from":
            _, level, module, name = b
            m = self.module(mod.absolute(level, module))
            if not isinstance(m, _Module):
                return UNKNOWN
            r = self.lookup(m, name, seen)
            return UNKNOWN if isinstance(r, _Missing) else r
        return UNKNOWN

    def expr(self, mod: _Module, node):
        """A base-class expression in `mod`: a _Class, a _Module, or an _Opaque for anything else."""
        r = UNKNOWN
        if isinstance(node, ast.Name):
            if node.id == "object" and node.id not in mod.parsed.bindings:
                return _OBJECT
            r = self.lookup(mod, node.id)
        elif isinstance(node, ast.Attribute):
            head = self.expr(mod, node.value)
            if isinstance(head, _Module):
                r = self.lookup(head, node.attr)
            elif isinstance(head, _Class):
                r = _nested(head, node.attr) or UNKNOWN
        if isinstance(r, (_Class, _Module)):
            return r
        return _Opaque(_dotted(mod, node) or f"{mod.name}:{ast.unparse(node)}")

    def mro(self, cls: _Class, stack: tuple = ()) -> list | None:
        """The class's C3 linearization, bases outside the engine as opaque leaves; None where C3 fails."""
        if cls.key in stack:
            return None
        bases = [self.expr(cls.module, e) for e in cls.node.bases]
        bases = [_Opaque(b.name) if isinstance(b, _Module) else b for b in bases] or [_OBJECT]
        seqs = []
        for b in bases:
            lin = self.mro(b, (*stack, cls.key)) if isinstance(b, _Class) else [b] if b == _OBJECT else [b, _OBJECT]
            if lin is None:
                return None
            seqs.append(lin)
        merged = _c3([*seqs, bases])
        return None if merged is None else [cls, *merged]

    def method(self, cls: _Class, name: str) -> MethodSignature | None:
        for c in self.mro(cls) or []:
            if isinstance(c, _Opaque):
                return None  # object's too: object.__init__ takes any arguments where __new__ is overridden
            found = _in_body(c.node, name)
            if found is UNKNOWN:
                return None
            if found is not None:
                return _signature(found, self.rel(c.module.path), c.node.name)
            if c.node.decorator_list:  # @dataclass and the like may add the method
                return None
        return None


def _compiled(base: Path) -> bool:
    return any(p.suffix in (".so", ".pyd") for p in base.parent.glob(base.name + ".*"))


def _dotted(mod: _Module, node) -> str | None:
    """The absolute dotted name an expression stands for, read from the module's imports."""
    if isinstance(node, ast.Attribute):
        head = _dotted(mod, node.value)
        return f"{head}.{node.attr}" if head else None
    if not isinstance(node, ast.Name):
        return None
    b = mod.parsed.bindings.get(node.id)
    if b is None:
        return f"builtins.{node.id}"
    if b[0] == "import":
        return b[1]
    if b[0] == "from" and (m := mod.absolute(b[1], b[2])):
        return f"{m}.{b[3]}"
    return None


def _nested(cls: _Class, name: str) -> _Class | None:
    defs = [s for s in cls.node.body if isinstance(s, ast.ClassDef) and s.name == name]
    return _Class(cls.module, defs[-1]) if defs else None


def _c3(seqs: list[list]) -> list | None:
    seqs = [list(s) for s in seqs if s]
    out = []
    while seqs:
        for s in seqs:
            head = s[0]
            if not any(head in t[1:] for t in seqs):
                break
        else:
            return None  # Python would refuse this class (TypeError: cannot create a consistent MRO)
        out.append(head)
        seqs = [t[1:] if t[0] == head else t for t in seqs]
        seqs = [t for t in seqs if t]
    return out


def _in_body(node: ast.ClassDef, name: str):
    """The class body's last def of `name`; UNKNOWN when the body binds it any other way; None when absent."""
    found = None
    for s in node.body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found = s if s.name == name else found
        elif _binds(s, name):
            found = UNKNOWN
    if isinstance(found, ast.AST) and any(_decorator_name(d) == "property" for d in found.decorator_list):
        return UNKNOWN
    return found


def _binds(stmt, name: str) -> bool:
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == name or \
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and \
                any((a.asname or a.name).split(".")[0] == name for a in n.names):
            return True
    return False


def _decorator_name(d) -> str:
    d = d.func if isinstance(d, ast.Call) else d
    return d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else ""


def _signature(fn, file: str, owner: str) -> MethodSignature:
    a = fn.args
    positional = [x.arg for x in (*a.posonlyargs, *a.args)]
    # self (or cls) is bound by the call; a staticmethod has none
    skip = 0 if any(_decorator_name(d) == "staticmethod" for d in fn.decorator_list) else 1
    first_default = len(positional) - len(a.defaults)
    required = [n for i, n in enumerate(positional) if skip <= i < first_default]
    required += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    params = positional[skip:] + [x.arg for x in a.kwonlyargs]
    posonly = tuple(x.arg for x in a.posonlyargs)[skip:]
    return MethodSignature(tuple(params), tuple(required), a.kwarg is not None, a.vararg is not None, fn.lineno,
                           file, owner, posonly)


def read_signature(engine_root: Path, import_root: str, model_class: str, *, workload_file: str = "workload",
                   key: str = "model_class") -> ModelSignature | None:
    """The model class's signatures, or None when the class is not Python source of the engine
    (outside it, compiled, bound dynamically). Raises ConfigError, naming `workload_file` and `key`
    (engines.<name>.model_class), when the engine's source shows the class does not exist there."""
    eng = _Engine(Path(engine_root), import_root)
    parts = model_class.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ConfigError(workload_file, key, model_class, "a dotted path package.module.Class")
    for i in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module file
        if (target := eng.module(".".join(parts[:i]))) is not None:
            break  # parts[0] alone is never None: it is in the engine (a module) or not (UNKNOWN)
    if target is UNKNOWN:
        return None
    for attr in parts[i:]:
        if isinstance(target, _Module):
            found = eng.lookup(target, attr)
        elif isinstance(target, _Class):
            found = _nested(target, attr) or UNKNOWN
        else:
            return None
        if isinstance(found, _Missing):
            raise ConfigError(workload_file, key, model_class, _missing_text(eng, found))
        target = found
    if isinstance(target, _Module):
        raise ConfigError(workload_file, key, model_class, f"a class; {eng.rel(target.path)} is a module")
    if not isinstance(target, _Class):
        return None
    return ModelSignature(target.node.name, eng.rel(target.module.path), target.node.lineno,
                          eng.method(target, "forward"), eng.method(target, "__init__"))


def _missing_text(eng: _Engine, m: _Missing) -> str:
    names = [n for n, b in m.module.parsed.bindings.items() if b[0] in ("class", "from", "import")]
    if m.module.is_package:
        for p in m.module.path.parent.iterdir():
            if p.suffix == ".py" and p.stem != "__init__":
                names.append(p.stem)
            elif (p / "__init__.py").is_file():
                names.append(p.name)
    close = _close(m.name, names)
    return (f"a class defined in the engine; {eng.rel(m.module.path)} defines no {m.name!r}"
            + (f" (close names: {close})" if close else ""))


def _close(name: str, names) -> str:
    """The nearest names, those within 0.1 of the best match (a transposed 'maks' scores 0.75)."""
    scored = sorted((-difflib.SequenceMatcher(None, name, n).ratio(), n) for n in set(names))
    return " or ".join(repr(n) for r, n in scored[:3] if -r >= max(0.7, -scored[0][0] - 0.1)) if scored else ""


def _where(sig: ModelSignature, method: str, m: MethodSignature) -> str:
    inherited = "" if m.owner == sig.name else f"inherited from {m.owner}, "
    return f"{sig.name}.{method} ({inherited}{m.file}:{m.line})"


def _check_call(sig: ModelSignature, method: str, m: MethodSignature, names: list[str], file: str, key: str,
                unset: str) -> list[str]:
    where, errors = _where(sig, method, m), []
    takes = ", ".join(m.params) or "no arguments"
    for n in names:
        if n in m.positional_only:
            errors.append(f"{file}: key '{key}.{n}': {where} takes {n!r} only by position; these are passed by keyword")
        elif n not in m.params and not m.var_keyword:
            close = _close(n, [p for p in m.params if p not in m.positional_only])
            errors.append(f"{file}: key '{key}.{n}': {where} takes no argument {n!r}; it takes {takes}"
                          + (f"; did you mean {close}?" if close else ""))
    for r in m.required:
        if r in m.positional_only:
            errors.append(f"{file}: key '{key}': {where} requires {r!r} by position, which a keyword cannot give")
        elif r not in names:
            errors.append(f"{file}: key '{key}': {where} requires {r!r}, which {unset}")
    return errors


def check_inputs(sig: ModelSignature | None, input_names: list[str], config_keys_by_preset: dict[str, list[str]],
                 workload_file: str, input_key_prefix: str = "inputs.forward",
                 config_key_fmt: str = "presets.{preset}.config") -> list[str]:
    """Every forward input and config key the model class cannot take, and every argument it requires
    that none gives, as messages naming the workload file and key; [] when all fit or nothing is known."""
    if sig is None:
        return []
    errors = []
    if sig.forward is not None:
        errors += _check_call(sig, "forward", sig.forward, list(input_names), workload_file, input_key_prefix,
                              "no input declares")
    if sig.init is not None:
        for preset, keys in config_keys_by_preset.items():
            errors += _check_call(sig, "__init__", sig.init, list(keys), workload_file,
                                  config_key_fmt.format(preset=preset), f"preset {preset!r}'s config does not set")
    return errors
