"""What a runner child may see and touch, and how the bot starts it in the sandbox
(runner/sandbox.py sets the namespaces up; docs/security.md is the threat model, docs/runner.md the
runner's prerequisites).

A job's view of the filesystem:
- read-only: the system directories (/usr, /etc, /opt, /lib*, /sys...), the interpreter and every Python
  path the bot's own interpreter uses, optbot's runner/ package (only that: bot/, the store and
  lessons stay out), the engine worktree, and the directories of the input files the bot named in the job;
- read-write: the job's scratch (its work and output directories) and a compile cache of its own
  engine commit (Triton, Inductor), so one candidate cannot poison another's or the base's kernels;
- nothing else: $HOME, $OPTBOT_HOME, optbot's tree, the knowledge repository, the run directory
  and the base outputs are hidden even where they lie inside a read-only tree.

OPTBOT_SANDBOX=off runs jobs without it (for a runner that cannot provide namespaces and runs only
trusted code); anything else but "on" (the default) is an error. The bot fails closed: when the
sandbox cannot be set up, the first job says why and the run stops (exit 2).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from runner.job import Job
from runner.sandbox import SETUP_ERROR_PREFIX, SETUP_FAILED

from bot.errors import OptbotError
from bot.paths import REPO_ROOT, optbot_home, runs_dir

MODE_ENV = "OPTBOT_SANDBOX"
LAUNCHER = REPO_ROOT / "runner" / "sandbox.py"
SYSTEM_DIRS = ("usr", "etc", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "sys")


class SandboxUnavailable(OptbotError):
    """The runner sandbox cannot be set up on this machine (and the operator did not opt out)."""


def make_undumpable() -> None:
    """PR_SET_DUMPABLE 0 for the bot's process: its /proc entries (environ: the tokens) become
    unreadable to processes of the same uid without CAP_SYS_PTRACE, a second wall behind the pid
    namespace. Linux only; elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def enabled() -> bool:
    mode = os.environ.get(MODE_ENV, "on")
    if mode not in ("on", "off"):
        raise OptbotError(f"{MODE_ENV}={mode!r}: expected 'on' (the default: generated code runs sandboxed) or 'off'")
    return mode == "on"


def _real(p: str | Path) -> str:
    return os.path.realpath(os.path.abspath(p))


def _inside(p: str, root: str) -> bool:
    return p == root or p.startswith(root.rstrip("/") + "/")


def engine_tree(engine_root: str) -> str:
    """The engine worktree holding engine_root (the nearest directory with .git), else engine_root."""
    root = Path(_real(engine_root))
    for d in (root, *root.parents):
        if (d / ".git").exists():
            if str(d) in (_real(REPO_ROOT), _real(Path.home()), "/"):
                break
            return str(d)
    return str(root)


def compile_cache(engine_sha: str) -> Path:
    """Triton's and Inductor's cache for one engine commit: shared by that commit's jobs only."""
    return optbot_home() / "compile-cache" / (engine_sha or "none")


def cache_env(engine_sha: str) -> dict[str, str]:
    """Every cache a job may write, inside its engine commit's compile cache. HOME too: engines
    write under a literal ~ (SGLang's JIT kernels go to ~/.cache/sglang/jit whatever XDG says), and
    the real $HOME is hidden in the sandbox (measured on the H200: SGLang's FLUX.2 failed with
    'Read-only file system: /root/.cache' before this)."""
    c = compile_cache(engine_sha)
    return {"TRITON_CACHE_DIR": str(c / "triton"), "TRITON_HOME": str(c), "TORCHINDUCTOR_CACHE_DIR": str(c / "inductor"),
            "XDG_CACHE_HOME": str(c / "xdg"), "HOME": str(c / "home")}


