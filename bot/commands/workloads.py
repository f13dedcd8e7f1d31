"""`optbot workloads`: the workloads optbot can optimize (workloads/*.yaml), e.g. for a workflow's matrix."""
from __future__ import annotations

import json
from pathlib import Path

import click

from bot.commands.common import write_json


@click.command("workloads")
@click.option("--github-output", "github_output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append `workloads=<JSON list of names>` to this file (in GitHub Actions: $GITHUB_OUTPUT), "
                   "for a job matrix: `matrix: {workload: ${{ fromJSON(needs.JOB.outputs.workloads) }}}`.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the list (name, file, engines, default engine) as JSON to this path.")
def command(github_output, json_path):
    """List the workloads: every workloads/*.yaml of the current directory and of optbot, each
    parsed (a broken file is an error naming the file and key), with its engines.

    \b
    Examples:
      optbot workloads                                 name, default engine, engines, file
      optbot workloads --github-output "$GITHUB_OUTPUT"   the weekly workflow's matrix
    """
    from bot.workload import available_workloads, load_workload

    rows = []
    for name in available_workloads():
        wl = load_workload(name)
        rows.append({"name": wl.name, "file": wl.file, "default_engine": wl.default_engine,
                     "engines": sorted(wl.engines)})
        click.echo(f"{wl.name:16} {wl.default_engine:10} {','.join(sorted(wl.engines)):20} {wl.file}")
    if github_output is not None:
        with open(github_output, "a") as f:  # appended: Actions collects every step's outputs in one file
            f.write(f"workloads={json.dumps([r['name'] for r in rows])}\n")
    write_json(json_path, {"workloads": rows}, quiet=True)
