"""The runner sandbox's launcher: ``python -I runner/sandbox.py [--ro P]... [--rw P]... [--hide P]...
--root DIR --cwd DIR [--parent PID] [--keep-fd N]... -- COMMAND...`` (started by bot/jobs.run_job;
docs/security.md). PID: the bot's, so a bot that died before the launcher set its parent-death
signal is noticed.

Trusted, standard library only, and done before any job code exists: it runs COMMAND (the runner
child) in new Linux namespaces, as the kernel and util-linux provide them, with no helper binary:

- user: the child is root of a namespace of its own, mapped to the bot's uid, and keeps no
  capability once COMMAND starts (bounding set emptied, securebits locked, no_new_privs), so it can
  neither undo the mounts below nor gain anything by exec;
- mount: a new root on a tmpfs holding only what the job needs, read-only (system and Python
  directories, optbot's runner package, the engine worktree) or read-write (the job's scratch);
  $HOME, optbot's tree, the knowledge repository, the run directory and every other job's outputs
  do not exist in it, and what in /etc only its owner may read is masked. /proc is the namespace's own, its machine-wide knobs read-only, /dev holds the few device nodes a
  job uses (null, random, the NVIDIA nodes), /tmp and /dev/shm are private tmpfs;
- pid: the bot and its ancestors are not in /proc (their environment cannot be read), and when
  COMMAND, the namespace's first process, exits, every process it started is killed by the kernel;
- network and IPC: a network namespace whose only interface is its own loopback, SysV IPC of its own.

The launcher dies with the bot (PR_SET_PDEATHSIG) and COMMAND dies with the launcher, so a killed
bot leaves nothing behind. When a step of the set-up fails it prints one line starting with
SETUP_ERROR_PREFIX to stderr and exits SETUP_FAILED: the bot fails closed on that (bot/sandbox.py).
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import stat
import sys

SETUP_FAILED = 125
SETUP_ERROR_PREFIX = "optbot sandbox: "

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MNT_DETACH, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 2, -100, 0x8000, 1
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 28, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, NO_CAP_AMBIENT_RAISE: each with its lock.
SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
SYSCALLS = {"x86_64": {"pivot_root": 155, "mount_setattr": 442, "capset": 126},
            "aarch64": {"pivot_root": 41, "mount_setattr": 442, "capset": 91}}
LINUX_CAPABILITY_VERSION_3, PR_SET_DUMPABLE = 0x20080522, 4
# Device nodes a job may open: the rest of /dev (disks, consoles, the kernel's memory) stays out.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEVICE_GLOBS = ("nvidia",)
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")  # /dev/nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps/

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(ret: int, what: str) -> int:
    if ret == -1:
        e = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(e)} (errno {errno.errorcode.get(e, e)})")
    return ret


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {src or fstype} on {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _syscall(name: str) -> int:
    nr = SYSCALLS.get(platform.machine(), {}).get(name)
    if nr is None:
        raise SetupError(f"{name}: no syscall number known for {platform.machine()}")
    return nr


def _read_only(path: str, recursive: bool = True) -> None:
    """mount_setattr(2) (Linux 5.12): the mount at path, and every mount below it, read-only."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    _check(_libc.syscall(_syscall("mount_setattr"), AT_FDCWD, path.encode(), AT_RECURSIVE if recursive else 0,
                         ctypes.byref(attr), ctypes.sizeof(attr)), f"make {path} read-only (mount_setattr, Linux >= 5.12)")


def _prctl(option: int, arg: int, what: str) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), what)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mountpoint(target: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()


def _bind(src: str, root: str, read_only: bool) -> None:
    target = root + src
    _mountpoint(target, os.path.isdir(src))
    if read_only:  # with whatever is mounted below it, all read-only
        _mount(src, target, None, MS_BIND | MS_REC)
        _read_only(target)
    else:  # a scratch directory alone: nothing mounted below it comes along
        _mount(src, target, None, MS_BIND)


def build_root(root: str, ro: list[str], rw: list[str], hide: list[str]) -> list[str]:
    """The new root, on a tmpfs at `root`: each path bound at its own path, parents before children
    (so a read-write scratch can sit inside a read-only tree, a read-only engine inside a scratch,
    and a hidden directory, an empty tmpfs, inside a read-only tree). Returns the skeleton tmpfs
    mounts, made read-only once everything is in place (enter_root)."""
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    skeleton = [root]
    for name in os.listdir("/"):  # merged-/usr systems: /bin -> usr/bin and the like
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), f"{root}/{name}")
    order = {"tmp": 0, "hide": 1, "rw": 2, "ro": 3}  # the same path named twice: the later one wins
    entries = [(p, "ro") for p in ro] + [(p, "rw") for p in rw] + [(p, "hide") for p in hide] + [("/tmp", "tmp")]
    for path, how in sorted(entries, key=lambda e: (e[0].rstrip("/").count("/"), order[e[1]])):
        if how == "tmp":  # a private /tmp, before the scratch directories that may lie in the host's
            os.makedirs(root + path, exist_ok=True)
            _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
        elif how == "hide":
            if os.path.isdir(root + path) or not os.path.lexists(root + path):
                os.makedirs(root + path, exist_ok=True)
                _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
                skeleton.append(root + path)
        else:
            _bind(path, root, how == "ro")
    if "/etc" in ro:
        skeleton += _mask_private(root + "/etc")
    _build_dev(root)
    skeleton.append(root + "/dev")
    os.makedirs(root + "/dev/shm", exist_ok=True)
    _mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # The machine-wide knobs of /proc read-only: sysctls, sysrq-trigger, IRQ affinity, bus and fs
    # settings (the mapped root would pass their permission bits, and capabilities are not what
    # guards all of them). The process's own entries stay writable: the CUDA driver writes there
    # (with all of /proc read-only, cudaGetDeviceCount fails with error 304 on the H200).
    for knob in PROC_READ_ONLY:
        path = f"{root}/proc/{knob}"
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _read_only(path)
    return skeleton