def _python_paths() -> list[str]:
    """Where the interpreter and its packages live (the bot's own view), optbot's tree excepted."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(_real(sys.executable))}
    paths.update(p for p in sys.path if p)
    paths.update(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    repo = _real(REPO_ROOT)
    return [r for r in {_real(p) for p in paths} if os.path.exists(r) and not _inside(r, repo) and r != "/"]


def _system_and_python() -> list[str]:
    """What every job reads: the system directories (real ones: /bin -> usr/bin is recreated by the
    launcher) and the Python trees."""
    system = {_real(f"/{n}") for n in SYSTEM_DIRS if os.path.isdir(f"/{n}") and not os.path.islink(f"/{n}")}
    return sorted(system | set(_python_paths()))


def _named_inputs(value) -> list[str]:
    """Directories of the existing files, and the directories, named in a job's params."""
    found: list[str] = []
    if isinstance(value, dict):
        for v in value.values():
            found += _named_inputs(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            found += _named_inputs(v)
    elif isinstance(value, str) and value.startswith("/") and os.path.exists(value):
        # a file with its directory: a kernel test imports the kernel beside it
        found.append(_real(value) if os.path.isdir(value) else os.path.dirname(_real(value)))
    return found


def _weights(workload: dict) -> list[str]:
    out = []
    for key, v in workload.items():
        if key == "weights" and isinstance(v, str) and v != "seeded" and os.path.exists(v):
            out.append(_real(v))
        elif isinstance(v, dict):
            out += _weights(v)
    return out


class Scratch:
    """Directories a child could write. A path the bot later uses through one of them (a job's
    work directory, a file it writes there) must not pass a symlink a child left: that would point
    the bot, or the next job's read-write bind, at a file of the bot's choosing, e.g. $HOME."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirs: set[str] = set()

    def add(self, *dirs: str) -> None:
        with self._lock:
            self._dirs.update(dirs)

    def check(self, path: Path) -> None:
        p = os.path.abspath(path)
        with self._lock:
            tops = [d for d in self._dirs if _inside(p, d) and p != d]
        for top in tops:
            cur = top
            for part in Path(os.path.relpath(p, top)).parts:
                cur = os.path.join(cur, part)
                if os.path.islink(cur):
                    raise OptbotError(f"{cur} is a symlink inside a directory a runner child could write: "
                                      f"refusing to use {p} (generated code may have planted it)")


SCRATCH = Scratch()


def mounts(job: Job, work_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """(read-only, read-write, hidden) paths for this job, all absolute and free of symlinks."""
    rw = sorted({_real(work_dir), *([_real(job.out_dir)] if job.out_dir else []), _real(compile_cache(job.engine_sha))})
    ro = set(_system_and_python())
    ro.add(_real(REPO_ROOT / "runner"))
    if job.engine_root:
        ro.add(engine_tree(job.engine_root))
    ro.update(_named_inputs(job.params))
    ro.update(_weights(job.workload))
    hooks = (job.workload.get("inputs") or {}).get("hooks")
    if hooks and os.path.isfile(hooks):
        ro.add(_real(hooks))  # the workload's input hooks (that file alone: the workloads folder stays hidden)
    hidden = {_real(REPO_ROOT), _real(Path.home()), _real(optbot_home()), _real(runs_dir())}
    hidden = {h for h in hidden if h != "/" and os.path.isdir(h)}
    return sorted(ro - set(rw)), rw, sorted(hidden)


def command(job: Job, work_dir: Path, argv: list[str], root: Path, keep_fds: tuple[int, ...] = ()) -> list[str]:
    """argv, wrapped to start in the sandbox whose new root is mounted at `root` (an empty
    directory outside every bound path; the caller removes it), or as is when turned off."""
    if not enabled():
        return argv
    preflight()
    ro, rw, hidden = mounts(job, work_dir)
    for d in rw:
        Path(d).mkdir(parents=True, exist_ok=True)
    SCRATCH.add(*rw)
    return _launcher(root, _real(work_dir), ro, rw, hidden, keep_fds) + argv


def _launcher(root: Path, cwd: str, ro, rw, hidden, keep_fds) -> list[str]:
    cmd = [sys.executable, "-I", str(LAUNCHER), "--root", str(root), "--cwd", cwd, "--parent", str(os.getpid())]
    for flag, paths in (("--ro", ro), ("--rw", rw), ("--hide", hidden)):
        for p in paths:
            cmd += [flag, p]
    for fd in keep_fds:
        cmd += ["--keep-fd", str(fd)]
    return cmd + ["--"]


_preflight: dict[str, str] = {}
_preflight_lock = threading.Lock()


def preflight() -> None:
    """Once per process: start `python -c pass` in the sandbox. Failing closed here, before any
    job, gives one clear message instead of every job crashing the same way."""
    with _preflight_lock:
        if "result" not in _preflight:
            _preflight["result"] = _try_sandbox()
        problem = _preflight["result"]
    if problem:
        raise SandboxUnavailable(
            f"the runner sandbox cannot be set up on this machine: {problem}. Generated code runs only inside it "
            f"(docs/security.md); docs/runner.md lists what a runner needs (Linux >= 5.12 with user namespaces "
            f"allowed). To run without it, on a runner that only ever runs trusted code, set {MODE_ENV}=off.")


def _try_sandbox() -> str:
    import tempfile

    if not sys.platform.startswith("linux"):
        return f"it needs Linux namespaces, and this is {sys.platform}"
    with tempfile.TemporaryDirectory(prefix="optbot-sandbox-check-") as tmp, \
            tempfile.TemporaryDirectory(prefix="optbot-root-") as root:
        cmd = _launcher(root, _real(tmp), _system_and_python(), [_real(tmp)], [], ()) + [sys.executable, "-I", "-c", "pass"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={"PATH": os.environ.get("PATH", "")})
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{type(e).__name__}: {e}"
    if p.returncode == 0:
        return ""
    lines = [ln[len(SETUP_ERROR_PREFIX):] for ln in p.stderr.splitlines() if ln.startswith(SETUP_ERROR_PREFIX)]
    if p.returncode == SETUP_FAILED and lines:
        return lines[-1]
    return f"a test process in it exited with {p.returncode}: {p.stderr.strip()[-300:]}"
