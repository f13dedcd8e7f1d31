"""Options every workload command takes (DESIGN decision 2), and the knowledge options of the store
and lessons commands, defined once."""
from __future__ import annotations

import datetime as _dt

import functools
import json
import re
import shlex
import sys
from pathlib import Path

import click

from bot.errors import OptbotError
from runner.job import QUANT_RECIPES


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
    @click.option("--quant", type=click.Choice(QUANT_RECIPES), default=None,
                  help="Run the model with its linear layers quantized after the weights load (fp8: e4m3 "
                       "weights with per-channel scales, per-token dynamic activation scales; torchao's recipe "
                       "where it runs, optbot's emulation elsewhere; on --engine sglang, SGLang's own ModelOpt FP8 "
                       "path: docs/fp8.md). The precision becomes DTYPE+RECIPE, with its own tolerance in the "
                       "workload file.")
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        dev = kwargs.get("device")
        if dev is not None and not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise click.BadParameter(f"{dev!r}: expected cpu, cuda or cuda:N", param_hint="--device")
        return f(*args, **kwargs)

    return wrapper


KNOWLEDGE_PATH_HELP = ("Git repository (or folder) holding kernel_store/ and lessons/; also $OPTBOT_KNOWLEDGE_PATH. "
                       "Default: the current directory's repository when it holds kernel_store/, else "
                       "$OPTBOT_HOME/knowledge (docs/store.md).")


def knowledge_options(store: bool = False):
    """--knowledge-path and --lessons-dir (and --store): the command gets `knowledge`, the
    bot.knowledge.location.Knowledge they locate, whose line it prints on stderr."""
    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, knowledge_path=None, store_dir=None, lessons_dir=None, **kwargs):
            from bot.knowledge.location import locate

            k = locate(knowledge_path, store=store_dir, lessons=lessons_dir)
            click.echo(k.line(), err=True)
            return f(*args, knowledge=k, **kwargs)

        wrapper.__click_params__ = list(getattr(f, "__click_params__", []))  # not f's own list
        folder = click.Path(file_okay=False, path_type=Path)
        opts = [click.option("--knowledge-path", type=folder, default=None, help=KNOWLEDGE_PATH_HELP),
                click.option("--lessons-dir", "lessons_dir", type=folder, default=None, envvar="OPTBOT_LESSONS",
                             help="Lessons folder instead of the knowledge's lessons/ (beside --store when that is given).")]
        if store:
            opts.append(click.option("--store", "store_dir", type=folder, default=None, envvar="OPTBOT_STORE",
                                     help="Kernel store folder instead of the knowledge's kernel_store/."))
        for opt in reversed(opts):
            wrapper = opt(wrapper)
        return wrapper

    return deco


# The GitHub options every delivering command shares: one name, one environment variable each, so a
# workflow sets them once in env: for all the commands of a job.
_GITHUB = {  # option: (envvar, metavar, help when the command has nothing more specific to say)
    "repo": ("OPTBOT_ENGINE_REPO", "OWNER/NAME", "The engine's GitHub repository."),
    "knowledge-repo": ("OPTBOT_KNOWLEDGE_REPO", "OWNER/NAME",
                       "The bot's GitHub repository, for the knowledge PR (kernel_store + lessons)."),
    "engine-remote": ("OPTBOT_ENGINE_REMOTE", "URL|NAME",
                      "Git remote the optimization branch is pushed to (default: the engine's origin)."),
    "knowledge-remote": ("OPTBOT_KNOWLEDGE_REMOTE", "URL|NAME",
                         "Git remote the knowledge branch is pushed to (default: the knowledge repository's origin)."),
    "github-api-url": ("OPTBOT_GITHUB_API_URL", "URL", "GitHub API base URL; for GitHub Enterprise e.g. "
                                                       "https://ghe.example.com/api/v3."),
}


def github_option(name: str, help: str | None = None, **kw):
    """--repo, --knowledge-repo, --engine-remote, --knowledge-remote or --github-api-url, each with
    its $OPTBOT_... variable (named in the help)."""
    env, metavar, default_help = _GITHUB[name]
    # no explicit default=None: click (8.3+) takes an explicit None as a value, and required=True
    # would then never be enforced
    return click.option(f"--{name}", envvar=env, metavar=metavar, show_envvar=True, help=help or default_help, **kw)


def github_output_option(what: str):
    """--github-output FILE: the step outputs a workflow reads (in GitHub Actions: $GITHUB_OUTPUT)."""
    return click.option("--github-output", "github_output", type=click.Path(dir_okay=False, path_type=Path),
                        default=None, help=f"Append {what} to this file (in GitHub Actions: $GITHUB_OUTPUT).")


OUTPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def write_github_output(path: Path | None, outputs: dict[str, object]) -> None:
    """Append NAME=VALUE lines (Actions collects every step's outputs in one file). A value must be
    one line: a newline in it would start an output of its own, so it is refused, not written."""
    if path is None:
        return
    lines = []
    for name, value in outputs.items():
        value = str(value)
        if not OUTPUT_NAME.fullmatch(name) or "\n" in value or "\r" in value:
            raise OptbotError(f"--github-output: output {name!r} = {value[:60]!r} is not one NAME=VALUE line")
        lines.append(f"{name}={value}\n")
    with open(path, "a") as f:
        f.write("".join(lines))


def parse_modes(text: str | None, option: str = "--modes") -> tuple[str, ...] | None:
    """A comma list of production modes (runner/job.parse_mode's grammar), or None when not given;
    an unknown mode is a usage error naming the option."""
    from runner.job import parse_mode

    if not text:
        return None
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    for m in modes:
        try:
            parse_mode(m)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=option) from None
    return modes


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


def echo_err(msg: str) -> None:
    """A progress or diagnostic line on stderr (the `log=` callback the knowledge code takes)."""
    click.echo(msg, err=True)


def utc_now() -> str:
    """Now, UTC, to the second, ISO 8601: the date a command records beside what it wrote."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
