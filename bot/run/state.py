"""Run state of `optbot optimize`: which steps are done, and each step's typed result.

The run directory (.optbot/runs/<run-id>/) holds:
  state.json         this file's RunState: options, step records (status, seconds, summary)
  <step>.json        each step's Result (bot/steps/<step>.py), read back as that dataclass
  jobs/, logs        runner jobs' JSON, results and logs
  report.md/.html    the rendered report (deliver)

A step is recorded as done only after its result file is written (atomically), so a run killed at
any instant resumes at the first step without a record, and a step's side effects (branches,
pull requests) are made idempotent by the step itself (bot/steps/deliver.py, bot/deliver/).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from bot.errors import OptbotError
from bot.jsonable import from_json, write_json_atomic
from bot.paths import runs_dir
from bot.run.context import RunOptions
from bot.steps import analyze, baseline, checkout, combine, deliver, generate, learn, profile, validate

STEPS = ("checkout", "baseline", "profile", "analyze", "generate", "validate", "combine", "learn", "deliver")


@dataclass
class Results:
    """The typed results of a run's steps; a step not done yet is None."""
    checkout: checkout.Result | None = None
    baseline: baseline.Result | None = None
    profile: profile.Result | None = None
    analyze: analyze.Result | None = None
    generate: generate.Result | None = None
    validate: validate.Result | None = None
    combine: combine.Result | None = None
    learn: learn.Result | None = None
    deliver: deliver.Result | None = None


_MODULES = {"checkout": checkout, "baseline": baseline, "profile": profile, "analyze": analyze, "generate": generate,
            "validate": validate, "combine": combine, "learn": learn, "deliver": deliver}


def result_type(step: str) -> type:
    return _MODULES[step].Result


@dataclass
class StepRecord:
    name: str
    status: str  # done | skipped | failed
    seconds: float = 0.0
    summary: str = ""
    result_file: str = ""
    finished_at: str = ""
    gpu_s: float = 0.0  # wall seconds of this step's runner jobs on CUDA devices (bot/jobs.LEDGER)


@dataclass
class RunState:
    run_id: str
    workload: str
    options: RunOptions
    created_at: str
    steps: dict[str, StepRecord] = field(default_factory=dict)
    finished: bool = False
    attempts: int = 1  # 1 + number of resumes
    paused: bool = False  # the last attempt stopped at a safe point (--pause-after); --resume goes on
    # time a step spent in attempts that paused before it finished: step -> {"seconds", "gpu_s"};
    # added to the step's record when it finishes, so a paused and resumed run counts all its GPU time
    partial: dict[str, dict[str, float]] = field(default_factory=dict)

    # ---------------------------------------------------------------- persistence
    @property
    def run_dir(self) -> Path:
        # a copy of a run directory outside runs_dir() (a fan-out shard's, bot/run/fanout.py) is
        # read in place: load(run_id, at=DIR)
        return self.__dict__.get("_at") or runs_dir() / self.run_id

    def save(self) -> None:
        write_json_atomic(self.run_dir / "state.json", self)

    @classmethod
    def load(cls, run_id: str, at: Path | None = None) -> "RunState":
        path = (at or runs_dir() / run_id) / "state.json"
        if not path.is_file():
            known = sorted(p.name for p in runs_dir().glob("*-optimize-*")) if runs_dir().is_dir() else []
            hint = f"; known optimize runs: {', '.join(known[-5:])}" if known else ""
            raise OptbotError(f"run {run_id}: no run state at {path}{hint} (--resume and `optbot shard` take the id of an optimize run)")
        try:
            state = from_json(cls, json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise OptbotError(f"{path}: not a run state written by this optbot ({e})") from None
        if at is not None:
            state.__dict__["_at"] = at
        return state

    # ---------------------------------------------------------------- steps
    def is_done(self, step: str) -> bool:
        rec = self.steps.get(step)
        return rec is not None and rec.status in ("done", "skipped")

    def next_step(self) -> str | None:
        return next((s for s in STEPS if not self.is_done(s)), None)

    def record(self, step: str, status: str, result, seconds: float, summary: str, gpu_s: float = 0.0) -> None:
        result_file = self.run_dir / f"{step}.json"
        write_json_atomic(result_file, result)  # the result first: a record always has its file
        before = self.partial.pop(step, {})
        seconds += before.get("seconds", 0.0)
        gpu_s += before.get("gpu_s", 0.0)
        self.steps[step] = StepRecord(step, status, round(seconds, 2), summary, str(result_file),
                                      time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), round(gpu_s, 2))
        self.save()

    def record_pause(self, step: str, seconds: float, gpu_s: float) -> None:
        """The attempt paused inside `step`: its time so far is kept for the step's final record."""
        p = self.partial.setdefault(step, {"seconds": 0.0, "gpu_s": 0.0})
        p["seconds"] = round(p["seconds"] + seconds, 2)
        p["gpu_s"] = round(p["gpu_s"] + gpu_s, 2)
        self.paused = True
        self.save()

    def record_failure(self, step: str, seconds: float, message: str) -> None:
        self.steps[step] = StepRecord(step, "failed", round(seconds, 2), message, "",
                                      time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.save()

    def gpu_seconds(self) -> float:
        """GPU time of the run: its runner jobs' wall seconds on CUDA devices, over all steps."""
        done = sum(r.gpu_s for r in self.steps.values())  # a finished step's record includes its paused time
        return round(done + sum(p.get("gpu_s", 0.0) for p in self.partial.values()), 2)

    def result(self, step: str):
        """The step's Result (its dataclass, read back from <step>.json), or None when not done."""
        rec = self.steps.get(step)
        if rec is None or not rec.result_file or not self.is_done(step):
            return None
        path = self.run_dir / f"{step}.json"  # where record() wrote it, wherever the directory is now
        if not path.is_file():
            raise OptbotError(f"{path}: the {step} step's result is missing (state.json records the step as "
                              f"{rec.status}); the run directory is incomplete")
        try:
            return from_json(result_type(step), json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise OptbotError(f"{path}: not a {step} result written by this optbot ({e})") from None

    def results(self) -> Results:
        return Results(**{s: self.result(s) for s in STEPS})
