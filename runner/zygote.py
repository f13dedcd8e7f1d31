"""The runner's warm start: ``python -m runner.zygote FD warm|cold`` (started by bot/zygote.py, once
per bot).

A runner child spent most of its life importing: about 10 s of CPU before its job began (torch,
torch._dynamo, triton, and what an engine pulls in with it: transformers, scipy), against 1-3 s
of work for a tiny validation step (measured over the CPU test suite, 2026-12-05: half of the
suite's time was child start-up). This process imports those libraries once, from the bot's view
of the filesystem and with the child environment (no secret: bot/jobs.child_env), and then forks
each job from that state. What a fork runs is exactly what `python -m runner` would have run: the
sandbox launcher's set-up (runner/sandbox.main: namespaces, new root, privileges dropped), then
runner/__main__.main in the job process, with the job's own environment, import path and file
descriptors.

`cold` (OPTBOT_RUNNER_PRELOAD=off), or a preload that left the CUDA driver loaded in this process
(a CUDA context does not survive fork: a job forked from it could not use the GPU), and every job
execs `python -m runner` as before, after the same launcher; nothing is preloaded to be kept.

What it never imports: an engine (diffusers, sglang), a workload's hooks or anything else from a
worktree. Those differ per job and may be generated code; each job imports its own, as before.
Only installed libraries and optbot's runner package are preloaded: the same files a job reads
read-only in its sandbox, at the same paths.

Protocol, over the SOCK_SEQPACKET socket FD (one per bot): each request is one packet, a JSON
object {"argv", "env", "cwd"} with three descriptors attached (SCM_RIGHTS): the request's own
reply socket, the log file (stdout and stderr) and the job's report channel. The job gets the
channel as fd 3 (`argv` already names 3). On the reply socket the zygote sends "pid N" once
forked and "exit STATUS" (the raw wait status) when that process ends, then closes it. A job's
process leads a session of its own, so the bot kills it with its process group as it would a
Popen'd one. When the bot's end closes (the bot exited or was killed), the zygote kills every job
it started and exits: nothing outlives the bot.

What a fork inherits that a fresh process would not have: the preloaded modules' state (nothing
has run but their imports) and the zygote's environment at import time. The environment is the
one every job gets but for the per-job names (engine root in PYTHONPATH, device, cache
directories), all read when used, not at import; numpy's and torch's global random states are
reseeded in each job (`_fresh_random_state`), as fresh imports would seed them.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys
import warnings

# Libraries a job imports anyway, heaviest first (the seconds are CPU on the 2-core CI machine);
# a name that is not installed is skipped. No engine, nothing from a worktree.
PRELOAD = (
    "torch",            # 2.4-2.7 s
    "torch._dynamo",    # 2.4 s (diffusers' torch_utils imports it; every compile mode needs it)
    "numpy",
    "triton", "triton.language",
    "transformers",     # 1.3 s (diffusers' quantizer configs import it when installed)
    "scipy.stats",      # 1.5 s (diffusers' single-file loader imports it when installed)
    "safetensors.torch", "huggingface_hub",
    "runner.harness", "runner.poison", "runner.timing", "runner.modes",
)
CHANNEL_FD = 3  # the job's report channel, as `python -m runner JOB 3` expects it
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox.py")


def preload() -> list[str]:
    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a library that fails to import is the job's to report
            missing.append(name)
    return missing


def cuda_driver_loaded() -> bool:
    """Whether libcuda is mapped into this process: a library that asked for the device count, say,
    at import. Loaded is not always initialized, but only not-loaded is certainly safe to fork."""
    try:
        with open("/proc/self/maps") as f:
            return any("libcuda.so" in line for line in f)
    except OSError:
        return True


def _reset_signals() -> None:
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _job_fds(log_fd: int, chan_fd: int) -> None:
    """0 = /dev/null, 1 and 2 = the log, 3 = the channel, nothing else: no descriptor of the
    zygote (its socket to the bot, other jobs' files) reaches the job."""
    log, chan = os.dup(log_fd), os.dup(chan_fd)  # above 3, so the dup2s below cannot overwrite them
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(chan, CHANNEL_FD)
    os.closerange(CHANNEL_FD + 1, os.sysconf("SC_OPEN_MAX"))


def _run_in_process(command: list[str]) -> None:
    """Run `python -m runner JOB FD` in this process, as that command would; cold, or any other
    command (none is sent today), is exec'd as it is."""
    if not _WARM or command[:3] != [sys.executable, "-m", "runner"] or len(command) != 5:
        os.execve(command[0], command, os.environ)
    # the import path a fresh `python -m runner` gets: its working directory, PYTHONPATH, then
    # the interpreter's own directories (which the zygote has too, after its own PYTHONPATH)
    ours = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *ours, *_BASE_PATH]
    importlib.invalidate_caches()
    # what a fresh interpreter runs at start from its path: an engine tree's sitecustomize runs,
    # here in the sandbox, as it would have in `python -m runner`
    import site

    sys.modules.pop("sitecustomize", None)
    site.execsitecustomize()
    if site.ENABLE_USER_SITE:
        sys.modules.pop("usercustomize", None)
        site.execusercustomize()
    sys.argv = [os.path.join(os.path.dirname(LAUNCHER), "__main__.py"), *command[3:]]
    _fresh_random_state()
    from runner import env
    from runner.__main__ import main

    env.note("runner_start", "forked from the warm zygote")

    try:
        code = main(command[3:])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - as an uncaught exception would end `python -m runner`
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _fresh_random_state() -> None:
    """The random state a fresh interpreter starts with. Python's `random` reseeds itself in a
    forked child; numpy's and torch's global generators would stay the zygote's, the same in every
    job, so both are reseeded from the OS as their imports seed them (torch 2.13 seeds its default
    CPU generator non-deterministically per process; tests/test_jobs.py checks both)."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _child(req: dict, log_fd: int, chan_fd: int) -> None:
    os.setsid()
    _reset_signals()
    _job_fds(log_fd, chan_fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    argv = list(req["argv"])
    if argv[:3] == [sys.executable, "-I", LAUNCHER]:
        from runner import sandbox

        args = argv[3:]
        if "--parent" in args:  # the launcher dies with its parent: that is this zygote now
            args[args.index("--parent") + 1] = str(os.getppid())
        status = sandbox.main(args, run=_run_in_process)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    _run_in_process(argv)


class Zygote:
    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.jobs: dict[int, socket.socket] = {}  # pid -> its reply socket
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)

    def serve(self) -> None:
        import select

        while True:
            try:
                ready = select.select([self.ctl, self.wake_r], [], [])[0]
            except InterruptedError:
                continue
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
                self.reap()
            if self.ctl in ready:
                msg, fds, _flags, _addr = socket.recv_fds(self.ctl, 1 << 20, 3)
                if not msg:  # the bot is gone
                    self.shutdown()
                try:
                    req = json.loads(msg)
                except ValueError:
                    req = None
                if len(fds) != 3 or not isinstance(req, dict):  # not a request of bot/zygote.py's
                    for fd in fds:
                        os.close(fd)
                    continue
                self.start(req, *fds)

    def start(self, req: dict, reply_fd: int, log_fd: int, chan_fd: int) -> None:
        reply = socket.socket(fileno=reply_fd)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            with warnings.catch_warnings():  # "multi-threaded, fork() may deadlock": torch's idle native
                warnings.simplefilter("ignore", DeprecationWarning)  # threads; the fork keeps only this one
                pid = os.fork()
        except OSError as e:  # no process to be had: the bot reads the answer as a failed start
            os.close(log_fd)
            os.close(chan_fd)
            try:
                reply.send(f"error fork: {e}".encode())
            except OSError:
                pass
            reply.close()
            return
        if pid == 0:
            try:
                # the zygote's sockets, released without closing (_job_fds closes their numbers):
                # a socket object closed later by the collector would close whatever the job
                # opened under that number by then
                for s in (self.ctl, reply, *self.jobs.values()):
                    s.detach()
                _child(req, log_fd, chan_fd)
            finally:
                os._exit(127)
        os.close(log_fd)
        os.close(chan_fd)
        self.jobs[pid] = reply
        try:
            reply.send(f"pid {pid}".encode())
        except OSError:  # the bot gave up on it already
            pass

    def reap(self) -> None:
        while self.jobs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            reply = self.jobs.pop(pid, None)
            if reply is not None:
                try:
                    reply.send(f"exit {status}".encode())
                except OSError:
                    pass
                reply.close()

    def shutdown(self) -> None:
        for pid in list(self.jobs):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)


_BASE_PATH: list[str] = []
_WARM = False


def main(argv: list[str]) -> int:
    global _WARM
    if len(argv) != 2 or not argv[0].isdigit() or argv[1] not in ("warm", "cold"):
        print("usage: python -m runner.zygote FD warm|cold  (FD: the bot's SOCK_SEQPACKET socket)", file=sys.stderr)
        return 2
    ctl = socket.socket(fileno=int(argv[0]))
    # the interpreter's own import path: what follows this process's PYTHONPATH entries
    ours = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    _BASE_PATH[:] = [p for p in sys.path[1:] if p and os.path.abspath(p) not in ours]
    if argv[1] == "warm":
        missing = preload()
        if missing:
            print(f"runner.zygote: not preloaded (not installed or failing): {', '.join(missing)}", file=sys.stderr)
        _WARM = not cuda_driver_loaded()
        if not _WARM:
            print("runner.zygote: the CUDA driver is loaded after the preload; every job starts a fresh interpreter",
                  file=sys.stderr, flush=True)
    Zygote(ctl).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
