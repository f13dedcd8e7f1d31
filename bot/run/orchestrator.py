"""Runs the nine steps of one optimization run, in order, recording each one's typed result.

A step's result is recorded (bot/run/state.py) before the next step starts, so a run that
dies resumes at the first unrecorded step (``optbot optimize --resume RUN_ID``). Steps with side
effects outside the run directory are idempotent: combine rebuilds the same branch with the same
commits; deliver finds pull requests and replies by head branch and marker before making any.
"""
from __future__ import annotations

import importlib
import time
from typing import Any, Callable, Mapping

try:  # rich draws the progress and the table; a bare GPU box without it gets plain lines
    from rich.console import Console
    from rich.table import Table
except ImportError:  # pragma: no cover - exercised only where rich is missing
    from bot.run.plain import Console, Table

from bot.deliver.forge import make_forge
from bot.errors import OptbotError
from bot.jobs import LEDGER
from bot.paths import new_run_dir
from bot.run.context import Budget, RunOptions, Paused, RunContext
from bot.run.faults import InjectedAbort, maybe_abort
from bot.run.state import STEPS, RunState, result_type

# step name -> its function; tests of orchestration and delivery replace some with doubles
StepFns = Mapping[str, Callable[[RunContext], Any]]


def default_steps() -> dict[str, Callable[[RunContext], Any]]:
    return {s: getattr(importlib.import_module(f"bot.steps.{s}"), "run") for s in STEPS}


