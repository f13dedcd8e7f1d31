"""The `optbot` command line.

Each command lives in its own module under bot/commands/ and registers on the group below. Errors
meant for users (OptbotError) print one clear line and exit 2, without a traceback; --verbose adds
the traceback for maintainers.
"""
from __future__ import annotations

import sys
import traceback

import click

from bot import __version__, sandbox
from bot.errors import OptbotError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="optbot")
@click.option("-v", "--verbose", is_flag=True, envvar="OPTBOT_VERBOSE", help="Log details (and tracebacks) to stderr.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """optbot: profile, optimize and validate diffusion-transformer inference, Git-natively.

    \b
    Typical use:
      optbot optimize flux2                the whole job: profile, find, generate, validate, deliver
      optbot optimize qwen-image --preset full --device cuda --pause-after 8m
      optbot profile flux2                 where does the time of one step go?
      optbot bench flux2 --preset full --device cuda --modes eager,graph,compile,compile+graph
      optbot validate flux2 --candidate my.patch    is this change correct, and is it faster?
      optbot store list                    what the kernel store holds
    WORKLOAD is a name from workloads/ (`optbot workloads` lists them) or a path to a workload .yaml
    file. Data (engine repositories, worktrees, optbot's own knowledge repository) lives in
    $OPTBOT_HOME (default ~/.cache/optbot); run directories in ./.optbot/runs/.
    """
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose


def _register() -> None:
    """Every module of bot/commands/ that defines ``command`` (a click command or group) is added."""
    import importlib
    import pkgutil

    import bot.commands

    for info in sorted(pkgutil.iter_modules(bot.commands.__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"bot.commands.{info.name}")
        if isinstance(getattr(mod, "command", None), click.Command):
            cli.add_command(mod.command)


_register()


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    finally:  # also on sys.exit: the candidates' checkouts go, their commits stay (bot/engine.py)
        engine = sys.modules.get("bot.engine")  # not imported: no worktree was made
        try:
            if engine is not None:
                engine.release_worktrees()
        except Exception as e:  # noqa: BLE001 - never let the cleanup change the command's outcome
            click.echo(f"warning: could not remove this command's worktrees: {e}", err=True)


def _main(argv: list[str] | None) -> None:
    verbose = "-v" in (argv or sys.argv[1:]) or "--verbose" in (argv or sys.argv[1:])
    sandbox.make_undumpable()
    try:
        cli.main(args=argv, prog_name="optbot", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except OptbotError as e:
        if verbose:
            traceback.print_exc()
        click.secho(f"error: {e}", fg="red", err=True)
        sys.exit(e.exit_code)
    sys.exit(0)
