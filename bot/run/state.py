"""Run state of `optbot optimize`: which steps are done, and where each step's typed result lies.

The run directory (.optbot/runs/<run-id>/) holds:
  state.json         this file's RunState: options, step records (status, seconds, summary)
  <step>.json        each step's typed result (a dataclass of bot/optimize/stages.py, as JSON)
  jobs/, logs        runner jobs' JSON, results and logs
  report.md/.html    the rendered report (deliver)

A step is recorded as done only after its result file is written (atomically), so a run killed at
any instant resumes at the first step without a record, and a step's side effects (branches,
pull requests) are made idempotent by the step itself (bot/deliver/).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from bot.errors import OptbotError
from bot.paths import runs_dir

STEPS = ("checkout", "baseline", "profile", "analyze", "generate", "validate", "combine", "learn", "deliver")


def to_jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: to_jsonable(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json_atomic(path: Path, data: Any) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_jsonable(data), indent=2, default=str))
    os.replace(tmp, path)


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
    options: dict[str, Any]
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
        return runs_dir() / self.run_id

    def save(self) -> None:
        write_json_atomic(self.run_dir / "state.json", self)

    @classmethod
    def load(cls, run_id: str) -> "RunState":
        path = runs_dir() / run_id / "state.json"
        if not path.is_file():
            known = sorted(p.name for p in runs_dir().glob("*-optimize-*")) if runs_dir().is_dir() else []
            hint = f"; known optimize runs: {', '.join(known[-5:])}" if known else ""
            raise OptbotError(f"--resume {run_id}: no run state at {path}{hint}")
        try:
            data = json.loads(path.read_text())
            steps = {k: StepRecord(**v) for k, v in data.pop("steps", {}).items()}
            return cls(steps=steps, **data)
        except (json.JSONDecodeError, TypeError) as e:
            raise OptbotError(f"{path}: not a run state written by this optbot ({e})") from None

    # ---------------------------------------------------------------- steps
    def is_done(self, step: str) -> bool:
        rec = self.steps.get(step)
        return rec is not None and rec.status in ("done", "skipped")

    def next_step(self) -> str | None:
        for s in STEPS:
            if not self.is_done(s):
                return s
        return None

    def record(self, step: str, status: str, result: Any, seconds: float, summary: str, gpu_s: float = 0.0) -> None:
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

    def result(self, step: str) -> dict:
        rec = self.steps.get(step)
        if rec is None or not rec.result_file:
            return {}
        return json.loads(Path(rec.result_file).read_text())


class Paused(BaseException):
    """Raised at a safe point once the attempt's --pause-after time has passed: before a step, before
    a candidate's validation, before the stack's validation or its ablation. Everything reached so
    far is kept (step records, verdict checkpoints), so `--resume` continues without redoing it.
    A BaseException, so that no step's error handling takes it for a failure."""

    def __init__(self, before: str):
        super().__init__(before)
        self.before = before


class InjectedAbort(BaseException):
    """Raised at an abort point named by $OPTBOT_ABORT_AFTER (tests of resume). A BaseException, so
    that nothing on the way up treats it as a step failure: to the run it looks like a kill."""


def maybe_abort(point: str) -> None:
    """Fault injection for resume tests: $OPTBOT_ABORT_AFTER=STEP (or deliver:knowledge-pr,
    deliver:engine-pr) stops the run right after that point; with $OPTBOT_ABORT_MODE=kill the
    process SIGKILLs itself (as the OOM killer or a runner reboot would), else InjectedAbort is raised."""
    if os.environ.get("OPTBOT_ABORT_AFTER") != point:
        return
    if os.environ.get("OPTBOT_ABORT_MODE") == "kill":
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedAbort(point)