def _mask_private(top: str) -> list[str]:
    """Under `top`, what only its owner or group may read (/etc/shadow, ssh host keys, apt or
    package-manager credentials) masked: an empty file bound over each such file, an empty tmpfs
    over each such directory. On a runner that runs as root the child is root mapped to root, and
    would pass those permission bits; it sees what any user of the machine may read."""
    masked = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in list(dirnames):
            path = os.path.join(dirpath, name)
            st = _lstat(path)
            if st is not None and stat.S_ISDIR(st.st_mode) and (st.st_mode & 0o005) != 0o005:
                dirnames.remove(name)
                if _mask(path, "tmpfs", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4k"):
                    masked.append(path)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = _lstat(path)
            if st is not None and stat.S_ISREG(st.st_mode) and not st.st_mode & 0o004:
                _mask(path, "/dev/null", None, MS_BIND)
    return masked


# /etc is the host's, bound live: a file listed by the walk may be gone by its lstat or its mount (a
# package manager, a resolver replacing its file, another job's set-up). Gone, it has nothing left to
# read, so it needs no mask; any other failure still stops the set-up (fail closed).
def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _mask(path: str, src: str, fstype: str | None, flags: int, data: str | None = None) -> bool:
    """Mount over `path`; False when it was removed meanwhile. A path removed and made again between
    the mount and the look (a file replaced by rename) is masked again, a few times at most."""
    for _ in range(8):
        try:
            _mount(src, path, fstype, flags, data)
            return True
        except SetupError:
            if not os.path.lexists(path):
                return False
    _mount(src, path, fstype, flags, data)  # still coming and going: its error stops the set-up
    return True


def _build_dev(root: str) -> None:
    dev = root + "/dev"
    os.makedirs(dev, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=0755,size=64k")
    names = [n for n in DEVICES if os.path.exists("/dev/" + n)]
    names += sorted(n for n in os.listdir("/dev") if n.startswith(DEVICE_GLOBS))
    for name in names:
        src = "/dev/" + name
        is_dir = stat.S_ISDIR(os.stat(src).st_mode)
        _mountpoint(dev + "/" + name, is_dir)
        _mount(src, dev + "/" + name, None, MS_BIND | (MS_REC if is_dir else 0))
    for link, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                     ("stderr", "/proc/self/fd/2")):
        os.symlink(to, f"{dev}/{link}")


def enter_root(root: str, skeleton: list[str]) -> None:
    """pivot_root into `root` and detach the old one: no path leads back to the host's tree."""
    for mount in reversed(skeleton):  # the tmpfs skeleton itself: the binds keep their own flags
        _read_only(mount, recursive=False)
    os.chdir(root)
    _check(_libc.syscall(_syscall("pivot_root"), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")


def loopback_up() -> None:
    """The namespace's own loopback up (SIOCSIFFLAGS): torch.distributed's single-process group (an
    SGLang engine's, say) talks to itself over 127.0.0.1. It reaches nothing of the host's."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def drop_privileges() -> None:
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap, f"drop capability {cap} from the bounding set")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    _prctl(PR_SET_SECUREBITS, SECUREBITS, "lock securebits")
    _prctl(PR_SET_NO_NEW_PRIVS, 1, "set no_new_privs")


def drop_capabilities() -> None:
    """What execve does for the job when it starts a fresh interpreter (securebits NOROOT, no file
    capabilities), done in place for a job that runs in this process (runner/zygote.py): no
    effective, permitted or inheritable capability left, so it can neither remount what
    build_root made read-only nor read other processes' memory; then dumpable again, as a process
    that exec'd is, so it may write its own /proc entries (the CUDA driver does)."""
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}: all zero
    _check(_libc.syscall(_syscall("capset"), ctypes.byref(header), ctypes.byref(data)), "drop every capability (capset)")
    _prctl(PR_SET_DUMPABLE, 1, "make the job dumpable")


def _parse(argv: list[str]) -> tuple[dict, list[str]]:
    if "--" not in argv:
        raise SetupError("usage: sandbox.py [--ro P].. [--rw P].. [--hide P].. --root DIR --cwd DIR [--parent PID] [--keep-fd N].. "
                         "-- COMMAND..")
    i = argv.index("--")
    opts: dict = {"ro": [], "rw": [], "hide": [], "keep-fd": [], "root": None, "cwd": None, "parent": None}
    it = iter(argv[:i])
    for flag in it:
        key = flag.lstrip("-")
        if key not in opts:
            raise SetupError(f"unknown option {flag}")
        val = next(it, None)
        if val is None:
            raise SetupError(f"{flag} needs a value")
        if isinstance(opts[key], list):
            opts[key].append(val)
        else:
            opts[key] = val
    if opts["parent"] is not None and not opts["parent"].isdigit():
        raise SetupError(f"--parent {opts['parent']!r}: expected a process id")
    if not opts["root"] or not opts["cwd"] or not argv[i + 1:]:
        raise SetupError("--root, --cwd and a COMMAND are required")
    for p in opts["ro"] + opts["rw"] + opts["hide"] + [opts["root"], opts["cwd"]]:
        if not os.path.isabs(p) or os.path.realpath(p) != p:
            raise SetupError(f"{p}: a path to bind must be absolute and free of symlinks")
    for p in opts["ro"] + opts["rw"]:
        if opts["root"] == p or opts["root"].startswith(p.rstrip("/") + "/"):
            raise SetupError(f"the new root {opts['root']} lies inside {p}, which is bound into it")
    return opts, argv[i + 1:]


def _die_with_parent(parent: int) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "set the parent-death signal")
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str], run=None) -> int:
    """`run(command)`, where given, starts the job in place of execve (runner/zygote.py: a process
    that has the job's libraries imported already); it must not return."""
    try:
        opts, command = _parse(argv)
        _die_with_parent(int(opts["parent"]) if opts["parent"] else os.getppid())
        uid, gid = os.getuid(), os.getgid()
        _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
               "unshare user, mount, pid, network, IPC and UTS namespaces")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    except (SetupError, OSError) as e:
        print(f"{SETUP_ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        return SETUP_FAILED
    alive_r, alive_w = os.pipe()  # the namespace's init sees EOF here once this launcher is gone
    status_r, status_w = os.pipe()  # init reports the job's wait status here
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        _init(opts, command, alive_r, alive_w, status_w, run)
    os.close(alive_r)
    os.close(status_w)
    for fd in opts["keep-fd"]:  # the job's result channel: only the job may hold it open
        try:
            os.close(int(fd))
        except OSError:
            pass
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(pid, signal.SIGKILL))
    status = _wait(pid)
    reported = os.read(status_r, 16)
    if reported:
        status = int(reported)
    if os.WIFSIGNALED(status):  # the bot reads a signal death as a signal, as without the sandbox
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue
        except ChildProcessError:
            return 1 << 8


