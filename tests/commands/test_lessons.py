"""optbot lessons list|show|search (bot/commands/lessons.py), through the real CLI."""
from __future__ import annotations

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
