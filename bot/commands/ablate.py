"""`optbot ablate`: each commit's contribution to a stack, by leave-one-out."""
from __future__ import annotations

import click

from bot.validate.ablate import ablate
from bot.commands.common import command_line, workload_options, write_json
from bot.target import resolve_target
from runner.job import parse_mode


@click.command("ablate")
@workload_options
@click.option("--candidate", required=True, metavar="REF|PATCH", help="Top of the stack (commit/branch) or a patch file.")
@click.option("--base", default=None, metavar="REF", help="Bottom of the stack (default: --ref / the workload's).")
@click.option("--rounds", default=2, show_default=True, help="Timed processes per variant (interleaved rounds).")
@click.option("--iters", default=None, type=int, help="Timed steps per process (default: 10 on GPU, 5 on CPU).")
@click.option("--mode", default="eager", show_default=True, metavar="MODE",
              help="The production mode the rounds are timed in: eager, graph, compile[:RECIPE][+graph] "
                   "(optimize takes the mode its stack validation measured fastest).")
def command(workload, engine, ref, preset, device, json_path, quant, candidate, base, rounds, iters, mode):
    """Time the stack with each of its commits reverted, and print each commit's contribution.

    \b
    Variants (base, whole stack, stack minus commit i) run in their own runner processes, in
    interleaved rounds; the base's rounds give the A/A noise. It measures speed only: validate the
    stack (`optbot validate`) for correctness.

    \b
    Examples:
      optbot ablate flux2 --candidate optbot/flux2/d93305b4891d
      optbot ablate flux2 --preset full --device cuda --candidate my-stack --json ablation.json
      optbot ablate qwen-image --engine sglang --quant fp8 --preset full --device cuda \\
          --candidate optbot/qwen-image+fp8/ce490c7ad331 --mode graph
    """
    try:
        _, graph = parse_mode(mode)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--mode") from None
    t = resolve_target(workload, engine, ref, preset, device, quant)
    if graph and not t.device.startswith("cuda"):
        raise click.BadParameter(f"{mode} captures a CUDA graph: it needs --device cuda (this run is on {t.device})",
                                 param_hint="--mode")
    ab = ablate(t, candidate, base, iters=iters, rounds=rounds, mode=mode,
                log=lambda m: click.echo(f"· {m}", err=True))
    click.echo(ab.render())
    data = ab.to_json()
    data["command"] = command_line()
    write_json(json_path, data)
