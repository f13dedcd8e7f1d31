"""`optbot optimize`: the product's main job, end to end, resumable, delivered as pull requests."""
from __future__ import annotations

import re
from pathlib import Path

import click

from bot.commands.common import KNOWLEDGE_PATH_HELP, command_line, github_option, workload_options, write_json
from bot.errors import OptbotError
from bot.run.context import DEFAULT_GENERATORS

BUDGET_TIME = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")
BUDGET_COST = re.compile(r"^\$(\d+(?:\.\d+)?)$|^(\d+(?:\.\d+)?)\s*usd$", re.I)


def parse_duration(text: str) -> float | None:
    """"1h30m", "8m", "540s" -> seconds; None when it is no duration."""
    t = BUDGET_TIME.match(text.strip())
    if not t or not any(t.groups()):
        return None
    h, m, s = (float(x) if x else 0.0 for x in t.groups())
    return h * 3600 + m * 60 + s


def parse_budget(values: tuple[str, ...]) -> tuple[float | None, float | None]:
    """("30m", "$5") or ("30m,5usd",) -> (wall seconds, USD)."""
    wall = cost = None
    for v in [p.strip() for val in values for p in val.split(",") if p.strip()]:
        c = BUDGET_COST.match(v)
        d = parse_duration(v)
        if c:
            cost = float(c.group(1) or c.group(2))
        elif d is not None:
            wall = d
        else:
            raise click.BadParameter(f"{v!r}: expected a wall time like 30m, 1h30m, 90s or a cost like $5 or 5usd",
                                     param_hint="--budget")
    return wall, cost


@click.command("optimize")
@workload_options
@click.option("--resume", "resume", metavar="RUN_ID", default=None,
              help="Continue the run RUN_ID (a folder of .optbot/runs/) at the step where it stopped, with the "
                   "options it started with; only --pause-after, --stop-after and --json go with it.")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Validate candidates in parallel over this many GPUs (cuda:0..N-1).")
@click.option("--budget", multiple=True, metavar="30m|$5",
              help="Wall-time budget (30m, 1h30m, 90s) and/or agent cost budget in USD ($5, 5usd); "
                   "repeat or separate with commas.")
@click.option("--pause-after", "pause_after", metavar="DURATION", default=None,
              help="Stop this attempt at the first safe point after DURATION (8m, 540s): before a step, a "
                   "candidate's validation, the stack's validation or its ablation; work in flight finishes. "
                   "What was reached is kept; continue with --resume RUN_ID (also allowed with --resume). "
                   "Exit status 75 when it paused. For runners with a job time limit.")
@click.option("--stop-after", "stop_after", metavar="STEP", default=None,
              type=click.Choice(["checkout", "baseline", "profile", "analyze", "generate", "validate", "combine",
                                 "learn"]),
              help="Stop (paused, exit 75) once STEP is recorded; --resume RUN_ID goes on. A fan-out plan stops "
                   "after generate (`optbot shard --help`).")
@click.option("--dry-run", is_flag=True, help="No pushes, no pull requests: local branches and a report only.")
@click.option("--iters", type=int, default=None, help="Timed steps of the baseline (default: 20 on GPU, 5 on CPU).")
@click.option("--generators", default=",".join(DEFAULT_GENERATORS), show_default=True,
              metavar="LIST", help="Which generators run (comma-separated: replay, template, variants, compile-region, agent).")
@click.option("--ablation-rounds", default=2, show_default=True, type=click.IntRange(0, 10),
              help="Leave-one-out rounds over the stack on a GPU (0: no ablation).")
@click.option("--revalidate", is_flag=True,
              help="Validate every candidate on the GPU, even where the store holds a verdict recorded for the "
                   "same patch, base, workload, preset, dtype, hardware, torch and triton (default: reuse it; "
                   "skip known-rejected entries), and profile and analyze the base afresh even where an earlier "
                   "run did so on the same machine and software. The delivered stack is always validated fresh.")