def _init(opts: dict, command: list[str], alive_r: int, alive_w: int, status_w: int, run=None) -> None:
    """PID 1 of the new namespace: set the sandbox up, start the job as PID 2 and report how it
    ended. Not the job itself: PID 1 ignores the signals it has no handler for (a job's own
    SIGSEGV-by-kill, SIGTERM), and when it exits, the kernel kills everything the job left behind."""
    try:
        os.close(alive_w)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "set the parent-death signal")
        import select

        if select.select([alive_r], [], [], 0)[0]:  # the launcher died before the line above
            os._exit(1)
        os.close(alive_r)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        skeleton = build_root(opts["root"], opts["ro"], opts["rw"], opts["hide"])
        enter_root(opts["root"], skeleton)
        os.chdir(opts["cwd"])
        loopback_up()
        drop_privileges()
        job = os.fork()
        if job == 0:
            os.close(status_w)
            if run is not None:
                drop_capabilities()
                run(command)
            os.execve(command[0], command, os.environ)
    except (SetupError, OSError) as e:
        print(f"{SETUP_ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        os._exit(SETUP_FAILED)
    for fd in opts["keep-fd"]:
        try:
            os.close(int(fd))
        except OSError:
            pass
    while True:  # reap whatever gets re-parented here, until the job itself ends
        try:
            done, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
        if done == job:
            os.write(status_w, str(status).encode())
            os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
