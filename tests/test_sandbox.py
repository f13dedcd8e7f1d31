"""The runner sandbox, tried as an attacker would (issue 14): engine code imported in a runner child
goes for the bot's secrets, optbot's tree, $HOME, the base outputs, the network and the host's
kernel knobs, and leaves a process behind. Each probe must fail for it; each would succeed without
the sandbox (test_without_the_sandbox_the_same_probe_succeeds shows the probe is real)."""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bot.errors import OptbotError
from bot.jobs import run_job
from bot.paths import REPO_ROOT
from runner.job import Job

SECRET = "ghp_sandboxprobe0123456789"
# Each probe's files are named by its marker: the two probes may run at once (pytest-xdist), and one's
# clean-up must not remove what the other reads, nor leave what the other must not find.
def SENTINEL(marker: str) -> str:  # a file in $HOME, like ~/.git-credentials
    return f".optbot-sandbox-probe-{marker}"


def PRIVATE(marker: str) -> str:  # a root-only file in /etc, like an ssh host key
    return f"/etc/optbot-sandbox-probe-{marker}.key"


def PWNED(marker: str) -> str:  # what the probe tries to write, in optbot's tree, $HOME, ...
    return f"pwned-by-probe-{marker}"

PROBE = '''
import json, os, socket, subprocess, sys
secret, port = {secret!r}, {port}
found = {{}}

def read(p):
    try:
        with open(p, "rb") as f:
            return f.read()
    except OSError as e:
        return None

# 1. the bot's environment (the bot is this process's parent without the sandbox), or any process's
found["parent environ"] = read(f"/proc/{{os.getppid()}}/environ")
found["secret in some environ"] = [d for d in os.listdir("/proc") if d.isdigit()
                                   and secret.encode() in (read(f"/proc/{{d}}/environ") or b"")]
found["secret in own environment"] = [k for k, v in os.environ.items() if secret in v]
# 2. writes outside the scratch
found["writes"] = []
for p in {targets!r}:
    try:
        with open(p, "w") as f:
            f.write("pwned")
        found["writes"].append(p)
    except OSError:
        pass
# the host's kernel knobs: opened for writing and closed unwritten (without the sandbox, as root,
# the open succeeds; a write would change the machine the test runs on)
for p in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"):
    try:
        os.close(os.open(p, os.O_WRONLY))
        found["writes"].append(p)
    except OSError:
        pass
# 3. reads the bot keeps for itself, and the machine's root-only files
found["root-only files"] = [p for p in ("/etc/shadow", {private!r}) if read(p)]
found["base output"] = read({base_output!r})
found["home file"] = read({sentinel!r})
found["optbot tree"] = [n for n in ("bot", "kernel_store", "lessons") if os.path.exists(os.path.join({repo!r}, n))]
# 4. the network: a server the test listens on, on the host's loopback
try:
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
    found["connected"] = True
except OSError:
    found["connected"] = False
# 5. capabilities
found["CapEff"] = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("CapEff")][0]
# 6. a process in a session of its own, to outlive the job
subprocess.Popen(["setsid", "sleep", "{marker}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, start_new_session=True)
# 7. an engine's own cache under a literal ~ (SGLang writes its JIT kernels to ~/.cache/sglang/jit):
# it must work, inside the job's compile cache, never in the real $HOME
try:
    d = os.path.join(os.path.expanduser("~"), ".cache", "probe-jit")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "kernel.so"), "w") as f:
        f.write("built")
    found["home cache"] = os.path.expanduser("~")
except OSError as e:
    found["home cache"] = f"failed: {{e}}"
with open("probe.json", "w") as f:
    json.dump({{k: (v.decode("latin1") if isinstance(v, bytes) else v) for k, v in found.items()}}, f)
'''


def _probe_job(tmp_path: Path, server_port: int, marker: str) -> tuple[Job, Path]:
    home = Path.home()
    base = tmp_path / "run" / "base"
    base.mkdir(parents=True)
    (base / "outputs.pt").write_text("the reference the candidate must not see")
    engine = tmp_path / "eng"
    (engine / "probeengine").mkdir(parents=True)
    (engine / "probeengine" / "__init__.py").write_text("")
    pwned = PWNED(marker)
    targets = [str(REPO_ROOT / pwned), str(home / pwned), str(base / pwned), str(engine / pwned), f"/usr/{pwned}"]
    (engine / "probeengine" / "model.py").write_text(PROBE.format(
        secret=SECRET, port=server_port, targets=targets, base_output=str(base / "outputs.pt"),
        sentinel=str(home / SENTINEL(marker)), repo=str(REPO_ROOT), marker=marker, private=PRIVATE(marker)))
    job = Job(kind="step", workload={"presets": {"tiny": {"config": {}}}, "family": "flux2"}, preset="tiny",
              device="cpu", dtype="float32", engine_root=str(engine), engine_sha="probe", model_class="probeengine.model.M",
              shapes=[])
    return job, tmp_path / "run" / "candidate"