@github_option("repo", "The engine\'s GitHub repository (where the engine PR opens and the trigger PR lives).")
@github_option("knowledge-repo")
@click.option("--knowledge-path", type=click.Path(file_okay=False), default=None, help=KNOWLEDGE_PATH_HELP)
@github_option("engine-remote")
@github_option("knowledge-remote")
@github_option("github-api-url")
@click.option("--trigger-pr", type=int, default=None, help="PR number whose comment triggered this run (reply goes there).")
@click.option("--trigger-comment", type=int, default=None, help="Id of the triggering comment (reactions go there).")
@click.option("--request", "request_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A request `optbot comment` wrote for an accepted /optimize comment: it decides the ref (the pull "
                   "request's head SHA at comment time), preset, GPUs, budget, --repo and the trigger; --engine "
                   "then names the PATH where that engine's repository is checked out.")
def command(workload, engine, ref, preset, device, json_path, quant, resume, gpus, budget, pause_after, stop_after, dry_run,
            iters,
            generators,
            ablation_rounds, revalidate, repo,
            knowledge_repo, knowledge_path, engine_remote, knowledge_remote, github_api_url, trigger_pr,
            trigger_comment, request_path):
    """Optimize WORKLOAD end to end and deliver the result as pull requests.

    \b
    Nine steps, each recorded in .optbot/runs/<run-id>/ (state.json + <step>.json):
      1 checkout   engine repo at --ref -> base worktree
      2 baseline   per-step latency, output digests, environment (runner `step` job)
      3 profile    kernel table, categories, roofline (runner `profile` job)
      4 analyze    ranked opportunities
      5 generate   candidates: one commit each, in its own worktree
      6 validate   accepted | rejected + reason | held, per candidate
      7 combine    accepted commits on branch optbot/<workload>/<base-sha12>; stack re-validated, ablated
      8 learn      kernel_store entries and lessons
      9 deliver    engine PR + knowledge PR + reply on the triggering PR; with no GitHub token (or
                   --dry-run): local branches and a report (markdown + HTML) in the run directory
    A killed run continues with --resume RUN_ID and ends with the same branches and pull requests,
    never duplicates.

    \b
    GitHub: token from OPTBOT_GITHUB_TOKEN or GITHUB_TOKEN; GitHub Enterprise via --github-api-url.

    \b
    Examples:
      optbot optimize flux2                               # CPU: tiny preset, local forge
      optbot optimize flux2 --preset full --device cuda --gpus 4 --budget 30m,$5
      optbot optimize qwen-image --dry-run --json run.json
      optbot optimize flux2 --resume 20261129-191200-optimize-1a2b3c
      optbot optimize flux2 --preset full --device cuda --pause-after 8m   # exit 75: paused,
      optbot optimize flux2 --resume RUN_ID --pause-after 8m                # ... then go on
      GITHUB_TOKEN=... optbot optimize flux2 --repo team/sglang --knowledge-repo team/optbot \\
          --trigger-pr 42 --trigger-comment 1234567
      optbot optimize flux2 --request request.json --engine ./engine   # a run `optbot comment` accepted
      optbot optimize flux2 --stop-after generate          # exit 75; then `optbot shard plan RUN_ID ...`
    """
    from bot.knowledge.location import Knowledge, locate
    from bot.run.orchestrator import run_optimize
    from bot.run.context import GENERATORS, RunOptions
    from bot.run.state import RunState
    from bot.workload import load_workload

    wall, cost = parse_budget(budget)
    if request_path is not None:
        req = _request(request_path, workload, engine, resume)
        cmd = req.command
        name = cmd.engine or load_workload(workload).default_engine
        engine = f"{name}={engine}" if engine else name
        ref, preset, gpus, wall, repo, quant = req.head_sha, cmd.preset, cmd.gpus, cmd.budget_s, req.repo, cmd.quant
        trigger_pr, trigger_comment = req.pull_request, req.comment_id
    pause_s = None if pause_after is None else parse_duration(pause_after)
    if pause_after is not None and pause_s is None:
        raise click.BadParameter(f"{pause_after!r}: expected a duration like 8m, 540s or 1h30m", param_hint="--pause-after")
    gens = tuple(g.strip() for g in generators.split(",") if g.strip())
    bad = [g for g in gens if g not in GENERATORS]
    if bad or not gens:
        raise click.BadParameter(f"{generators!r}: expected a comma-separated subset of {','.join(GENERATORS)}",
                                 param_hint="--generators")
    if resume:
        _resume_alone(resume)
        saved = RunState.load(resume)
        if saved.workload != workload:
            raise OptbotError(f"--resume {resume}: that run optimizes {saved.workload!r}, not {workload!r}")
        recorded = saved.options.knowledge_path
        (Knowledge.at(recorded, f"recorded by run {resume}") if recorded else locate()).say()
        state = run_optimize(resume=resume, pause_after_s=pause_s, stop_after=stop_after)
    else:
        # decided once, and recorded as the run's knowledge path: a resumed run reads and writes the
        # same knowledge wherever it is resumed from
        knowledge_path = str(locate(knowledge_path).say().root)
        opts = RunOptions(workload=workload, engine=engine, ref=ref, preset=preset, device=device, quant=quant, gpus=gpus,
                       budget_wall_s=wall, budget_cost_usd=cost, dry_run=dry_run, repo=repo,
                       trigger_pr=trigger_pr, trigger_comment=trigger_comment, knowledge_repo=knowledge_repo,
                       knowledge_path=knowledge_path, engine_remote=engine_remote, knowledge_remote=knowledge_remote,
                       github_api_url=github_api_url, iters=iters, command=command_line(),
                       generators=gens, revalidate=revalidate, ablation_rounds=ablation_rounds)
        state = run_optimize(opts, pause_after_s=pause_s, stop_after=stop_after)
    if json_path is not None:
        from bot.jsonable import to_json
        from bot.run.state import STEPS
        write_json(json_path, {"run_id": state.run_id, "run_dir": str(state.run_dir), "finished": state.finished,
                               "paused": state.paused, "gpu_s": state.gpu_seconds(),
                               **{s: to_json(state.result(s)) for s in STEPS}})
    if state.paused:
        raise SystemExit(75)  # EX_TEMPFAIL: not done, not failed; --resume continues


