"""`optbot validate`: is a candidate correct, engaged and faster? (bot/validate/validator.py does the work)."""
from __future__ import annotations

import click

from bot.commands.common import command_line, parse_modes, workload_options, write_json
from bot.target import resolve_target
from bot.validate import Options, validate

EXIT = {"accepted": 0, "rejected": 1, "held": 3}


def parse_seeds(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected comma-separated integers", param_hint="--seeds") from None
    if len(set(seeds)) < 2:
        raise click.BadParameter("give at least 2 different seeds (default: 3 fresh random ones)", param_hint="--seeds")
    return seeds


@click.command("validate")
@workload_options
@click.option("--candidate", "candidate", required=True, metavar="REF|PATCH",
              help="Engine commit or branch on top of the base, or a path to a patch file.")
@click.option("--base", default=None, metavar="REF", help="Base commit (default: --ref, else the workload's engine ref).")
@click.option("--seeds", default=None, metavar="S1,S2,...", help="Input seeds (default: 3 fresh random ones).")
@click.option("--no-speed", is_flag=True, help="Correctness and engagement only, no end-to-end timing (on CUDA the outputs are still "
                   "compared in every production mode of --modes).")
@click.option("--iters", default=None, type=int, help="Timed steps per process (default: 10 on GPU, 5 on CPU).")
@click.option("--timeout", default=None, type=float,
              help="Seconds before a candidate job is killed (default: 1800; a hang becomes a 'timeout' verdict).")
@click.option("--modes", default=None, metavar="M1,M2,...",
              help="Production modes to check and time: eager, graph, compile, compile+graph (compile[:RECIPE] "
                   "with RECIPE regional, whole or max-autotune). Default: all four on CUDA, eager on CPU.")
@click.option("--ablate", is_flag=True, help="Also ablate the stack: leave-one-out per commit (see `optbot ablate`).")
def command(workload, engine, ref, preset, device, json_path, quant, candidate, base, seeds, no_speed, iters, timeout, modes,
            ablate):
    """Validate a candidate against the base engine and print a verdict with its numbers.

    \b
    Checks, each in its own runner process with a timeout:
      correctness  3 fresh seeds x every shape of the preset (incl. its extra_shapes), outputs
                   poisoned before (NaN), inputs checked unmodified after, compared per output
                   with the workload's tolerance (rel L2 and atol+rtol per element) or bit-exact
      kernels      kernels the candidate names (trailers) vs their reference, M=1 and odd M
      engagement   the candidate's declared kernels run in the step, replaced ones are gone
      speed        per-step latency base vs candidate, process-interleaved, in every production
                   mode (eager, CUDA graph, torch.compile, compile + CUDA graph on GPU); A/A
                   noise; a speedup inside the noise is "no change"; slower in any mode rejects
      modes        a mode that runs for the base and fails for the candidate rejects it
                   ("crashed under compile+graph: ..."); each mode's outputs are compared with
                   the base's in that mode
    \b
    Verdict: accepted | rejected (correctness, slower, no-change, not-engaged, crashed, timeout)
    | held (implausible: over 10x or under the roofline floor). Exit code 0 accepted, 1 rejected,
    3 held, 2 usage/config error. On CPU, speed is reported (labelled cpu) but does not gate.

    \b
    Examples:
      optbot validate flux2 --candidate my-branch
      optbot validate flux2 --candidate fix.patch --json verdict.json
      optbot validate flux2 --preset full --device cuda --candidate optbot/flux2/abc --ablate
    """
    modes_ = parse_modes(modes)  # bad input fails before the engine is resolved
    t = resolve_target(workload, engine, ref, preset, device, quant)
    opts = Options(seeds=parse_seeds(seeds), speed=not no_speed, iters=iters, timeout_s=timeout, modes=modes_,
                   log=lambda m: click.echo(f"· {m}", err=True))
    v = validate(t, candidate, base, opts)
    click.echo(v.render())
    data = v.to_json()
    data["command"] = command_line()
    if ablate:
        from bot.validate.ablate import ablate as run_ablation, ablation_mode

        mode, why = ablation_mode(v)
        opts.log(f"ablation in {mode}: {why}")
        ab = run_ablation(t, candidate, base, iters=iters, log=opts.log, mode=mode)
        click.echo(ab.render())
        data["ablation"] = ab.to_json()
    write_json(json_path, data)
    raise SystemExit(EXIT[v.status])