def _leftover(marker: str) -> list[str]:
    out = []
    for d in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read()
        except OSError:
            continue
        if marker.encode() in cmd and b"sleep" in cmd:
            out.append(d)
    return out


def _run_probe(tmp_path, marker: str, sandbox: str = "on") -> dict:
    """Run the probe job from a bot process (a subprocess of the test) whose environment, from its
    start, holds the secret, as a runner's bot holds GITHUB_TOKEN."""
    import pickle

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    (Path.home() / SENTINEL(marker)).write_text(SECRET)
    private = Path(PRIVATE(marker))
    if os.access("/etc", os.W_OK):
        private.write_text(SECRET)
        private.chmod(0o600)
    try:
        job, work = _probe_job(tmp_path, server.getsockname()[1], marker)
        (tmp_path / "job.pkl").write_bytes(pickle.dumps(job))
        bot = subprocess.run([sys.executable, "-c", "import pickle, sys; from pathlib import Path; from bot.jobs import run_job; "
                              f"out = run_job(pickle.loads(Path({str(tmp_path / 'job.pkl')!r}).read_bytes()), "
                              f"Path({str(work)!r}), timeout_s=300, name='candidate'); print(out.reason())"],
                             env={**os.environ, "GITHUB_TOKEN": SECRET, "OPTBOT_SANDBOX": sandbox,
                                  "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=400)
    finally:
        server.close()
        (Path.home() / SENTINEL(marker)).unlink(missing_ok=True)
        if os.access("/etc", os.W_OK):
            private.unlink(missing_ok=True)
    assert (work / "probe.json").exists(), bot.stdout + bot.stderr  # the engine module ran, in the child
    return json.loads((work / "probe.json").read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux namespaces")
def test_generated_code_reaches_no_secret_and_writes_nowhere(tmp_path):
    marker = f"{os.getpid()}.{len(str(tmp_path))}7"
    found = _run_probe(tmp_path, marker)
    try:
        assert found["parent environ"] is None, found
        assert found["secret in some environ"] == [] and found["secret in own environment"] == [], found
        assert found["writes"] == [], found
        assert not (REPO_ROOT / PWNED(marker)).exists() and not (Path.home() / PWNED(marker)).exists()
        assert found["base output"] is None, found
        assert found["home file"] is None, found  # only the interpreter's own tree under $HOME is visible
        assert found["root-only files"] == [], found
        assert found["optbot tree"] == [], found
        from bot.sandbox import compile_cache
        assert found["home cache"] == str(compile_cache("probe") / "home"), found  # writable, not the real one
        assert (compile_cache("probe") / "home" / ".cache" / "probe-jit" / "kernel.so").read_text() == "built"
        assert found["connected"] is False, found
        assert int(found["CapEff"], 16) == 0, found
        assert _leftover(marker) == []  # the session-leader grandchild died with the job
    finally:
        for p in (REPO_ROOT / PWNED(marker), Path.home() / PWNED(marker)):
            p.unlink(missing_ok=True)
        for pid in _leftover(marker):
            os.kill(int(pid), 9)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux namespaces")
def test_without_the_sandbox_the_same_probe_succeeds(tmp_path):
    """OPTBOT_SANDBOX=off (the operator's opt-out) and the probe reaches what the sandbox keeps from it:
    the probes above are real attacks, not tests that cannot fail."""
    marker = f"{os.getpid()}.{len(str(tmp_path))}8"
    try:
        found = _run_probe(tmp_path, marker, sandbox="off")
        # the bot's environment, found by walking /proc (the job's parent is the runner's zygote,
        # which never held the secret: bot/jobs.child_env)
        assert found["secret in some environ"], found
        assert SECRET not in (found["parent environ"] or ""), found
        assert str(REPO_ROOT / PWNED(marker)) in found["writes"], found
        assert found["base output"] == "the reference the candidate must not see"
        assert found["home file"] == SECRET
        if os.geteuid() == 0:
            assert PRIVATE(marker) in found["root-only files"], found
        assert found["connected"] is True
        assert _leftover(marker)  # a session of its own outlives the job without the pid namespace
    finally:
        (REPO_ROOT / PWNED(marker)).unlink(missing_ok=True)
        (Path.home() / PWNED(marker)).unlink(missing_ok=True)
        for pid in _leftover(marker):
            os.kill(int(pid), 9)


def test_a_bad_sandbox_setting_is_a_clear_error(monkeypatch, tmp_path):
    from bot import sandbox

    monkeypatch.setenv("OPTBOT_SANDBOX", "maybe")
    with pytest.raises(OptbotError, match=r"OPTBOT_SANDBOX='maybe': expected 'on' .* or 'off'"):
        sandbox.enabled()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux namespaces")
def test_no_sandbox_no_run(tmp_path, diffusers_engine):
    """Fail closed: where user namespaces cannot be made (here: inside a user namespace whose limit
    of nested ones is 0), `optbot profile` stops at its first job with one clear line and exit 2,
    no traceback and no job started; OPTBOT_SANDBOX=off is the operator's way past it."""
    cmd = [sys.executable, "-m", "bot", "profile", "flux2", "--preset", "tiny", "--device", "cpu"]
    inner = "echo 0 > /proc/sys/user/max_user_namespaces && exec " + " ".join(shlex.quote(c) for c in cmd)
    env = {**os.environ, "OPTBOT_RUNS_DIR": str(tmp_path / "runs")}
    p = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", inner], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300, env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert line and line[0].startswith("error: the runner sandbox cannot be set up on this machine: unshare user, "
                                       "mount, pid, network, IPC and UTS namespaces: "), p.stderr
    assert "set OPTBOT_SANDBOX=off" in line[0] and "docs/runner.md" in line[0]
    assert not list((tmp_path / "runs").glob("*/*.log")), "a job ran"


def test_a_symlink_left_in_scratch_does_not_redirect_the_bot(tmp_path):
    """A child could leave a symlink where the bot writes next (the job's log, or a directory the next
    job uses as scratch): the bot removes a symlinked file instead of following it, and refuses a
    scratch directory reached through one."""
    from bot.sandbox import SCRATCH

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    SCRATCH.add(str(scratch))
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (scratch / "job.log").symlink_to(precious)
    job = Job(kind="probe", workload={}, preset="tiny", device="cpu", dtype="float32", engine_root=str(tmp_path),
              engine_sha="x", model_class="m.C", shapes=[])
    out = run_job(job, scratch, timeout_s=120)
    assert out.ok and precious.read_text() == "keep me" and not (scratch / "job.log").is_symlink()
    (scratch / "next").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OptbotError, match="is a symlink inside a directory a runner child could write"):
        run_job(job, scratch / "next" / "timing", timeout_s=120)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.access("/etc", os.W_OK),
                    reason="the sandbox is Linux namespaces; the churn needs a writable /etc (root)")
