"""Is this machine ready to be an optbot GPU runner? One Check per prerequisite, each with what to
do when it fails (`optbot runner check`; runner/setup/README.md, docs/runner.md).

The sandbox line is bot.sandbox.preflight() itself: the same probe the first job runs, so the
check cannot pass where a run would stop. The kernel knobs around it (AppArmor's restriction of
unprivileged user namespaces on Ubuntu 23.10+, user.max_user_namespaces) are read to say *why*
it fails and what to change. Run it as the runner's user: root is exempt from AppArmor's
restriction, so a check as root says nothing about an unprivileged runner.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bot.hardware import NVIDIA_SMI_QUERY, Gpu, parse_gpus, runner_labels

MIN_PYTHON = (3, 10)  # pyproject.toml's requires-python
MIN_FREE_GIB = 40.0  # engines, worktrees, compile caches and pip's wheels of a few runs
SYSCTL_CONF = "/etc/sysctl.d/60-optbot-runner.conf"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # what was found
    fix: str = ""  # what to do when it fails

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}" + ("" if self.ok else f" -> {self.fix}")


@dataclass(frozen=True)
class HostReport:
    checks: list[Check]
    gpus: list[Gpu]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def labels(self) -> list[str]:
        return runner_labels(self.gpus)


def read_knob(name: str, proc_sys: Path = Path("/proc/sys")) -> str | None:
    """A sysctl's value ("kernel.apparmor_restrict_unprivileged_userns"), None where the kernel has none."""
    try:
        return (proc_sys / name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def check_sandbox() -> Check:
    from bot import sandbox

    try:
        sandbox.preflight()
    except sandbox.SandboxUnavailable as e:
        return Check("sandbox", False, str(e).split(". Generated code")[0],
                     "see the apparmor and userns lines below and docs/runner.md")
    who = "root: says nothing of an unprivileged runner user, check as that user" if os.geteuid() == 0 else \
        f"uid {os.geteuid()}"
    return Check("sandbox", True, f"user, mount, pid, network, IPC and UTS namespaces set up as {who}")


def check_apparmor(sandbox_ok: bool, proc_sys: Path = Path("/proc/sys")) -> Check:
    name = "kernel.apparmor_restrict_unprivileged_userns"
    v = read_knob(name, proc_sys)
    if v is None or v == "0":
        return Check(name, True, "absent" if v is None else "0 (unprivileged user namespaces not restricted)")
    if sandbox_ok and os.geteuid() != 0:
        return Check(name, True, f"{v}, but this interpreter may create user namespaces (an AppArmor profile allows it)")
    who = " (checked as root, which AppArmor exempts: the runner user is not)" if os.geteuid() == 0 else ""
    return Check(name, False, f"{v}: AppArmor refuses user namespaces to unprivileged users{who}",
                 f"echo '{name}=0' > {SYSCTL_CONF} && sysctl --system (install.sh does this), or an AppArmor "
                 f"profile with `userns,` for the venv's python")


def check_userns_limit(proc_sys: Path = Path("/proc/sys")) -> list[Check]:
    out = []
    v = read_knob("user.max_user_namespaces", proc_sys)
    ok = v is not None and v.isdigit() and int(v) > 0
    out.append(Check("user.max_user_namespaces", ok, "absent: no user namespaces in this kernel" if v is None else v,
                     f"echo 'user.max_user_namespaces=63000' > {SYSCTL_CONF} && sysctl --system"))
    debian = read_knob("kernel.unprivileged_userns_clone", proc_sys)  # Debian's own switch, older kernels
    if debian is not None:
        out.append(Check("kernel.unprivileged_userns_clone", debian != "0", debian,
                         f"echo 'kernel.unprivileged_userns_clone=1' > {SYSCTL_CONF} && sysctl --system"))
    return out


def query_gpus() -> tuple[list[Gpu], str]:
    """The GPUs nvidia-smi lists, or ([], why not)."""
    exe = shutil.which(NVIDIA_SMI_QUERY[0])
    if exe is None:
        return [], "nvidia-smi not found on PATH: no NVIDIA driver"
    try:
        p = subprocess.run([exe, *NVIDIA_SMI_QUERY[1:]], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"nvidia-smi failed: {type(e).__name__}: {e}"
    if p.returncode != 0:
        return [], f"nvidia-smi exited {p.returncode}: {(p.stdout + p.stderr).strip()[-200:]}"
    try:
        return parse_gpus(p.stdout), ""
    except ValueError as e:
        return [], str(e)


def check_gpus(gpus: list[Gpu], why_not: str) -> Check:
    fix = "install the NVIDIA driver (Ubuntu: `ubuntu-drivers install --gpgpu`, then reboot) and check `nvidia-smi`"
    if not gpus:
        return Check("gpus", False, why_not or "nvidia-smi lists no GPU", fix)
    models = sorted({g.name for g in gpus})
    drivers = sorted({g.driver for g in gpus})
    mem = sorted({g.memory_mib for g in gpus if g.memory_mib is not None})
    return Check("gpus", True, f"{len(gpus)} x {' + '.join(models)}, driver {', '.join(drivers)}"
                 + (f", {', '.join(str(m) for m in mem)} MiB" if mem else ""))


def check_python() -> Check:
    v = sys.version_info
    return Check("python", v[:2] >= MIN_PYTHON, f"{v.major}.{v.minor}.{v.micro} at {sys.executable}",
                 f"Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} (Ubuntu 24.04's python3 is 3.12)")


def check_git() -> Check:
    exe = shutil.which("git")
    if exe is None:
        return Check("git", False, "not found on PATH", "apt-get install git")
    p = subprocess.run([exe, "--version"], capture_output=True, text=True)
    return Check("git", p.returncode == 0, p.stdout.strip() or p.stderr.strip(), "reinstall git")


def check_disk(path: Path, min_free_gib: float = MIN_FREE_GIB) -> Check:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    return Check("disk", free >= min_free_gib, f"{free:.1f} GiB free at {probe} (for {path}; need {min_free_gib:g})",
                 f"free space there, or point OPTBOT_HOME at a larger disk")


def check_host(home: Path, min_free_gib: float = MIN_FREE_GIB, need_gpu: bool = True) -> HostReport:
    gpus, why_not = query_gpus()
    sandbox = check_sandbox()
    checks = [sandbox, check_apparmor(sandbox.ok), *check_userns_limit()]
    if need_gpu:
        checks.append(check_gpus(gpus, why_not))
    checks += [check_python(), check_git(), check_disk(home, min_free_gib)]
    return HostReport(checks, gpus)
