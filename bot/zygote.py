"""The bot's end of the runner's warm start (runner/zygote.py): zygotes started on a bot's first
job and again if they died, shared by every thread that runs jobs (GPU lanes). One zygote per value
of what the preloaded libraries read from the environment when imported (`IMPORT_ENV`): Triton
decorates its own library's kernels at import, as interpreted functions under TRITON_INTERPRET=1 and
compiled ones without, so a CPU job (interpreted) and a GPU job cannot share a zygote.

`Zygote.spawn` hands the zygote one job (its sandboxed command line, environment, working
directory, log and report channel) and returns a `JobProcess`, which bot/jobs.run_job waits on and
kills as it did a Popen. Each request is one packet on the zygote's socket; its answers come on a
socket of its own ("pid N", then "exit STATUS"), so concurrent jobs need no bookkeeping here.

OPTBOT_RUNNER_PRELOAD=off (default on) makes the zygote exec a fresh interpreter for every job: the
start-up without the warm start, for a machine where forking a process that imported torch is
suspected of a fault.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bot.errors import RunnerError
from bot.paths import REPO_ROOT

PRELOAD_ENV = "OPTBOT_RUNNER_PRELOAD"
IMPORT_ENV = ("TRITON_INTERPRET",)  # read by a preloaded library at import, not when used


class ZygoteError(RunnerError):
    """The runner's zygote could not be started or stopped answering."""


def preload_enabled() -> bool:
    mode = os.environ.get(PRELOAD_ENV, "on")
    if mode not in ("on", "off"):
        raise RunnerError(f"{PRELOAD_ENV}={mode!r}: expected 'on' (the default: each job forks from a process that "
                          f"imported torch once) or 'off' (each job starts a fresh interpreter)")
    return mode == "on"


class JobProcess:
    """A job the zygote forked: what the bot needs of a Popen (wait with a timeout, the exit code as
    Popen gives it, a kill of its process group), over the request's own socket."""

    def __init__(self, reply: socket.socket, pid: int) -> None:
        self.reply, self.pid = reply, pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        if not select.select([self.reply], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(f"job {self.pid}", timeout or 0)
        msg = self.reply.recv(64)
        self.reply.close()
        # no "exit": the zygote died with the job in flight, and the job with it (PR_SET_PDEATHSIG)
        self.returncode = os.waitstatus_to_exitcode(int(msg.split()[1])) if msg.startswith(b"exit ") else -signal.SIGKILL
        return self.returncode

    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.wait()


class Zygote:
    """One zygote process."""

    START_TIMEOUT_S = 600  # the first job waits while the zygote imports (~10 s of CPU on 2 cores)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ctl: socket.socket | None = None
        self._log = ""

    def _start(self, env: dict[str, str], warm: bool) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.detach()
        log = tempfile.NamedTemporaryFile(prefix="optbot-zygote-", suffix=".log", delete=False)
        self._log = log.name
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", "runner.zygote", str(fd), "warm" if warm else "cold"],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          cwd=str(REPO_ROOT), start_new_session=True, pass_fds=(fd,))
        finally:
            os.close(fd)
            log.close()
        self._ctl = ours

    def spawn(self, argv: list[str], env: dict[str, str], zygote_env: dict[str, str], cwd: str, log_fd: int,
              chan_fd: int, warm: bool) -> JobProcess:
        reply, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                if self._proc is None or self._proc.poll() is not None:
                    self._stop()
                    self._start(zygote_env, warm)
                msg = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
                try:
                    socket.send_fds(self._ctl, [msg], [theirs.fileno(), log_fd, chan_fd])
                except OSError as e:
                    raise ZygoteError(f"the runner's zygote took no job ({e}); its log: {_tail(self._log)}") from None
        finally:
            theirs.close()
        answer = reply.recv(64) if select.select([reply], [], [], self.START_TIMEOUT_S)[0] else b""
        if not answer.startswith(b"pid "):
            reply.close()
            raise ZygoteError(f"the runner's zygote did not start the job ({answer.decode(errors='replace') or 'no answer'}); "
                              f"its log: {_tail(self._log)}")
        return JobProcess(reply, int(answer.split()[1]))

    def _stop(self) -> None:
        if self._ctl is not None:
            self._ctl.close()  # the zygote reads the end of its socket: it kills its jobs and exits
            self._ctl = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()


def _tail(path: str, n: int = 800) -> str:
    try:
        return Path(path).read_bytes()[-n:].decode("utf-8", "replace").strip() or "(empty)"
    except OSError:
        return "(unreadable)"


class Zygotes:
    """The bot's zygotes, one per value of IMPORT_ENV (and of OPTBOT_RUNNER_PRELOAD)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple, Zygote] = {}

    def spawn(self, argv: list[str], env: dict[str, str], zygote_env: dict[str, str], cwd: str, log_fd: int,
              chan_fd: int) -> JobProcess:
        """Fork one job. `zygote_env` is what a new zygote starts with: a job's environment without
        what is per job (bot/jobs.zygote_env); the job's own values of IMPORT_ENV are added to it."""
        warm = preload_enabled()
        key = (warm, *(env.get(k) for k in IMPORT_ENV))
        with self._lock:
            zygote = self._by_key.setdefault(key, Zygote())
        zenv = {k: v for k, v in zygote_env.items() if k not in IMPORT_ENV}
        zenv.update({k: env[k] for k in IMPORT_ENV if k in env})
        return zygote.spawn(argv, env, zenv, cwd, log_fd, chan_fd, warm)

    def processes(self) -> list[subprocess.Popen]:
        with self._lock:
            return [z._proc for z in self._by_key.values() if z._proc is not None]

    def close(self) -> None:
        with self._lock:
            zygotes, self._by_key = list(self._by_key.values()), {}
        for z in zygotes:
            z.close()


ZYGOTE = Zygotes()