def test_a_root_only_file_that_comes_and_goes_in_etc_does_not_stop_a_job():
    """The sandbox masks /etc's root-only files at set-up (runner/sandbox._mask_private: lists /etc,
    then binds /dev/null over each). A file removed between the listing and the bind (a package
    manager, a resolver rewriting its file, another job's test fixture) must not fail the set-up:
    once a job's set-up failed that way in the suite (exit 125, the zygote test) while the probe above
    removed its key from /etc. Here a thread keeps creating and removing root-only files in /etc while
    sandboxed processes start: every one starts."""
    import tempfile
    import threading
    import time

    from bot import sandbox

    stop = threading.Event()
    names = [f"/etc/optbot-churn-{os.getpid()}-{i}.key" for i in range(8)]

    def churn():
        while not stop.is_set():
            for n in names:
                fd = os.open(n, os.O_CREAT | os.O_WRONLY, 0o600)
                os.close(fd)
            for n in names:
                os.unlink(n)

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    codes = []
    try:
        deadline = time.monotonic() + 20
        while len(codes) < 12 and time.monotonic() < deadline:
            with tempfile.TemporaryDirectory(prefix="optbot-churn-") as tmp, \
                    tempfile.TemporaryDirectory(prefix="optbot-root-", dir=sandbox.optbot_home()) as root:
                cmd = sandbox._launcher(Path(root), tmp, sandbox._system_and_python(), [tmp], [], ()) + \
                    [sys.executable, "-I", "-c", "pass"]
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                                   env={"PATH": os.environ.get("PATH", "")})
                codes.append((p.returncode, p.stderr.strip()[-300:]))
    finally:
        stop.set()
        t.join(10)
        for n in names:
            Path(n).unlink(missing_ok=True)
    assert len(codes) >= 5 and all(rc == 0 for rc, _ in codes), codes