# what a request decides; given beside it, one of these would measure something other than the comment asked
REQUEST_DECIDES = ("ref", "preset", "gpus", "budget", "repo", "trigger_pr", "trigger_comment", "quant")


# what a resumed run keeps from its start (RunOptions in state.json); --pause-after, --stop-after and
# --json are per attempt
RESUME_KEEPS = ("engine", "ref", "preset", "device", "quant", "gpus", "budget", "dry_run", "iters", "generators", "revalidate",
                "ablation_rounds", "repo", "knowledge_repo", "knowledge_path", "engine_remote", "knowledge_remote",
                "github_api_url", "trigger_pr", "trigger_comment")


def _given(names: tuple[str, ...]) -> list[str]:
    """Those of `names` (click parameter names) given on the command line, as --flags."""
    ctx = click.get_current_context()
    return ["--" + n.replace("_", "-") for n in names
            if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]


def _resume_alone(resume: str) -> None:
    """A resumed run goes on with the options it started with, so one given again would be ignored
    silently (an --ablation-rounds 0 that still ablates): refuse it, naming it."""
    given = _given(RESUME_KEEPS)
    if given:
        names = ", ".join(given)
        raise OptbotError(f"--resume {resume}: the run goes on with the options it started with (its state.json); "
                          f"{names} would be ignored: give --resume with --pause-after, --stop-after or --json only")


def _request(path: Path, workload: str, engine: str | None, resume: str | None):
    from bot.trigger.request import load_request

    req = load_request(path)
    given = _given(REQUEST_DECIDES)
    if resume or given:
        what = "--resume" if resume else ", ".join(given)
        raise OptbotError(f"--request {path}: the request decides what {what} would; give it alone")
    if req.command.workload != workload:
        raise OptbotError(f"--request {path}: the request is for workload {req.command.workload!r}, not {workload!r}")
    if engine is not None and ("=" in engine or not Path(engine).is_dir()):
        raise OptbotError(f"--engine {engine!r}: with --request, --engine is the folder where the request's engine "
                          f"is checked out")
    return req
