"""`optbot analyze`: find and rank model-level optimization opportunities."""
from __future__ import annotations

import json
from pathlib import Path

import click

from bot.analyze.opportunity import KINDS
from bot.analyze.render import markdown, print_terminal
from bot.commands.common import command_line, workload_options, write_json
from bot.errors import OptbotError
from bot.paths import new_run_dir
from bot.steps.analyze import analyze_base
from bot.steps.profile import profile_base
from bot.target import base_worktree, resolve_target


@click.command("analyze")
@workload_options
@click.option("--profile", "profile_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Use this profile JSON (from `optbot profile --json`) instead of profiling again.")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="Only run these detectors (repeatable). Default: all.")
@click.option("--top", default=25, show_default=True, help="Rows in the terminal table (the JSON keeps all).")
@click.option("--iters", default=None, type=int, help="Timed steps of the profile (default: 10 on GPU, 3 on CPU).")
@click.option("--timeout", default=1800, show_default=True, help="Seconds before each runner job is killed.")
@click.option("--fingerprints/--no-fingerprints", default=None,
              help="Record every op's output fingerprint in the graph, so each CFG-invariant finding is checked "
                   "against both passes' values (default: on CPU; on CUDA it costs a host sync per op).")
def command(workload, engine, ref, preset, device, json_path, quant, profile_path, kinds, top, iters, timeout, fingerprints):
    """Find and rank model-level optimization opportunities in one step of WORKLOAD.

    \b
    Two runner jobs: `profile` (where the time goes, unless --profile is given) and `graph`
    (every aten op of the step under a dispatch mode: data flow, module path, engine line, and
    which inputs each value depends on). Detectors then look for structure, never for names:
      merge-siblings          GEMMs reading the same input (Q/K/V) -> one GEMM
      fuse-norm-consumer      a norm feeding scale/shift/gate/residual -> one kernel
      absorb-bias             bias adds and gate/residual updates -> GEMM epilogue or add+norm
      fuse-gemm-epilogue      a GEMM whose only consumer is an activation (GELU, ...) -> its epilogue
      cfg-invariant-cache     prompt-independent work redone in the second CFG pass -> cache
      hoist-constant          work on weights/constants (or per-request inputs) every step -> hoist
      fuse-elementwise-chain  >= 3 memory-bound ops in a row, gated activations -> one kernel
      attention-waste         all-ones masks, QK-norm/RoPE passes, layout copies around attention
      launch-bound            device idle between many small kernels -> CUDA graphs / fusion
      quantization            FP8 per-token activation quantization (--quant fp8): fused into its
                              input's producer (norm, activation), or done once for sibling GEMMs
    Each opportunity's gain is estimated from the profile (time of the work removed, or bytes no
    longer moved at the copy bandwidth measured with it), in ms and % of the step, and says which
    device measured it. Writes analysis.json and analysis.md into a run directory.

    \b
    Examples:
      optbot analyze flux2                          # tiny preset on CPU, full on a GPU
      optbot analyze qwen-image --json qwen-analysis.json
      optbot analyze flux2 --profile flux2-profile.json --kind merge-siblings
    """
    profile = _read_profile(profile_path) if profile_path is not None else None
    t = resolve_target(workload, engine, ref, preset, device, quant)
    wt = base_worktree(t)
    run_dir = new_run_dir("analyze")
    shape = t.workload.preset(t.preset).shapes
    if profile is not None:
        source = str(profile_path)
    else:
        click.echo(f"profiling {t.workload.name} ({t.preset} preset, {t.device}, {t.dtype}) in a runner process; "
                   f"run directory {run_dir}", err=True)
        profile = profile_base(t, wt, run_dir, iters or (10 if t.device.startswith("cuda") else 3), timeout)
        write_json(run_dir / "profile.json", profile)
        source = str(run_dir / "profile.json")
    click.echo(f"capturing the op graph of one step ({t.device})", err=True)
    prof_shape, graph_shape = profile.get("shape"), shape.to_json()
    if prof_shape and prof_shape != graph_shape:
        click.echo(f"note: the profile was measured at {prof_shape}, the graph captured at {graph_shape}: "
                   "time is split over ops by the graph's shapes", err=True)
    meta = dict(workload=t.workload.name, preset=t.preset, dtype=t.dtype, shape=shape.label(), engine=t.checkout.name,
                engine_sha=t.checkout.base_sha, command=command_line())
    result = analyze_base(t, wt, run_dir, profile, source, meta, list(kinds) or None, timeout, fingerprints)
    print_terminal(result, top)
    (run_dir / "analysis.md").write_text(markdown(result))
    write_json(run_dir / "analysis.json", result)
    if json_path is not None:
        write_json(json_path, result)
        json_path.with_suffix(".md").write_text(markdown(result))
    click.echo(f"report: {run_dir / 'analysis.md'}", err=True)


def _read_profile(path: Path) -> dict:
    try:
        profile = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OptbotError(f"{path}: not a profile JSON ({e}); expected the file `optbot profile --json` writes") from None
    if not isinstance(profile, dict):
        raise OptbotError(f"{path}: not a profile JSON: expected an object, got {type(profile).__name__}")
    for key in ("kernels", "total_ms", "device"):
        if key not in profile:
            raise OptbotError(f"{path}: key {key!r} missing: expected the JSON of `optbot profile --json`")
    return profile
