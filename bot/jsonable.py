"""Dataclasses to JSON and back, by their type hints: the one codec of the run directory.

Every step result (bot/steps/), the Verdict and the Candidate are written with ``to_json`` and read
back with ``from_json(Type, data)``, so a resumed run holds the same typed objects as the run that
wrote them, never dicts. Supported field types: dataclasses, ``X | None``, ``list[X]``,
``tuple[X, ...]``, ``dict[str, X]``, ``Path`` and JSON scalars. A key the dataclass does not have
is an error (the file was written by another optbot), not something to drop silently.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from pathlib import Path
from typing import Any


def to_json(obj: Any) -> Any:
    """Plain JSON data of a dataclass (or of lists, tuples, dicts and Paths of them)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_json(tp: Any, data: Any, strict: bool = False) -> Any:
    """``data`` (as ``to_json`` wrote it) as an instance of type ``tp``. ``strict``: also every scalar
    must be of its hinted type (str, int, float, bool), for input another machine wrote (a fan-out
    shard's results, bot/run/fanout.py); the run directory's own files are read without it."""
    if data is None or tp is Any:
        return data
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return from_json(args[0], data, strict) if len(args) == 1 else data
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise TypeError(f"{tp.__name__}: expected an object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = sorted(set(data) - names)
        if unknown:
            raise TypeError(f"{tp.__name__}: unknown keys {unknown}")
        hints = _hints(tp)
        out = {}
        for k, v in data.items():
            try:
                out[k] = from_json(hints[k], v, strict)
            except TypeError as e:  # say where: "steps: expected an object, got list"
                raise TypeError(f"{k}: {e}") from None
        return tp(**out)
    if origin in (list, tuple):
        if not isinstance(data, list):
            raise TypeError(f"expected a list, got {type(data).__name__}")
        args = typing.get_args(tp)
        items = [from_json(args[0] if args else Any, v, strict) for v in data]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {type(data).__name__}")
        _, val = typing.get_args(tp) or (str, Any)
        return {k: from_json(val, v, strict) for k, v in data.items()}
    if tp is Path:
        if strict and not isinstance(data, str):
            raise TypeError(f"expected a path, got {type(data).__name__}")
        return Path(data)
    if tp is float and isinstance(data, int) and not (strict and isinstance(data, bool)):
        return float(data)
    if strict and tp in (str, int, float, bool) and (not isinstance(data, tp) or (tp is int and isinstance(data, bool))):
        raise TypeError(f"expected {tp.__name__}, got {type(data).__name__}")
    if strict and tp in (dict, list) and not isinstance(data, tp):
        raise TypeError(f"expected {'an object' if tp is dict else 'a list'}, got {type(data).__name__}")
    return data


def write_json_atomic(path: Path, data: Any) -> None:
    """``to_json(data)`` into `path` through a temporary file, so a reader never sees half a file."""
    import json
    import os

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_json(data), indent=2, default=str))
    os.replace(tmp, path)
