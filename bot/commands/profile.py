"""`optbot profile`: where does the time of one step go?"""
from __future__ import annotations

import shutil

import click

from bot.commands.common import command_line, workload_options, write_json
from bot.paths import new_run_dir
from bot.profile_report import markdown, plot_png, print_terminal
from bot.steps.profile import profile_base
from bot.target import base_worktree, resolve_target
from runner.job import parse_mode


def _check_mode(mode: str) -> str:
    try:
        parse_mode(mode)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--mode") from None
    return mode


@click.command("profile")
@workload_options
@click.option("--iters", default=None, type=int, help="Timed steps (default: 10 on GPU, 3 on CPU).")
@click.option("--mode", default="eager", show_default=True, callback=lambda ctx, p, v: _check_mode(v),
              help="The production mode to time and profile the step in: eager, graph, compile[:RECIPE][+graph] "
                   "with RECIPE regional (plain 'compile'), whole or max-autotune. Under compile the kernels are "
                   "inductor's, attributed to the compiled block as a whole.")
@click.option("--timeout", default=1800, show_default=True, help="Seconds before the runner job is killed.")
def command(workload, engine, ref, preset, device, json_path, quant, mode, iters, timeout):
    """Profile one denoising step of WORKLOAD under torch.profiler.

    \b
    Prints: latency (median/min/max over N steps), time per category (gemm, attention,
    normalization, elementwise, copy, quantization, other), the top kernels with the module
    that launched each (e.g. transformer_blocks.*.attn.to_q), launch count, device idle time,
    and roofline figures against ceilings measured in the same run.
    Writes profile.json, profile.md, profile.png and the chrome trace into a run directory.

    \b
    Examples:
      optbot profile flux2                      # tiny preset on CPU, full on a GPU
      optbot profile qwen-image --preset full --device cuda --json qwen.json
      optbot profile qwen-image --device cuda --mode compile    # what is left once inductor has fused
    """
    t = resolve_target(workload, engine, ref, preset, device, quant)
    wt = base_worktree(t)
    run_dir = new_run_dir("profile")
    shape = t.workload.preset(t.preset).shapes
    click.echo(f"profiling {t.workload.name} ({t.preset} preset, {t.device}, {t.dtype}, {shape.label()}, {mode}) "
               f"in a runner process; run directory {run_dir}", err=True)
    p = profile_base(t, wt, run_dir, iters or (10 if t.device.startswith("cuda") else 3), timeout, mode=mode)
    meta = dict(workload=t.workload.name, preset=t.preset, dtype=t.dtype, shape=shape.label(),
                engine=t.checkout.name, command=command_line(), mode=mode)
    p["meta"] = meta
    print_terminal(p, meta)
    (run_dir / "profile.md").write_text(markdown(p, meta))
    plot_png(p, meta, run_dir / "profile.png")
    write_json(run_dir / "profile.json", p)
    if json_path is not None:
        write_json(json_path, p)
        for ext in (".md", ".png"):
            shutil.copy(run_dir / f"profile{ext}", json_path.with_suffix(ext))
    click.echo(f"report: {run_dir / 'profile.md'} · plot: {run_dir / 'profile.png'}", err=True)
