"""Where the knowledge lives (bot/knowledge/location.py): --knowledge-path, then
$OPTBOT_KNOWLEDGE_PATH, then the current directory's repository when it holds kernel_store/, else
$OPTBOT_HOME/knowledge seeded from what ships with optbot; never optbot's own checkout from
elsewhere. Every reader goes through it, and the commands say where."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import git
import pytest

from bot.cli import cli
from bot.knowledge.location import SHIPPED_LESSONS, SHIPPED_STORE, Knowledge, knowledge_of, locate
from bot.paths import REPO_ROOT


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A current directory in no git repository, a fresh OPTBOT_HOME and no $OPTBOT_KNOWLEDGE_PATH."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("OPTBOT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OPTBOT_KNOWLEDGE_PATH", raising=False)
    return tmp_path


def _clone(path: Path, with_store: bool = True) -> Path:
    """A scratch repository: a clone of a knowledge repository (or an engine, without kernel_store/)."""
    (path / ("kernel_store" if with_store else "src") / "x").mkdir(parents=True)
    (path / ("kernel_store" if with_store else "src") / "x" / "f.txt").write_text("x\n")
    repo = git.Repo.init(path, initial_branch="main")
    repo.git.add("-A")
    repo.git.commit("-qm", "init", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                        "GIT_COMMITTER_EMAIL": "t@t"})
    return path.resolve()


def test_the_default_elsewhere_is_a_knowledge_repository_under_optbot_home(elsewhere):
    k = locate()
    home = (elsewhere / "home" / "knowledge").resolve()
    assert k.root == home and k.kernel_store == home / "kernel_store" and k.lessons == home / "lessons"
    assert REPO_ROOT not in (k.root, *k.root.parents)  # never the checkout optbot was installed from
    assert k.why.startswith("default: ") and "created now" in k.why
    # seeded from what ships with optbot, as one commit of a real repository
    shipped = sorted(p.relative_to(SHIPPED_STORE).as_posix() for p in SHIPPED_STORE.rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    assert sorted(p.relative_to(k.kernel_store).as_posix() for p in k.kernel_store.rglob("*") if p.is_file()) == shipped
    assert {p.name for p in k.lessons.glob("*.md")} == {p.name for p in SHIPPED_LESSONS.glob("*.md")}
    repo = k.repo
    assert repo is not None and not repo.is_dirty(untracked_files=True) and len(list(repo.iter_commits())) == 1
    # the second use finds it: not created again, not reseeded
    (k.lessons / "mine.md").write_text("x")
    again = locate()
    assert again.root == home and "created" not in again.why and (again.lessons / "mine.md").is_file()


def test_a_repository_holding_kernel_store_is_the_default_from_inside_it(elsewhere, monkeypatch):
    clone = _clone(elsewhere / "clone")
    (clone / "sub").mkdir()
    monkeypatch.chdir(clone / "sub")
    k = locate()
    assert k.root == clone and k.why == "the current directory's git repository holds kernel_store/"
    assert k.repo is not None and k.repo.working_tree_dir == str(clone)
    assert not (elsewhere / "home" / "knowledge").exists()  # nothing made elsewhere


def test_a_repository_without_kernel_store_is_not_the_knowledge(elsewhere, monkeypatch):
    engine = _clone(elsewhere / "engine", with_store=False)
    monkeypatch.chdir(engine)
    assert locate().root == (elsewhere / "home" / "knowledge").resolve()


def test_the_path_given_wins_then_the_environment(elsewhere, monkeypatch):
    clone = _clone(elsewhere / "clone")
    monkeypatch.chdir(clone)
    other, env = elsewhere / "other", elsewhere / "env"
    monkeypatch.setenv("OPTBOT_KNOWLEDGE_PATH", str(env))
    assert locate(other) == Knowledge(other.resolve(), other.resolve() / "kernel_store", other.resolve() / "lessons",
                                      "--knowledge-path")
    k = locate()
    assert k.root == env.resolve() and k.why == "$OPTBOT_KNOWLEDGE_PATH"
    assert k.repo is None  # not a repository: delivery writes the files into the run directory
    # an optimize run's Options: its recorded knowledge path, else the same default
    assert knowledge_of(SimpleNamespace(knowledge_path=str(other))).root == other.resolve()
    assert knowledge_of(SimpleNamespace(knowledge_path=None)).root == env.resolve()


def test_store_and_lessons_folders_named_one_by_one(elsewhere):
    store, lessons = elsewhere / "s" / "kernel_store", elsewhere / "ls"
    k = locate(store=store)
    assert (k.root, k.kernel_store, k.lessons, k.why) == (store.parent, store, store.parent / "lessons", "--store")
    k = locate(elsewhere / "k", store=store, lessons=lessons)
    assert (k.root, k.kernel_store, k.lessons) == ((elsewhere / "k").resolve(), store, lessons)
    assert k.line() == f"knowledge: {k.root} (--knowledge-path); kernel store {store}; lessons {lessons}"


def test_the_line(tmp_path, capsys):
    k = locate(tmp_path)
    assert k.line() == f"knowledge: {tmp_path.resolve()} (--knowledge-path)"
    assert k.say() is k and capsys.readouterr().err == k.line() + "\n"


def test_optimize_says_where_the_knowledge_is_before_anything_else(cli_runner, tmp_path):
    r = cli_runner.invoke(cli, ["optimize", "no-such-workload", "--knowledge-path", str(tmp_path)])
    assert r.exit_code != 0  # the workload does not exist
    assert r.stderr.splitlines()[0] == f"knowledge: {tmp_path.resolve()} (--knowledge-path)"


def test_a_command_run_elsewhere_never_reads_optbots_own_checkout(tmp_path):
    """The editable-install case: optbot imported from its checkout, run from another directory."""
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OPTBOT_KNOWLEDGE_PATH"}
    env.update(PYTHONPATH=str(REPO_ROOT), OPTBOT_HOME=str(tmp_path / "home"))
    p = subprocess.run([sys.executable, "-m", "bot", "lessons", "list", "--kind", "caveat"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    home = (tmp_path / "home" / "knowledge").resolve()
    assert p.stderr.splitlines()[0].startswith(f"knowledge: {home} (default: {work.resolve()} is in no git repository")
    assert "store-patches-need-distinct-anchors" in p.stdout  # the seed lessons, from the new repository
