"""Fixtures of the generation tests: a scratch engine repository (a real git repo, no diffusers) and the
Messages API stand-in."""
from __future__ import annotations

import sys
from pathlib import Path

import git
import pytest

HERE = Path(__file__).resolve().parent
collect_ignore = ["kernels"]  # kernel modules used as data by the variant-search tests
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture
def scratch_engine(tmp_path):
    """A tiny git repository standing in for an engine: src/pkg/mod.py, one commit."""
    from bot.engine import EngineCheckout

    repo_dir = tmp_path / "engine"
    (repo_dir / "src" / "pkg").mkdir(parents=True)
    (repo_dir / "src" / "pkg" / "__init__.py").write_text("")
    (repo_dir / "src" / "pkg" / "mod.py").write_text("def f(x):\n    return x * 2\n")
    repo = git.Repo.init(repo_dir, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "t")
        cw.set_value("user", "email", "t@t")
    repo.git.add("-A")
    repo.git.commit("-qm", "base")
    return EngineCheckout("scratch", repo_dir, repo.head.commit.hexsha, "HEAD", "src")


@pytest.fixture
def api_env(monkeypatch):
    """ANTHROPIC_API_KEY set to a dummy (the stand-in checks presence only); returns a setter for the URL."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-standin")
    monkeypatch.delenv("OPTBOT_AGENT_PRICES", raising=False)

    def point(url: str):
        monkeypatch.setenv("ANTHROPIC_BASE_URL", url)

    return point
