"""Engine repositories and worktrees, on real git repositories."""
from __future__ import annotations

import shutil

import git
import pytest

from bot import engine as eng
from bot.errors import EngineError


def test_default_engine_is_one_deterministic_upstream_commit(diffusers_engine):
    repo = diffusers_engine.repo
    root = repo.git.rev_list("--max-parents=0", "HEAD").split()
    assert len(root) == 1
    c = repo.commit(root[0])
    assert c.message.strip() == "upstream diffusers 0.42.1"
    assert c.author.name == "optbot" and c.authored_datetime.year == 2000
    assert (diffusers_engine.repo_path / "src/diffusers/models/transformers/transformer_flux2.py").is_file()
    assert not (diffusers_engine.repo_path / "PKG-INFO").exists()


@pytest.mark.slow
def test_same_sha_on_a_fresh_home(diffusers_engine, tmp_path, monkeypatch):
    """A second machine (a fresh OPTBOT_HOME) materializes the very same commit."""
    home = tmp_path / "home"
    (home / "downloads").mkdir(parents=True)
    for f in (eng.optbot_home() / "downloads").glob("diffusers-0.42.1*"):
        shutil.copy(f, home / "downloads" / f.name)
    monkeypatch.setenv("OPTBOT_HOME", str(home))
    other = eng.checkout_engine("pypi-sdist:diffusers==0.42.1", None, "src")
    assert other.repo_path != diffusers_engine.repo_path
    assert other.base_sha == diffusers_engine.base_sha


def _small_repo(path):
    repo = git.Repo.init(path, initial_branch="main")
    (path / "src").mkdir()
    (path / "src" / "m.py").write_text("X = 1\n")
    repo.index.add(["src/m.py"])
    repo.index.commit("one", author=eng.BOT_ACTOR, committer=eng.BOT_ACTOR)
    (path / "src" / "m.py").write_text("X = 2\n")
    repo.index.add(["src/m.py"])
    repo.index.commit("two", author=eng.BOT_ACTOR, committer=eng.BOT_ACTOR)
    repo.create_tag("v2")
    return repo


def test_path_engine_with_ref(tmp_path):
    repo = _small_repo(tmp_path / "fork")
    co = eng.checkout_engine(str(tmp_path / "fork"), "HEAD~1", "src")
    assert co.base_sha == repo.commit("HEAD~1").hexsha
    assert eng.checkout_engine(str(tmp_path / "fork"), "v2", "src").base_sha == repo.head.commit.hexsha


def test_missing_ref_is_a_clear_error(tmp_path):
    _small_repo(tmp_path / "fork")
    with pytest.raises(EngineError, match="ref 'no-such-branch' not found"):
        eng.checkout_engine(str(tmp_path / "fork"), "no-such-branch", "src")


