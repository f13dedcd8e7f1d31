"""`optbot engine`: the engine repositories the bot profiles and patches."""
from __future__ import annotations

import click

from bot.engine import checkout_engine
from bot.errors import OptbotError
from bot.workload import available_workloads, load_workload


def known_engines() -> dict[str, tuple[str, str, list[str]]]:
    """Engine name -> (source, import_root, workloads that define it), over every workload file."""
    out: dict[str, tuple[str, str, list[str]]] = {}
    for name in available_workloads():
        wl = load_workload(name)
        for ename, spec in wl.engines.items():
            if ename in out:
                src, root, wls = out[ename]
                if (src, root) != (spec.source, spec.import_root):
                    raise OptbotError(
                        f"{wl.file}: key 'engines.{ename}': source {spec.source!r} (import_root "
                        f"{spec.import_root!r}) differs from {src!r} ({root!r}) in workload {wls[0]!r}; "
                        f"one engine name must mean one repository")
                wls.append(wl.name)
            else:
                out[ename] = (spec.source, spec.import_root, [wl.name])
    return out


@click.group("engine")
def command():
    """Engine repositories: materialize or inspect the git repository a workload runs on.

    \b
    The pinned upstream engines are built once, deterministically (fixed author, date and message,
    so the base sha is the same on every machine), under $OPTBOT_HOME/engines/:
      diffusers  from the diffusers 0.42.1 source distribution (src/ layout)
      sglang     from the sglang 0.5.23 wheel's Python files (python/sglang/, as in a fork)
    On a machine without a package registry, put the release file into $OPTBOT_HOME/downloads/.
    """


@command.command("init")
@click.argument("engine")
@click.option("--ref", default=None, help="Git ref to resolve (default: the workload's, else HEAD).")
@click.option("--import-root", default=None,
              help="Folder of the repository that goes first on the import path (default: the "
                   "workload's for a named engine, else '.'; an sglang fork uses 'python').")
def init(engine, ref, import_root):
    """Materialize ENGINE (a name from the workloads, NAME=PATH|URL, a git URL or a path); print where.

    \b
    Examples:
      optbot engine init sglang                         # sglang 0.5.23 from its wheel
      optbot engine init diffusers
      optbot engine init sglang=~/src/sglang-fork --ref my-branch   # a fork of sglang
      optbot engine init https://github.com/me/diffusers.git --ref main --import-root src
    """
    engines = known_engines()
    name, sep, fork = engine.partition("=")
    if sep and name in engines and fork:  # NAME=PATH|URL: a fork of a known engine
        co = checkout_engine(fork, ref, import_root or engines[name][1], name)
    elif engine in engines:
        source, root, wls = engines[engine]
        spec_ref = None
        for wname in wls:
            spec_ref = spec_ref or load_workload(wname).engines[engine].ref
        co = checkout_engine(source, ref or spec_ref, import_root or root, engine)
    else:
        if ":" in engine and not ("://" in engine or engine.startswith("git@")) and "==" in engine:
            source = engine  # pypi-sdist:PKG==VER / pypi-wheel:PKG==VER
        elif "/" not in engine and "\\" not in engine and not engine.startswith("."):
            raise OptbotError(f"unknown engine {engine!r}; the workloads define {sorted(engines)} "
                              f"(or pass a git URL, a path, pypi-sdist:PKG==VER or pypi-wheel:PKG==VER)")
        else:
            source = engine
        co = checkout_engine(source, ref, import_root or ".", engine)
    click.echo(f"engine {co.name}")
    click.echo(f"  repository  {co.repo_path}")
    click.echo(f"  ref         {co.ref}")
    click.echo(f"  sha         {co.base_sha}")
    click.echo(f"  import root {co.repo_path / co.import_root}")


@command.command("list")
def list_():
    """The engines the workload files define, with their sources."""
    for name, (source, root, wls) in sorted(known_engines().items()):
        click.echo(f"{name:<12} {source:<36} import root {root:<8} workloads: {', '.join(wls)}")
