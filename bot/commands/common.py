"""Options every workload command takes (DESIGN decision 2), defined once."""
from __future__ import annotations

import functools
import json
import shlex
import sys
from pathlib import Path

import click


def workload_options(f):
    @click.argument("workload")
    @click.option("--engine", metavar="NAME|PATH|URL", default=None,
                  help="Engine to use: a name the workload defines (default: its default_engine, e.g. "
                       "diffusers or sglang), a path to a git repository, a git URL, or NAME=PATH|URL "
                       "for a fork of engine NAME (e.g. sglang=~/src/sglang-fork).")
    @click.option("--ref", default=None, help="Engine git ref (branch, tag or sha). Default: the workload's, else HEAD.")
    @click.option("--preset", type=click.Choice(["tiny", "full"]), default=None,
                  help="Model size. Default: full on a CUDA machine, tiny on CPU.")
    @click.option("--device", default=None, metavar="cpu|cuda[:N]",
                  help="Where to run. Default: cuda if torch sees a GPU, else cpu.")
    @click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Also write the typed result as JSON to this path.")
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        dev = kwargs.get("device")
        if dev is not None and not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise click.BadParameter(f"{dev!r}: expected cpu, cuda or cuda:N", param_hint="--device")
        return f(*args, **kwargs)

    return wrapper


def command_line() -> str:
    return "optbot " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def write_json(path: Path | None, data: dict, quiet: bool = False) -> None:
    """Write atomically (a reader, or a kill mid-write, never sees half a file)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)
    if not quiet:
        click.echo(f"wrote {path}", err=True)
