"""The bot/runner process boundary: run one runner job in a child process.

The child:
- runs ``python -m runner JOB RESULT`` with PYTHONPATH = optbot's root, then the engine import root,
  so the engine worktree wins over any installed copy of the engine but cannot shadow the runner;
- gets an allow-listed environment: what Python, torch, triton and CUDA need, no token, key or
  other secret of the bot's (generated code runs there);
- has a wall-clock timeout; it is killed with its whole process group when it runs over;
- reports through RESULT (a file the bot chose), never through stdout, which is only a log.

A crash (signal, non-zero exit without a result), a timeout or a result of ok=false comes back as a
typed JobOutcome, never as an exception, so the caller can turn it into a verdict and move on.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from runner.job import RESULT_KEYS, Job

from bot.errors import RunnerError
from bot.paths import REPO_ROOT

# A runner child gets an ALLOW-list of the bot's environment: what Python, torch, triton, CUDA and the
# math libraries read (issue 14). Everything else (tokens, keys, DATABASE_URL, webhooks, CI job
# tokens, whatever a runner holds) stays behind, whatever its name; within the allowed names, one
# that looks like a secret is still dropped.
ENV_ALLOW = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "LD_LIBRARY_PATH", "VIRTUAL_ENV", "XDG_CACHE_HOME", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
    "PYTHONNOUSERSITE", "CC", "CXX", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "NUMEXPR_MAX_THREADS"})
ENV_ALLOW_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "CUBLAS", "CUDNN_", "TRITON_", "TORCH_",
                      "TORCHINDUCTOR_", "PYTORCH_", "KMP_", "GOMP_", "SGLANG_")
SECRET_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|PWD$|API_KEY|APIKEY|CREDENTIAL|PRIVATE_KEY|AUTH|JWT|DSN$|"
                       r"WEBHOOK|_KEY$|_URL$)", re.I)


def child_env(engine_root: str, device: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if (k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)) and not SECRET_RE.search(k)}
    # optbot's runner first (an engine tree must not be able to shadow the runner package), then
    # the engine (it must win over an installed copy), then whatever the caller had (e.g. carried
    # wheels on an offline GPU box).
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), engine_root, *rest])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")  # the harness never downloads; real weights come from a path
    env.setdefault("DIFFUSERS_VERBOSITY", "error")
    if device == "cpu":
        # DESIGN: on CPU, Triton kernels run (and are correctness-checked) in Triton's interpreter;
        # without it an engine's Triton path would silently fall back and never be exercised.
        env.setdefault("TRITON_INTERPRET", "1")
    m = re.fullmatch(r"cuda:(\d+)", device)
    if m:
        # One GPU per child: cuda:N becomes the only visible device (N indexes the parent's visible
        # list), and the runner addresses it as plain "cuda". Nothing the child or the engine does
        # can then allocate on, or time against, another lane's GPU.
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        idx = int(m[1])
        env["CUDA_VISIBLE_DEVICES"] = visible[idx] if idx < len(visible) else str(idx)
        env["OPTBOT_JOB_DEVICE"] = "cuda"
    return env


@dataclass
class JobOutcome:
    status: str  # ok | failed (result ok=false) | crashed | timeout
    result: dict = field(default_factory=dict)
    returncode: int | None = None
    seconds: float = 0.0
    log_path: str = ""
    log_tail: str = ""
    problem: str = ""  # crashed with a result file that is no valid result: what is wrong with it

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def reason(self) -> str:
        if self.status == "ok":
            return "ok"
        if self.status == "failed":
            err = self.result.get("error", {})
            return f"{err.get('kind', 'error')}: {err.get('message', '')}"
        if self.status == "timeout":
            return f"timeout after {self.seconds:.0f} s"
        sig = -self.returncode if self.returncode and self.returncode < 0 else None
        how = f"signal {signal.Signals(sig).name}" if sig else f"exit code {self.returncode}"
        if self.problem:
            return f"crashed ({how}): no valid result ({self.problem})"
        return f"crashed ({how}) with no result"

    def error(self, what: str) -> RunnerError:
        """The error for a job the caller cannot go on without: `what` names it ("profile job")."""
        return RunnerError(f"{what} {self.reason()}; log: {self.log_path}\n{self.log_tail[-1500:]}".rstrip())


class DeviceLedger:
    """Seconds of runner jobs per device kind, for this process: a run's GPU time is the sum of its
    jobs' wall time on CUDA devices (each job holds one GPU for its whole life)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.jobs: dict[str, int] = {}

    def add(self, device: str, seconds: float) -> None:
        kind = "cuda" if device.startswith("cuda") else "cpu"
        with self._lock:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
            self.jobs[kind] = self.jobs.get(kind, 0) + 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.seconds)


LEDGER = DeviceLedger()


def run_job(job: Job, work_dir: Path, timeout_s: float = 1800, name: str = "job") -> JobOutcome:
    work_dir.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = work_dir / f"{name}.job.json", work_dir / f"{name}.result.json", work_dir / f"{name}.log"
    result_path.unlink(missing_ok=True)
    job.to_file(job_path)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "runner", str(job_path), str(result_path)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=child_env(job.engine_root, job.device), cwd=work_dir, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
            status = None
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, status = proc.returncode, "timeout"
    seconds = time.monotonic() - t0
    LEDGER.add(job.device, seconds)
    tail = _tail(log_path)
    result: dict = {}
    problem = ""
    if status is None:
        result, problem = _read_result(result_path, job.kind)
        if rc == 0 and result.get("ok") is True and not problem:
            status = "ok"
        elif result.get("ok") is False and not problem:
            status = "failed"
        else:
            status = "crashed"
    return JobOutcome(status=status, result=result, returncode=rc, seconds=seconds, log_path=str(log_path),
                      log_tail=tail, problem=problem)


def _read_result(path: Path, kind: str) -> tuple[dict, str]:
    """(the result, "") or ({}, what is wrong): a file that is not JSON, not an object, or lacks the
    keys its kind must have (runner/job.py RESULT_KEYS) is no result to read numbers from."""
    if not path.is_file():
        return {}, ""
    try:
        result = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return {}, f"the result file is not JSON: {e}"
    if not isinstance(result, dict):
        return {}, f"the result file holds a {type(result).__name__}, not an object"
    missing = [k for k in RESULT_KEYS.get(kind, ()) if k not in result] if result.get("ok") is True else []
    if result.get("ok") is False and not isinstance(result.get("error"), dict):
        missing = ["error"]
    if missing:
        return {}, f"a {kind} result without {missing}"
    return result, ""


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: Path, n: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")
