"""The runner jobs the profile and analyze steps share with `optbot profile` and `optbot analyze`,
and the one error a failed job becomes."""
from __future__ import annotations

from pathlib import Path

from bot.errors import OptbotError
from bot.jobs import JobOutcome, run_job
from bot.target import Target

# runner error kinds that mean the workload file names a model the engine does not have
MODEL_ERRORS = ("model-class-not-found", "engine-not-first")
# ... and that its inputs or config do not fit the model (runner/harness.py)
INPUT_ERRORS = ("inputs", "config-rejected")


def failed(t: Target, out: JobOutcome, what: str) -> OptbotError:
    """The error for a job that did not succeed: a workload-file error when the engine has no such
    model class (the file, the key, the message), else the job's failure with its log."""
    err = out.result.get("error", {}) if out.result else {}
    if err.get("kind") in MODEL_ERRORS:
        return OptbotError(f"{t.workload.file}: key 'engines.{t.engine_name or t.workload.default_engine}.model_class': "
                           f"{err.get('message')}")
    if err.get("kind") in INPUT_ERRORS:
        key = "inputs.forward" if err["kind"] == "inputs" else f"presets.{t.preset}.config"
        msg = str(err.get("message", "")).removeprefix("HarnessError: ")
        return OptbotError(f"{t.workload.file}: {msg}" if msg.startswith("key '") else f"{t.workload.file}: key '{key}': {msg}")
    return out.error(what)


def run_ok(t: Target, kind: str, worktree: Path, out_dir: Path, timeout_s: float, **job_kw) -> dict:
    """One runner job of `kind` on `worktree`; its result, or the error above."""
    out = run_job(t.job(kind, worktree, out_dir, **job_kw), out_dir, timeout_s=timeout_s, name=kind)
    if not out.ok:
        raise failed(t, out, f"{kind} job")
    return out.result
