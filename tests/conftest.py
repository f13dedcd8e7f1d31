"""Shared fixtures. Tests run on CPU, on the tiny presets, with real git repositories and real
runner subprocesses.

OPTBOT_HOME for the test session is $OPTBOT_TEST_HOME, else ~/.cache/optbot-test (a folder of it per
pytest-xdist worker): the diffusers source distribution is downloaded (or copied from
~/.cache/optbot/downloads) once and the engine repository materialized once, then reused across
sessions.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHARED_TEST_HOME = Path(os.environ.get("OPTBOT_TEST_HOME", Path.home() / ".cache" / "optbot-test"))
# Under pytest-xdist (addopts in pyproject.toml) each worker has a home of its own, $OPTBOT_TEST_HOME/
# workers/gwN (gwN.1, ... while another session holds it): engine repositories, worktrees, compile
# caches and runs are never shared by two processes (no two `git worktree add` on one repository, no
# worktree name taken by the other).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_HELD: list = []  # the open lock file of the home this process claimed


def _claim(home: Path) -> Path:
    """`home`, else the first of home.1, home.2, ... that no other live test session holds (an flock
    kept for this process's life). A second session at once (a few tests run beside the full suite)
    gets a home of its own: sharing one, the first to finish pruned the other's worktrees from under
    its running tests (2026-12-06: 22, then 336 failures)."""
    import fcntl

    for i in range(32):
        h = home if i == 0 else home.with_name(f"{home.name}.{i}")
        h.mkdir(parents=True, exist_ok=True)
        f = open(h / ".session.lock", "a")  # noqa: SIM115 - held open on purpose: the lock lives with it
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        _HELD.append(f)
        return h
    raise RuntimeError(f"32 test sessions hold {home} and its siblings: is a suite stuck?")


TEST_HOME = _claim(SHARED_TEST_HOME / "workers" / _WORKER if _WORKER else SHARED_TEST_HOME)
os.environ["OPTBOT_HOME"] = str(TEST_HOME)
os.environ.setdefault("OPTBOT_RUNS_DIR", str(TEST_HOME / "runs"))
if _WORKER and "OMP_NUM_THREADS" not in os.environ:
    # each worker's torch, and each runner child's (bot/jobs.py passes OMP_NUM_THREADS on), takes its
    # share of the cores: with both workers' children on every core the suite took 1.4x as long
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // _workers))


def _seed_downloads() -> None:
    """Release archives (diffusers sdist, sglang wheel) already in the user's cache, or in the shared
    test home (for a worker's home), are copied into the test home instead of being downloaded again."""
    dl = TEST_HOME / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    for src in (Path.home() / ".cache" / "optbot" / "downloads", SHARED_TEST_HOME / "downloads"):
        if src.is_dir() and src != dl:
            for f in [*src.glob("*.tar.gz"), *src.glob("*.whl")]:
                if not (dl / f.name).exists():
                    shutil.copy(f, dl / f.name)


_seed_downloads()


def pytest_sessionstart(session):
    # worktrees of engines a killed session's tests made in their temporary folders, since deleted
    from bot.engine import prune_orphan_worktrees

    prune_orphan_worktrees(TEST_HOME)


def pytest_sessionfinish(session, exitstatus):
    # what this worker's tests checked out (tests call the steps in-process, not through bot/cli.py,
    # whose exit releases them): 31 GB per worker's home after a few weeks of suites otherwise
    from bot.engine import prune_orphan_worktrees, release_worktrees

    release_worktrees()
    if _WORKER:  # a worker's home is its own; what a killed test child left there goes too
        prune_orphan_worktrees(TEST_HOME, all_but_base=True)
        for repo in (TEST_HOME / "engines").glob("*/.git"):
            subprocess.run(["git", "-C", str(repo.parent), "worktree", "prune"], capture_output=True)
    else:
        prune_orphan_worktrees(TEST_HOME)


# The heaviest test files, heaviest first: each is one module fixture or a few end-to-end runs of
# runner children (summed durations of `python -m pytest --durations=80`, 2-core development machine,
# 2026-12-05). xdist hands whole files to its two workers in collection order (`--dist loadfile
# --no-loadscope-reorder`, pyproject.toml); started last, one of these kept a single worker busy for
# minutes after the other had finished.
HEAVY_FIRST = (
    "tests/run/test_fanout.py", "tests/validate/test_adversarial.py", "tests/kernel_store/test_compile_blocks.py",
    "tests/generate/test_replay.py", "tests/sglang/test_sglang_models.py", "tests/kernel_store/test_tiny_models.py",
    "tests/run/test_base_cache.py", "tests/validate/test_modes.py", "tests/generate/test_template.py",
    "tests/generate/test_compile_region.py", "tests/commands/test_optimize.py", "tests/commands/test_store.py",
    "tests/test_bench.py", "tests/test_cli_profile.py", "tests/kernel_store/test_kernels.py", "tests/test_harness.py",
    "tests/validate/test_speed.py", "tests/kernel_store/test_host_copies.py", "tests/analyze/test_new_models.py",
    "tests/generate/agent/test_parallel.py", "tests/analyze/test_workloads.py", "tests/validate/test_ablate.py",
    "tests/test_quant.py", "tests/knowledge/test_upkeep.py",
)


_HEAVY_RANK = {path: i for i, path in enumerate(HEAVY_FIRST)}


def _heavy_rank(item) -> int:
    return _HEAVY_RANK.get(item.nodeid.split("::", 1)[0], len(HEAVY_FIRST))


def pytest_collection_modifyitems(config, items):
    """The heaviest files first (HEAVY_FIRST; a stable sort, so each file's own order stays). Tests
    marked gpu are skipped, with the reason said, where torch sees no CUDA device."""
    items.sort(key=_heavy_rank)
    if not any("gpu" in it.keywords for it in items):
        return
    from bot.target import cuda_available

    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (runs on the H200 via benchmarks/h200.sh)")
    for it in items:
        if "gpu" in it.keywords:
            it.add_marker(skip)


@pytest.fixture(scope="session")
def diffusers_engine():
    """The default engine: the diffusers 0.42.1 repository, materialized once."""
    from bot.engine import checkout_engine

    return checkout_engine("pypi-sdist:diffusers==0.42.1", None, "src", "diffusers")


@pytest.fixture(scope="session")
def base_worktree(diffusers_engine):
    from bot.engine import add_worktree

    return add_worktree(diffusers_engine, f"test-base-{diffusers_engine.base_sha[:12]}")


@pytest.fixture
def cli_runner():
    from click.testing import CliRunner

    return CliRunner()


# ------------------------------------------------------------------------------------------------
# a GitHub stand-in, a small engine repository with a bare "GitHub" remote, and a knowledge
# repository with its bare remote: the delivery and run-machinery tests (tests/deliver, tests/run)

ENGINE_SRC = '''"""A stand-in engine module (the forge tests never import it)."""


def swiglu(x, gate):
    return x * gate


def qkv(x, wq, wk, wv):
    return x @ wq, x @ wk, x @ wv
'''


@pytest.fixture
def standin():
    from tests.deliver.github_standin import GitHubStandIn

    s = GitHubStandIn().start()
    yield s
    s.stop()


@pytest.fixture
def forge_env(tmp_path, standin, monkeypatch):
    """Engine + knowledge repositories, their bare remotes registered in the stand-in, env set."""
    import git

    from tests.repos import init_repo

    engine = init_repo(tmp_path / "engine", {"src/engine_mod.py": ENGINE_SRC})
    engine_bare = tmp_path / "engine.git"
    git.Repo.init(engine_bare, bare=True, initial_branch="main")
    engine.create_remote("origin", str(engine_bare))
    engine.git.push("origin", "main")
    know = init_repo(tmp_path / "knowledge", {"lessons/README.md": "lessons\n", "kernel_store/README.md": "store\n"})
    know_bare = tmp_path / "knowledge.git"
    git.Repo.init(know_bare, bare=True, initial_branch="main")
    know.create_remote("origin", str(know_bare))
    know.git.push("origin", "main")
    standin.add_repo("team/engine", engine_bare)
    standin.add_repo("team/optbot", know_bare)
    trig = standin.add_pull_for_trigger("team/engine")
    comment = standin.add_comment("team/engine", trig, "/optimize flux2")
    monkeypatch.setenv("OPTBOT_GITHUB_TOKEN", "test-token")
    monkeypatch.setenv("OPTBOT_GITHUB_API_URL", standin.base)
    monkeypatch.setenv("OPTBOT_GITHUB_WRITE_DELAY", "0")
    monkeypatch.setenv("OPTBOT_GITHUB_MAX_WAIT", "3")
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("OPTBOT_ABORT_AFTER", raising=False)
    return {"engine": engine, "engine_bare": engine_bare, "knowledge": know, "knowledge_bare": know_bare,
            "trigger_pr": trig, "trigger_comment": comment, "tmp": tmp_path}


@pytest.fixture
def pr(forge_env, standin):
    """The stand-in's pull request #1 of team/engine, its head at the engine's commit, and a
    maintainer with write permission (the /optimize comment tests)."""
    env = forge_env
    env["sha"] = env["engine"].head.commit.hexsha
    standin.set_head_sha("team/engine", env["trigger_pr"], env["sha"])
    standin.set_permission("team/engine", "maintainer", "write")
    return env
