"""Typed fields over JSON objects, for bench.json (bot/knowledge/records.py): a record keeps the object
it was read from, so dumping writes the keys in the file's order and keeps keys no field names (a
file loaded and dumped unchanged is byte-identical); a record made in code writes its fields in
their declared order, and a field marked optional (`_opt`) is left out while it is unset. A value
of the wrong type is a ConfigError naming the file, the dotted key and the value."""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, ClassVar

from bot.errors import ConfigError

_OPTIONAL = {"optional": True}


def _opt(default: Any = None, factory: Any = None) -> Any:
    """A field whose key the file holds only when it was set."""
    if factory is not None:
        return field(default_factory=factory, metadata=_OPTIONAL)
    return field(default=default, metadata=_OPTIONAL)


def _short(v: Any) -> Any:
    """The value for an error message; a long one cut (a whole record would bury the message)."""
    r = repr(v)
    return v if len(r) <= 80 else r[:77] + "..."


class _Record:
    """Typed fields over a JSON object (subclasses are dataclasses)."""
    _doc: ClassVar[dict | None] = None  # per instance once loaded: the object it was read from

    @classmethod
    def from_json(cls, d: Any, file: str | Path = "(bench.json)", key: str = ""):
        if not isinstance(d, dict):
            raise ConfigError(file, key or "(top level)", _short(d), f"a mapping ({cls.__name__})")
        hints = typing.get_type_hints(cls)
        kw = {f.name: _decode(hints[f.name], d[f.name], file, f"{key}.{f.name}" if key else f.name)
              for f in dataclasses.fields(cls) if f.name in d}
        rec = cls(**kw)
        rec._doc = d
        return rec

    def to_json(self) -> dict:
        doc = self._doc
        out = dict(doc) if doc is not None else {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name not in out and v == _default(f) and (doc is not None or f.metadata.get("optional")):
                continue  # absent and unset: stays absent
            out[f.name] = _encode(v)
        return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def _encode(v: Any) -> Any:
    if isinstance(v, _Record):
        return v.to_json()
    if isinstance(v, dict):
        return {k: _encode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    return v


_SCALARS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a mapping",
            list: "a list"}


def _decode(tp: Any, v: Any, file, key: str) -> Any:
    """v checked against the annotation tp (records decoded, JSON numbers kept as read)."""
    if tp is Any:
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, v, file, key)
    if isinstance(tp, type) and issubclass(tp, _Record):
        return tp.from_json(v, file, key)
    if origin is dict or tp is dict:
        if not isinstance(v, dict):
            raise ConfigError(file, key, _short(v), "a mapping")
        inner = args[1] if args else Any
        return {k: _decode(inner, x, file, f"{key}.{k}") for k, x in v.items()}
    if origin is list or tp is list:
        if not isinstance(v, list):
            raise ConfigError(file, key, _short(v), "a list")
        inner = args[0] if args else Any
        return [_decode(inner, x, file, f"{key}[{i}]") for i, x in enumerate(v)]
    ok = {float: isinstance(v, (int, float)) and not isinstance(v, bool),
          int: isinstance(v, int) and not isinstance(v, bool)}.get(tp, isinstance(v, tp))
    if not ok:
        raise ConfigError(file, key, _short(v), _SCALARS.get(tp, tp.__name__))
    return v
