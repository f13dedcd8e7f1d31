"""`optbot shard plan|validate|merge`: one run's validation fanned out over several machines
(bot/run/fanout.py; docs/optimize.md, Fan-out)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from bot.commands.common import github_output_option, write_github_output, write_json
from bot.trigger.grammar import MAX_SHARDS

DIR = click.Path(file_okay=False, path_type=Path)


@click.group("shard")
def command():
    """Fan one run's validation out over several machines, then merge it back.

    \b
    The run goes as on one host, except that its validate step is spread over N machines
    (in GitHub Actions: a matrix of GPU runners, .github/workflows/optimize.yml):
      optbot optimize flux2 --preset full --device cuda --stop-after generate   # exit 75, paused
      optbot shard plan RUN_ID --shards 3 --out plan/          # plan.json, run/, knowledge/
      optbot shard validate plan/ --shard 1/3 --out shard-1/   # on each machine, I = 1..3
      optbot shard merge plan/ shard-1/ shard-2/ shard-3/      # on the aggregate machine
      optbot optimize flux2 --resume RUN_ID                    # combine, learn, deliver
    A shard validates with THE validator, in the sandboxed runner, as the validate step does;
    merge refuses missing, duplicated, foreign-plan and commit-mismatched results. On one host
    `optimize --gpus N` is the local pool; shards are for more GPUs than one host has.
    """


@command.command("plan")
@click.argument("run_id")
@click.option("--shards", type=click.IntRange(1, MAX_SHARDS), required=True,
              help=f"At most this many shards (1 to {MAX_SHARDS}); never more than candidates to validate.")
@click.option("--out", type=DIR, required=True, help="A new directory for the plan (an artifact for every shard).")
@github_output_option("run_id=, shards=N and matrix=[1,...,N] (JSON)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the plan as JSON here.")
def plan_cmd(run_id, shards, out, github_output, json_path):
    """Plan RUN_ID's validation over --shards machines.

    \b
    RUN_ID is a run that stopped after generate (`optbot optimize WL ... --stop-after generate`).
    The candidates to measure go round-robin, in the run's order, to shards 1..N; a candidate whose
    store verdict applies unchanged, or that was validated before, goes to none. --out gets
    plan.json, run/ (the run directory with its seeds and candidates.bundle: a shard machine with
    the engine at the base sha fetches the commits from it) and knowledge/kernel_store.

    \b
    Example:
      optbot shard plan 20261201-101500-optimize-1a2b3c --shards 3 --out plan/
    """
    from bot.jsonable import to_json
    from bot.run.fanout import plan

    p = plan(run_id, shards, out)
    for s in range(1, p.shards + 1):
        ids = [c.id for c in p.of(s)]
        click.echo(f"shard {s}/{p.shards}: {', '.join(ids) or 'nothing to validate'}")
    for cid, why in p.not_sharded.items():
        click.echo(f"not sharded: {cid}: {why}")
    click.echo(f"plan {p.plan_id} of run {p.run_id}: {len(p.candidates)} candidate(s) over {p.shards} shard(s) in {out}")
    write_github_output(github_output, {"run_id": p.run_id, "shards": p.shards,
                                        "matrix": json.dumps(list(range(1, p.shards + 1)))})
    write_json(json_path, to_json(p), quiet=True)


@command.command("validate")
@click.argument("plan_dir", metavar="PLAN", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--shard", "shard", metavar="I/N", required=True, help="Which shard of the plan this machine runs.")
@click.option("--out", type=DIR, required=True, help="A new directory for the results (shard.json, verdicts/).")
def validate_cmd(plan_dir, shard, out):
    """Validate shard I of N of the PLAN directory (`optbot shard plan`).

    \b
    Needs the engine at the plan's base sha (materialized as for any run; the candidate commits
    come from PLAN/run/candidates.bundle) and runs each candidate of the shard through the
    validator, on this machine's `--gpus` pool as the run says. --out gets shard.json (plan,
    shard, candidates, device, host, seconds) and verdicts/<candidate>.json, each exactly the
    checkpoint the validate step keeps. A retried shard keeps the verdicts it reached.

    \b
    Example:
      optbot shard validate plan/ --shard 2/3 --out shard-2/
    """
    from bot.run.fanout import parse_shard, validate_shard

    i, n = parse_shard(shard)
    r = validate_shard(plan_dir, i, n, out, log=lambda m: click.echo(m, err=True))
    click.echo(f"shard {r.shard}/{r.shards} of plan {r.plan_id[:12]}: {len(r.candidates)} verdict(s) in {out}"
               + (f" on {r.hardware} ({r.device})" if r.device else "")
               + (f"; no verdict for {', '.join(r.not_validated)}" if r.not_validated else ""))


@command.command("merge")
@click.argument("plan_dir", metavar="PLAN", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("shard_dirs", metavar="SHARD_DIR...", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
def merge_cmd(plan_dir, shard_dirs):
    """Merge the shards' results into the PLAN's run, then continue it with --resume.

    \b
    Every planned candidate must have exactly one verdict, from the shard it was given to, of this
    plan, for the planned commit and the run's base; anything else is refused, naming the file,
    and nothing is merged. The shards' directories are untrusted input (they come back as
    artifacts from machines that ran generated code): sizes are bounded, links refused, every
    field parsed as its type. When this machine has no copy of the run, it is taken from PLAN.

    \b
    Example:
      optbot shard merge plan/ shard-1/ shard-2/ shard-3/ && optbot optimize flux2 --resume RUN_ID
    """
    from bot.run.fanout import merge

    m = merge(plan_dir, list(shard_dirs))
    for r in m.shards:
        click.echo(f"shard {r.shard}/{r.shards}: {', '.join(r.candidates) or 'nothing'} on {r.hardware or '-'} "
                   f"({r.host or '?'}, {r.seconds:.0f} s, {r.gpu_s:.0f} GPU-s)")
    click.echo(m.line())
    click.echo(f"continue with: optbot optimize {m.workload} --resume {m.run_id}")
