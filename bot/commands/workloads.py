"""`optbot workloads`: the workloads optbot can optimize (workloads/*.yaml), e.g. for a workflow's matrix."""
from __future__ import annotations

import json
from pathlib import Path

import click

from bot.commands.common import github_output_option, write_github_output, write_json


@click.command("workloads")
@github_output_option("`workloads=<JSON list of names>`, for a job matrix: "
                      "`matrix: {workload: ${{ fromJSON(needs.JOB.outputs.workloads) }}}`")
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
    write_github_output(github_output, {"workloads": json.dumps([r["name"] for r in rows])})
    write_json(json_path, {"workloads": rows}, quiet=True)
