"""The bot/runner process boundary: run one runner job in a child process.

The child:
- runs ``python -m runner JOB FD`` (forked by the runner's zygote from a process that imported torch
  and the engines' dependencies once: bot/zygote.py, runner/zygote.py) in the sandbox (bot/sandbox.py, runner/sandbox.py: namespaces,
  a filesystem of read-only system and Python trees plus its own scratch, no network), with
  PYTHONPATH = optbot's root, then the engine import root, so the engine worktree wins over any
  installed copy of the engine but cannot shadow the runner;
- gets an allow-listed environment: what Python, torch, triton and CUDA need, no token, key or
  other secret of the bot's (generated code runs there), and a compile cache of its engine commit;
- has a wall-clock timeout; it is killed with its whole process group when it runs over;
- reports through the socket FD (runner/channel.py): exactly one result message, and the marks of its
  timed phases, which the bot clocks itself (clock_check); stdout is only a log.

A crash (signal, non-zero exit without a valid result), a timeout, a result of ok=false or timings
the bot's clock contradicts come back as a typed JobOutcome, never as an exception, so the caller
can turn it into a verdict and move on. Only a sandbox that cannot be set up at all raises
(bot/sandbox.SandboxUnavailable): the run stops rather than run generated code unconfined.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from runner.job import RESULT_KEYS, UNEXPLAINED_ERROR, Job, open_new
from runner.zygote import CHANNEL_FD

from bot import sandbox, zygote
from bot.errors import RunnerError
from bot.paths import REPO_ROOT
from bot.sandbox import SCRATCH, cache_env

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


def zygote_env() -> dict[str, str]:
    """The environment the runner's zygote starts with (bot/zygote.py): a job's but for what is per
    job: no engine on the import path, no device, no compile cache (a path a library reads at import
    then lies in no job's sandbox)."""
    env = child_env("")
    env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return env


STAGE_RE = re.compile(r"[A-Za-z0-9_+:.-]{1,24}")  # a stage's name as a progress line shows it (the child names it)


@dataclass
class JobOutcome:
    status: str  # ok | failed (result ok=false) | crashed | timeout | implausible (bot/jobs.clock_check)
    result: dict = field(default_factory=dict)
    returncode: int | None = None
    seconds: float = 0.0
    log_path: str = ""
    log_tail: str = ""
    problem: str = ""  # crashed: what is wrong with the report; implausible: what the bot's clock says
    phases: dict[str, float] = field(default_factory=dict)  # timed phase -> seconds by the bot's clock

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def took(self) -> str:
        """How the process ended and how long it ran, for a progress line: "<status>, <seconds> s",
        and where the time went when the job marked its stages (runner/channel.stage), by the bot's
        clock: "ok, 37 s (build 12, eager 3, graph 4, compile 12, compile+graph 5)"."""
        stages = [(k[6:], v) for k, v in self.phases.items() if k.startswith("stage:") and STAGE_RE.fullmatch(k[6:])]
        where = f" ({', '.join(f'{n} {v:.0f}' for n, v in stages[:12])})" if stages else ""
        return f"{self.status}, {self.seconds:.0f} s{where}"

    def reason(self) -> str:
        if self.status == "ok":
            return "ok"
        if self.status == "failed":
            err = self.result.get("error", {})
            return f"{err.get('kind', 'error')}: {err.get('message', '')}"
        if self.status == "timeout":
            return f"timeout after {self.seconds:.0f} s"
        if self.status == "implausible":
            return self.problem
        sig = -self.returncode if self.returncode and self.returncode < 0 else None
        how = f"signal {signal.Signals(sig).name}" if sig else f"exit code {self.returncode}"
        if self.problem:
            return f"crashed ({how}): no valid result ({self.problem})"
        return f"crashed ({how}) with no result"

    def error(self, what: str) -> RunnerError:
        """The error for a job the caller cannot go on without: `what` names it ("profile job"). A
        refusal the runner explained (a typed error: the model class, the config, the inputs, the
        quantization) is its message; anything else comes with the end of the job's log."""
        kind = self.result.get("error", {}).get("kind", UNEXPLAINED_ERROR)
        explained = self.status == "failed" and kind != UNEXPLAINED_ERROR
        tail = "" if explained else self.log_tail[-1500:]
        return RunnerError(f"{what} {self.reason()}; log: {self.log_path}\n{tail}".rstrip())


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
    SCRATCH.check(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    job_path, log_path = work_dir / f"{name}.job.json", work_dir / f"{name}.log"
    job.to_file(job_path)
    env = child_env(job.engine_root, job.device)
    env.update(cache_env(job.engine_sha))
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    # The report channel: SOCK_SEQPACKET, so each mark arrives as a packet the kernel timestamped
    # when the child sent it (SO_TIMESTAMPNS); a pipe would only say when our thread read it.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    read_fd, write_fd = ours.detach(), theirs.detach()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="optbot-root-") as root:
        try:
            argv = sandbox.command(job, work_dir, [sys.executable, "-m", "runner", str(job_path), str(CHANNEL_FD)],
                                   Path(root), keep_fds=(CHANNEL_FD,))
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        log = open_new(log_path)
        try:
            proc = zygote.ZYGOTE.spawn(argv, env, zygote_env(), str(work_dir), log.fileno(), write_fd)
        except BaseException:
            os.close(read_fd)
            log.close()
            raise
        finally:
            os.close(write_fd)
        with log:
            report = Report(read_fd)
            try:
                rc = proc.wait(timeout=timeout_s)
                status = None
            except subprocess.TimeoutExpired:
                proc.kill_group()
                rc, status = proc.returncode, "timeout"
            report.join()
    seconds = time.monotonic() - t0
    LEDGER.add(job.device, seconds)
    tail = _tail(log_path)
    result: dict = {}
    problem = implausible = ""
    if status is None:
        result, problem = report.result(job.kind)
        if rc == 0 and result.get("ok") is True and not problem:
            implausible = clock_check(result, report.phases, job.device)
            status = "implausible" if implausible else "ok"
        elif result.get("ok") is False and not problem:
            status = "failed"
        else:
            status = "crashed"
    return JobOutcome(status=status, result=result, returncode=rc, seconds=seconds, log_path=str(log_path),
                      log_tail=tail, problem=problem or implausible,
                      phases={k: v[1] - v[0] for k, v in report.phases.items() if len(v) == 2})


SO_TIMESTAMPNS = 35  # <asm-generic/socket.h>; Python's socket module does not name it


class Report:
    """The bot's end of a child's report channel (runner/channel.py): read on a thread, so a result
    larger than the socket's buffer cannot block the child; each timed phase's marks stamped with
    the time the kernel took them from the child (CLOCK_REALTIME, SO_TIMESTAMPNS), or, where no
    stamp comes with a packet, the bot's clock when it reads it."""

    MAX_BYTES = 64 * 2**20

    def __init__(self, fd: int) -> None:
        self.lines: list[bytes] = []
        self.phases: dict[str, list[float]] = {}  # label -> [bot's start, bot's end]
        self.problem = ""
        self._thread = threading.Thread(target=self._read, args=(fd,), daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        buf, total = b"", 0
        with socket.socket(fileno=fd) as sock:
            while True:
                chunk, ancillary, _flags, _addr = sock.recvmsg(1 << 17, socket.CMSG_SPACE(16))
                if not chunk:
                    break
                now = time.time()
                for level, kind, data in ancillary:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                        sec, nsec = struct.unpack("qq", data[:16])
                        now = sec + nsec / 1e9
                total += len(chunk)
                if total > self.MAX_BYTES:
                    self.problem = f"the report is larger than {self.MAX_BYTES >> 20} MiB"
                    continue  # keep draining, so the child is not blocked forever
                buf += chunk
                *done, buf = buf.split(b"\n")
                for line in done:
                    self._line(line, now)
        if buf:
            self._line(buf, time.time())

    def _line(self, line: bytes, now: float) -> None:
        try:
            msg = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.problem = self.problem or f"a report line is not JSON: {line[:80]!r}"
            return
        if isinstance(msg, dict) and msg.get("mark") in ("start", "end") and isinstance(msg.get("phase"), str):
            stamps = self.phases.setdefault(msg["phase"], [])
            if len(stamps) == (0 if msg["mark"] == "start" else 1):
                stamps.append(now)
            else:
                self.problem = self.problem or f"phase {msg['phase']!r} marked {msg['mark']} out of order"
        else:
            self.lines.append(line)

    def join(self) -> None:
        self._thread.join(timeout=30)

    def result(self, kind: str) -> tuple[dict, str]:
        """(the result, "") or ({}, what is wrong): exactly one message {"result": {...}}, holding the
        keys its kind must have (runner/job.py RESULT_KEYS)."""
        if self.problem:
            return {}, self.problem
        if not self.lines:
            return {}, ""
        if len(self.lines) > 1:
            return {}, f"{len(self.lines)} result messages, not one"
        msg = json.loads(self.lines[0])  # JSON: _line checked
        if not isinstance(msg, dict) or set(msg) != {"result"} or not isinstance(msg["result"], dict):
            return {}, f"the report's message is {str(msg)[:60]!r}, not {{\"result\": {{...}}}}"
        result = msg["result"]
        missing = [k for k in RESULT_KEYS.get(kind, ()) if k not in result] if result.get("ok") is True else []
        if result.get("ok") is False and not isinstance(result.get("error"), dict):
            missing = ["error"]
        if missing:
            return {}, f"a {kind} result without {missing}"
        return result, ""


# A phase's samples may not add up to less than CLOCK_MIN_SHARE of the time the bot saw pass between
# the phase's marks, less CLOCK_SLACK_S for the marks' own latency on a busy machine and, per trial,
# what the timing loop does outside a sample (L2 flush, synchronize, events: runner/timing.py).
# Honest loops spend nearly all of a phase in the samples; a clock running at half speed claims half.
# For microsecond kernels the per-trial allowance dominates and the check says nothing; whole steps
# (milliseconds and more), which the verdicts are made of, are what it guards.
CLOCK_MIN_SHARE, CLOCK_SLACK_S = 0.7, 0.01
TRIAL_OVERHEAD_S = {"cuda": 1e-3, "cpu": 2e-4}


def clock_check(result: dict, phases: dict[str, list[float]], device: str) -> str:
    """"" or why the result's timings are implausible by the bot's own clock."""
    claimed: dict[str, list[float]] = {}

    def walk(v) -> None:
        if isinstance(v, dict):
            if isinstance(v.get("phase"), str) and v["phase"] and isinstance(v.get("samples_ms"), list):
                claimed.setdefault(v["phase"], []).extend(float(x) / 1e3 for x in v["samples_ms"])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(result)
    per_trial = TRIAL_OVERHEAD_S["cuda" if device.startswith("cuda") else "cpu"]
    for label, samples in sorted(claimed.items()):
        stamps = phases.get(label, [])
        if len(stamps) != 2:
            return f"implausible: the result claims timings of phase {label!r}, which the bot never saw start and end"
        seen, secs = stamps[1] - stamps[0], sum(samples)
        if secs < CLOCK_MIN_SHARE * (seen - CLOCK_SLACK_S - per_trial * len(samples)):
            return (f"implausible: phase {label!r} took {seen:.3f} s by the bot's clock, but its {len(samples)} samples "
                    f"add up to {secs:.3f} s (a clock in the child runs slow)")
        if secs > 1.05 * seen + CLOCK_SLACK_S:
            return (f"implausible: phase {label!r} took {seen:.3f} s by the bot's clock, but its {len(samples)} samples "
                    f"add up to {secs:.3f} s, more than passed")
    return ""


def _tail(path: Path, n: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")
