"""Fixtures of the agent tests: a scratch engine repository (a real git repo, no diffusers), a Target
over it, an agent task, and the Messages API stand-in (messages_standin.py, importable from here)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.repos import init_repo

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture
def scratch_engine(tmp_path):
    """A tiny git repository standing in for an engine: src/pkg/mod.py, one commit."""
    from bot.engine import EngineCheckout

    repo_dir = tmp_path / "engine"
    repo = init_repo(repo_dir, {"src/pkg/__init__.py": "", "src/pkg/mod.py": "def f(x):\n    return x * 2\n"})
    return EngineCheckout("scratch", repo_dir, repo.head.commit.hexsha, "HEAD", "src")


@pytest.fixture
def scratch_target(scratch_engine):
    """The tiny FLUX.2 workload over the scratch engine: its model class pkg.mod.M does not exist, so a
    validation of it gets as far as importing the engine's module, then is rejected as crashed."""
    from bot.target import Target
    from bot.workload import load_workload

    wl = load_workload("flux2")
    return Target(wl, "scratch", "pkg.mod.M", scratch_engine, "tiny", "cpu", wl.dtype_for("cpu"))


@pytest.fixture
def make_task(scratch_target, tmp_path):
    """make_task(kind=...) -> an AgentTask on the scratch engine, run directory under tmp_path."""
    from bot.generate.agent.loop import AgentTask
    from bot.generate.agent.validation import ValidationContext

    def make(kind="fuse-elementwise-chain"):
        run = tmp_path / "run"
        return AgentTask(run_id="test-run", run_dir=run, checkout=scratch_target.checkout,
                         vctx=ValidationContext.from_target(scratch_target, run), opportunity={"id": "opp-1", "kind": kind},
                         engine="diffusers", hardware="cpu", lessons_dir=tmp_path / "lessons", store_dir=tmp_path / "store")

    return make


@pytest.fixture
def api_env(monkeypatch):
    """ANTHROPIC_API_KEY set to a dummy (the stand-in checks presence only); returns a setter for the URL."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-standin")
    monkeypatch.delenv("OPTBOT_AGENT_PRICES", raising=False)

    def point(url: str):
        monkeypatch.setenv("ANTHROPIC_BASE_URL", url)

    return point