def run_optimize(options: RunOptions | None = None, resume: str | None = None, steps: StepFns | None = None,
                 console: Console | None = None, pause_after_s: float | None = None,
                 validate: Callable | None = None, ablate: Callable | None = None,
                 stop_after: str | None = None) -> RunState:
    """One attempt of a run (a new one, or `resume` = RUN_ID continued). With `pause_after_s` the
    attempt stops at the first safe point after that many seconds (state.paused; --resume goes on):
    a runner with a job time limit splits a long run into attempts without losing work. With
    `stop_after` = a step, the attempt pauses the same way once that step is recorded (a fan-out
    plan stops after generate, bot/run/fanout.py).
    `steps`, `validate` and `ablate` replace the real ones (tests of the orchestration only)."""
    started = time.time()
    console = console or Console(stderr=True)
    fns = {**default_steps(), **(steps or {})}
    if resume:
        state = RunState.load(resume)
        if state.finished:
            console.print(f"run {resume} already finished; nothing to resume")
            print_summary(state, console)
            return state
        state.attempts += 1
        state.paused = False
        state.save()
        options = state.options
        console.print(f"resuming run {state.run_id} at step {state.next_step()} (attempt {state.attempts})")
    else:
        if options is None:
            raise OptbotError("optimize: give WORKLOAD or --resume RUN_ID")
        from bot.workload import load_workload
        load_workload(options.workload)  # a bad name or file fails here, before a run directory exists
        run_dir = new_run_dir("optimize")
        state = RunState(run_id=run_dir.name, workload=options.workload, options=options,
                         created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        state.save()
    console.print(f"run {state.run_id}: directory {state.run_dir}")
    ctx = RunContext(run_id=state.run_id, run_dir=state.run_dir, options=options,
                     budget=Budget(options.budget_wall_s, options.budget_cost_usd), results=state.results(),
                     log=lambda m: console.print(m),
                     pause_at=None if pause_after_s is None else started + pause_after_s)
    if validate is not None:
        ctx.validate = validate
    if ablate is not None:
        ctx.ablate = ablate
    ctx.forge = make_forge(options, state.run_id, state.run_dir, log=ctx.log)
    _react(ctx, "eyes", console)
    for i, step in enumerate(STEPS, 1):
        if state.is_done(step):
            if step == stop_after:  # recorded by an earlier attempt: this one stops before going further
                return _stopped(state, step, console)
            continue
        ctx.steps_done = list(state.steps.values())
        t0 = time.monotonic()
        gpu0 = LEDGER.snapshot().get("cuda", 0.0)
        try:
            ctx.check_pause(f"step {step}")
            with console.status(f"[{i}/{len(STEPS)}] {step} ...", spinner="dots"):
                result = fns[step](ctx)
            if not isinstance(result, result_type(step)):
                raise TypeError(f"step {step} returned {type(result).__name__}, not {result_type(step).__qualname__}")
        except InjectedAbort:
            raise
        except Paused as p:
            secs, gpu_s = time.monotonic() - t0, LEDGER.snapshot().get("cuda", 0.0) - gpu0
            state.record_pause(step, secs, gpu_s)
            console.print(f"[{i}/{len(STEPS)}] {step}: paused after {time.time() - started:.0f} s of this attempt "
                          f"(--pause-after), before {p.before}; what was reached is kept"
                          + (f" ({secs:.1f} s, {gpu_s:.1f} GPU-s in this step so far)" if secs >= 0.05 else "")
                          + ". Continue with: "
                          f"optbot optimize {state.workload} --resume {state.run_id}")
            return state
        except Exception as e:  # recorded, reacted to, then shown to the user
            state.record_failure(step, time.monotonic() - t0, f"{type(e).__name__}: {e}"[:500])
            _react(ctx, "confused", console)
            if isinstance(e, OptbotError):
                raise OptbotError(f"step {step} failed: {e} (resume with: optbot optimize {state.workload} --resume {state.run_id})") from e
            raise
        secs = time.monotonic() - t0
        summary = result.summary()
        status = "skipped" if getattr(result, "status", "done") == "skipped" else "done"
        gpu_s = LEDGER.snapshot().get("cuda", 0.0) - gpu0
        state.record(step, status, result, secs, summary, gpu_s)
        setattr(ctx.results, step, result)
        console.print(f"[{i}/{len(STEPS)}] {step}: {status} in {secs:.1f} s"
                      + (f" ({gpu_s:.1f} GPU-s)" if gpu_s else "") + f" — {summary}")
        maybe_abort(step)
        if step == stop_after:
            return _stopped(state, step, console)
    state.finished = True
    state.save()
    _react(ctx, "rocket", console)
    print_summary(state, console)
    return state


def _stopped(state: RunState, step: str, console: Console) -> RunState:
    """--stop-after: paused, as --pause-after pauses, right after `step`."""
    state.paused = True
    state.save()
    console.print(f"stopped after {step} (--stop-after); what was reached is kept. Continue with: "
                  f"optbot optimize {state.workload} --resume {state.run_id}")
    return state


def _react(ctx: RunContext, content: str, console: Console) -> None:
    try:
        ctx.forge.react(content)
    except OptbotError as e:  # a reaction is courtesy; it never fails a run
        console.print(f"could not react {content}: {e}")


def print_summary(state: RunState, console: Console) -> None:
    t = Table(title=f"optbot optimize {state.workload} — run {state.run_id}")
    for col in ("step", "status", "seconds", "GPU-s", "result"):
        t.add_column(col, overflow="fold")
    for s in STEPS:
        rec = state.steps.get(s)
        if rec is None:
            t.add_row(s, "not run", "", "", "")
        else:
            t.add_row(s, rec.status, f"{rec.seconds:.1f}", f"{rec.gpu_s:.1f}" if rec.gpu_s else "-", rec.summary)
    console.print(t)
    gpu = state.gpu_seconds()
    if gpu:
        console.print(f"GPU time: {gpu:.1f} s (wall seconds of the run's runner jobs on CUDA devices)")
    d = state.result("deliver")
    if d:
        console.print(f"optimization branch: {d.engine_branch} @ {d.engine_head[:12]} "
                      f"(engine repository {state.result('checkout').repo_path})")
        if d.knowledge_branch:
            console.print(f"knowledge branch: {d.knowledge_branch}")
        for what in ("engine_pr", "knowledge_pr", "trigger_reply", "dashboard"):
            pr = getattr(d, what)
            console.print(f"{what.replace('_', ' ')}: {pr.action} {pr.url or ''} {pr.note or ''}")
        console.print(f"report: {d.report_md} · {d.report_html}")