def test_not_a_repo_and_missing_path(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(EngineError, match="not a git repository"):
        eng.checkout_engine(str(tmp_path / "plain"), None, "src")
    with pytest.raises(EngineError, match="no such path"):
        eng.checkout_engine(str(tmp_path / "nowhere"), None, "src")


def test_url_engine_is_cloned_once(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBOT_HOME", str(tmp_path / "home"))
    _small_repo(tmp_path / "fork")
    bare = tmp_path / "fork.git"
    git.Repo(tmp_path / "fork").clone(bare, bare=True)
    url = f"file://{bare}"
    a = eng.checkout_engine(url, "v2", "src")
    b = eng.checkout_engine(url, None, "src")
    assert a.repo_path == b.repo_path and str(a.repo_path).startswith(str(tmp_path / "home"))
    assert a.base_sha == b.base_sha


def test_worktrees_are_isolated_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBOT_HOME", str(tmp_path / "home"))
    repo = _small_repo(tmp_path / "fork")
    co = eng.checkout_engine(str(tmp_path / "fork"), "HEAD~1", "src")
    wt = eng.add_worktree(co, "cand-1")
    assert (wt / "src" / "m.py").read_text() == "X = 1\n"
    assert eng.add_worktree(co, "cand-1") == wt  # clean and at the same commit: reused
    (wt / "src" / "m.py").write_text("X = 3\n")
    wt2 = eng.add_worktree(co, "cand-1")  # dirty: re-created clean
    assert (wt2 / "src" / "m.py").read_text() == "X = 1\n"
    assert (tmp_path / "fork" / "src" / "m.py").read_text() == "X = 2\n"  # base checkout untouched
    eng.remove_worktree(co, wt2)
    assert not wt2.exists()
    assert str(wt2) not in repo.git.worktree("list")


def test_a_worktree_left_locked_by_a_killed_add_is_taken_over(tmp_path, monkeypatch):
    """`git worktree add` locks the entry while it checks out. A run killed then (a timeout, a
    cancelled job) leaves a missing-but-locked entry in the shared $OPTBOT_HOME, and every later
    add of that name failed. The same holds for a locked worktree whose directory still exists."""
    import shutil

    monkeypatch.setenv("OPTBOT_HOME", str(tmp_path / "home"))
    _small_repo(tmp_path / "fork")
    co = eng.checkout_engine(str(tmp_path / "fork"), "HEAD~1", "src")
    wt = eng.add_worktree(co, "cand-killed")
    co.repo.git.worktree("lock", "--reason", "initializing", str(wt))
    shutil.rmtree(wt)  # what a kill during checkout leaves: the entry, its lock, no directory
    again = eng.add_worktree(co, "cand-killed")
    assert again == wt and (again / "src" / "m.py").read_text() == "X = 1\n"

    co.repo.git.worktree("lock", str(wt))
    (wt / "src" / "m.py").write_text("X = 9\n")  # dirty and locked: re-created clean
    assert (eng.add_worktree(co, "cand-killed") / "src" / "m.py").read_text() == "X = 1\n"
    co.repo.git.worktree("lock", str(wt))
    eng.remove_worktree(co, wt)
    assert not wt.exists() and str(wt) not in co.repo.git.worktree("list")


def test_a_commands_worktrees_go_when_it_ends_and_orphans_are_pruned(tmp_path, monkeypatch):
    """A command removes the worktrees it added (bot/cli.py calls release_worktrees on exit), base
    worktrees excepted; the commits stay. Worktrees whose repository is gone are pruned."""
    import os
    import pathlib
    import subprocess
    import sys

    monkeypatch.setenv("OPTBOT_HOME", str(tmp_path / "home"))
    # this process's own record, apart from what earlier tests of the worker added: releasing those
    # would remove the session fixtures' worktrees (test-base-*) under the tests that follow
    monkeypatch.setattr(eng, "_ADDED", {})
    _small_repo(tmp_path / "fork")
    co = eng.checkout_engine(str(tmp_path / "fork"), "HEAD~1", "src")
    kept_before = eng.add_worktree(co, "cand-earlier")
    eng._ADDED.clear()  # as if an earlier process made it: this one does not remove it
    base = eng.add_worktree(co, f"base-{co.base_sha[:12]}")
    cand = eng.add_worktree(co, "cand-2", "HEAD")
    gone = eng.add_worktree(co, "cand-3")
    eng.remove_worktree(co, gone)
    assert eng.release_worktrees() == 1
    assert not cand.exists() and base.exists() and kept_before.exists()
    assert str(cand) not in co.repo.git.worktree("list") and co.repo.commit("HEAD")  # the commit stays
    assert eng.release_worktrees() == 0
    # one a killed process left, reused by this one, is this one's to remove
    left = eng.add_worktree(co, "cand-left")
    eng._ADDED.clear()
    assert eng.add_worktree(co, "cand-left") == left and eng.release_worktrees() == 1 and not left.exists()

    # through the CLI's main, in a child: a command's candidate worktree goes at its exit, its base stays
    code = ("import sys; from bot import engine as e; from bot.cli import main\n"
            "co = e.checkout_engine(sys.argv[1], 'HEAD~1', 'src')\n"
            "import click\n"
            "@click.command('mk')\n"
            "def mk():\n"
            "    print(e.add_worktree(co, 'patch-x'), e.add_worktree(co, 'base-' + co.base_sha[:12]))\n"
            "from bot.cli import cli; cli.add_command(mk)\n"
            "main(['mk'])\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fork")], capture_output=True, text=True,
                       env={**os.environ, "OPTBOT_HOME": str(tmp_path / "home")}, timeout=120)
    assert p.returncode == 0, p.stderr
    made, made_base = (pathlib.Path(x) for x in p.stdout.split())
    assert not made.exists() and made_base.exists()

    # an engine repository deleted (a test's temporary engine): its worktrees are orphans
    _small_repo(tmp_path / "tmp-engine")
    co2 = eng.checkout_engine(str(tmp_path / "tmp-engine"), "HEAD~1", "src")
    orphan = eng.add_worktree(co2, "cand-orphan")
    shutil.rmtree(tmp_path / "tmp-engine")
    assert eng.prune_orphan_worktrees(tmp_path / "home") == 1
    assert not orphan.exists() and not orphan.parent.exists()
    assert base.exists() and kept_before.exists()  # live repository: untouched
    # a home no other process uses (a test worker's): all but the base checkouts
    assert eng.prune_orphan_worktrees(tmp_path / "home", all_but_base=True) == 1
    assert base.exists() and not kept_before.exists()


def test_uncommitted_changes_in_a_path_engine_are_named(tmp_path, capsys):
    """Runs check out a commit: edits left in the fork's working tree (a patch applied but not
    committed) would not run, silently; the checkout says so. A clean tree, an explicit --ref, or an
    untracked file outside the import root says nothing."""
    repo = _small_repo(tmp_path / "fork")
    (tmp_path / "fork" / "notes.txt").write_text("outside the import root\n")
    co = eng.checkout_engine(str(tmp_path / "fork"), None, "src")
    assert co.base_sha == repo.head.commit.hexsha and "uncommitted" not in capsys.readouterr().err
    (tmp_path / "fork" / "src" / "m.py").write_text("X = 3\n")
    eng.checkout_engine(str(tmp_path / "fork"), None, "src")
    err = capsys.readouterr().err
    assert "uncommitted changes are not part of this run" in err and repo.head.commit.hexsha[:12] in err
    eng.checkout_engine(str(tmp_path / "fork"), "v2", "src")
    assert "uncommitted" not in capsys.readouterr().err
    repo.git.checkout("--", "src/m.py")
    (tmp_path / "fork" / "src" / "new_kernel.py").write_text("Y = 1\n")
    eng.checkout_engine(str(tmp_path / "fork"), None, "src")
    assert "uncommitted changes" in capsys.readouterr().err
