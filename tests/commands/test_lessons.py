"""optbot lessons list|show|search (bot/commands/lessons.py), through the real CLI."""
from __future__ import annotations

from pathlib import Path

from bot.cli import cli
from bot.knowledge.location import SHIPPED_STORE

ROOT = SHIPPED_STORE.parent


def test_lessons_commands(cli_runner):
    k = ["--knowledge-path", str(ROOT)]
    r = cli_runner.invoke(cli, ["lessons", "list", "--kind", "caveat", *k])
    assert r.exit_code == 0 and "store-patches-need-distinct-anchors" in r.stdout
    assert "fallback-must-replay-the-unfused-ops" not in r.stdout
    r = cli_runner.invoke(cli, ["lessons", "show", "all-ones-mask-needs-a-host-read", *k])
    assert r.exit_code == 0 and "kind: caveat" in r.stdout
    r = cli_runner.invoke(cli, ["lessons", "search", "mask", "--pattern", "attention-waste", "--engine", "diffusers", *k])
    assert r.exit_code == 0 and r.stdout.splitlines()[0].startswith("all-ones-mask-needs-a-host-read")
    assert r.stderr == f"knowledge: {ROOT} (--knowledge-path)\n"


def test_lessons_dir_names_the_folder(cli_runner, tmp_path):
    (tmp_path / "ls").mkdir()
    r = cli_runner.invoke(cli, ["lessons", "list", "--lessons-dir", str(tmp_path / "ls"), "--knowledge-path", str(ROOT)])
    assert r.exit_code == 0 and r.stdout == f"no lessons in {tmp_path / 'ls'}\n"
    assert r.stderr == f"knowledge: {ROOT} (--knowledge-path); lessons {tmp_path / 'ls'}\n"


def test_review_needs_the_engine_repository(tmp_path, monkeypatch):
    """--repo (or $OPTBOT_ENGINE_REPO) is required: a missing one is click's usage error, exit 2,
    before any token or API is asked (an explicit default=None once made click skip the check)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OPTBOT_ENGINE_REPO", "OPTBOT_GITHUB_TOKEN", "GITHUB_TOKEN")}
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-m", "bot", "lessons", "review"], capture_output=True, text=True,
                       cwd=tmp_path, env={**env, "PYTHONPATH": str(root)}, timeout=120)
    assert p.returncode == 2 and "Missing option '--repo'" in p.stderr and "OPTBOT_ENGINE_REPO" in p.stderr, p.stderr
