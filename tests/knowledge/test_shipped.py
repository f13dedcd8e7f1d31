"""optbot's own knowledge repository ($OPTBOT_HOME/knowledge) takes what a newer optbot ships
(bot/knowledge/shipped.py): entry by entry and lesson by lesson, three ways against the shipped
version it last took; what changed here is kept, what never shipped is never touched, and nothing
happens to a working tree with changes or another branch checked out."""
from __future__ import annotations

import multiprocessing
import shutil
import time
from pathlib import Path

import git
import pytest

from bot.cli import cli
from bot.knowledge import location, shipped
from bot.knowledge.location import locate


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def ships(tmp_path, monkeypatch):
    """What "this optbot" ships: a small kernel_store/ and lessons/ the test edits between runs, a
    fresh OPTBOT_HOME, and a current directory in no repository."""
    store, lessons = tmp_path / "ship" / "kernel_store", tmp_path / "ship" / "lessons"
    _write(store / "a" / "entry.yaml", "id: a\n")
    _write(store / "a" / "kernel.py", "A = 1\n")
    _write(store / "b" / "entry.yaml", "id: b\n")
    _write(store / "d" / "entry.yaml", "id: d\n")
    _write(store / "a" / "__pycache__" / "kernel.cpython-311.pyc", "bytecode")  # never shipped
    _write(lessons / "one.md", "lesson one\n")
    monkeypatch.setattr(shipped, "SHIPPED_STORE", store)
    monkeypatch.setattr(shipped, "SHIPPED_LESSONS", lessons)
    monkeypatch.setattr(location, "_SYNCED", set())
    monkeypatch.setenv("OPTBOT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OPTBOT_KNOWLEDGE_PATH", raising=False)
    monkeypatch.delenv(shipped.SYNC_ENV, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return store, lessons


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(root).parts}


def _commit_here(repo: git.Repo, message: str) -> None:
    repo.git.add("-A")
    repo.git.commit("-qm", message, env={"GIT_AUTHOR_NAME": "me", "GIT_AUTHOR_EMAIL": "me@x", "GIT_COMMITTER_NAME": "me",
                                         "GIT_COMMITTER_EMAIL": "me@x"})


def test_a_new_repository_records_the_version_it_took(ships):
    k = locate()
    repo = k.repo
    assert repo.commit(shipped.SHIPPED_REF) == repo.head.commit  # what it took is exactly its first commit
    assert "kernel_store/a/__pycache__/kernel.cpython-311.pyc" not in _files(k.root)
    assert shipped.sync(k.root) == shipped.Sync()  # the same optbot again: nothing to take
    assert len(list(repo.iter_commits())) == 1


def test_a_newer_optbots_fixes_entries_and_lessons_are_taken(ships):
    store, lessons = ships
    k = locate()
    first = k.repo.head.commit.hexsha
    # the next optbot: a fixed kernel, an entry retired out of the store, a new entry, a new lesson
    _write(store / "a" / "kernel.py", "A = 2  # fixed\n")
    shutil.rmtree(store / "b")
    _write(store / "c" / "entry.yaml", "id: c\n")
    _write(lessons / "two.md", "lesson two\n")
    location._SYNCED.clear()
    again = locate()
    assert "took 4 updates that ship with this optbot (a, b, c, two.md)" in again.why
    repo = again.repo
    files = _files(again.root)
    assert files["kernel_store/a/kernel.py"] == "A = 2  # fixed\n" and "kernel_store/c/entry.yaml" in files
    assert not any(f.startswith("kernel_store/b/") for f in files) and files["lessons/two.md"] == "lesson two\n"
    assert repo.head.commit.parents[0].hexsha == first and not repo.is_dirty(untracked_files=True)
    assert repo.commit(shipped.SHIPPED_REF).tree == repo.head.commit.tree
    assert repo.commit(shipped.SHIPPED_REF).parents[0].hexsha == first  # the shipped versions, one after another
    location._SYNCED.clear()
    assert "took" not in locate().why  # once taken, the next command finds nothing to do


def test_what_changed_here_is_kept_and_what_never_shipped_is_not_touched(ships):
    store, lessons = ships
    k = locate()
    repo = k.repo
    # here: a verdict learned for a (as a merged knowledge PR leaves it), d edited, a lesson learned
    _write(k.kernel_store / "a" / "bench.json", '{"gpu": "learned here"}\n')
    _write(k.kernel_store / "d" / "entry.yaml", "id: d\nnote: mine\n")
    _write(k.lessons / "learned-here.md", "a lesson of this repository\n")
    _commit_here(repo, "knowledge PR merged")
    # shipped: a changed too (conflict), b changed (unchanged here), the lesson one removed
    _write(store / "a" / "kernel.py", "A = 3\n")
    _write(store / "b" / "entry.yaml", "id: b\nstatus: retired\n")
    (lessons / "one.md").unlink()
    s = shipped.sync(k.root)
    assert s.taken == ["kernel_store/b", "lessons/one.md"] and s.kept == ["kernel_store/a"]
    files = _files(k.root)
    assert files["kernel_store/a/kernel.py"] == "A = 1\n" and files["kernel_store/a/bench.json"] == '{"gpu": "learned here"}\n'
    assert files["kernel_store/d/entry.yaml"] == "id: d\nnote: mine\n"  # changed here, not in what ships
    assert files["lessons/learned-here.md"] == "a lesson of this repository\n" and "lessons/one.md" not in files
    assert files["kernel_store/b/entry.yaml"] == "id: b\nstatus: retired\n"
    assert f"git checkout {shipped.SHIPPED_REF} -- PATH" in s.clause() and "kernel_store/a" in s.clause()
    # the shipped version of a kept entry is one command away, as the line says
    repo.git.checkout(shipped.SHIPPED_REF, "--", "kernel_store/a/kernel.py")
    assert (k.kernel_store / "a" / "kernel.py").read_text() == "A = 3\n"


def test_a_working_tree_with_changes_or_another_branch_waits(ships):
    store, _ = ships
    k = locate()
    repo = k.repo
    head, taken = repo.head.commit.hexsha, repo.commit(shipped.SHIPPED_REF).hexsha
    _write(store / "d" / "entry.yaml", "id: d\nv: 2\n")
    (k.kernel_store / "a" / "entry.yaml").write_text("id: a\n# editing\n")
    s = shipped.sync(k.root)
    assert not s.taken and "uncommitted changes" in s.clause()
    assert repo.head.commit.hexsha == head and repo.commit(shipped.SHIPPED_REF).hexsha == taken  # asked again next time
    assert (k.kernel_store / "a" / "entry.yaml").read_text() == "id: a\n# editing\n"  # the edit is untouched
    repo.git.checkout("--", ".")
    repo.git.checkout("-q", "-b", "optbot/knowledge/flux2/abc")
    s = shipped.sync(k.root)
    assert not s.taken and "branch optbot/knowledge/flux2/abc checked out" in s.not_taken
    repo.git.checkout("-q", "main")
    # an untracked file where a shipped one would go: git refuses, nothing is lost, asked again
    _write(k.kernel_store / "d" / "kernel.py", "mine, not committed\n")
    _write(store / "d" / "kernel.py", "shipped\n")
    s = shipped.sync(k.root)
    assert not s.taken and "git would not update" in s.not_taken and "untracked" in s.not_taken, s
    assert (k.kernel_store / "d" / "kernel.py").read_text() == "mine, not committed\n"
    assert repo.commit(shipped.SHIPPED_REF).hexsha == taken and repo.head.commit.hexsha == head
    (k.kernel_store / "d" / "kernel.py").unlink()
    # untracked files elsewhere (bytecode an import left in an entry) do not hold it up
    _write(k.kernel_store / "a" / "__pycache__" / "kernel.cpython-311.pyc", "bytecode")
    assert shipped.sync(k.root).taken == ["kernel_store/d"]
    assert (k.kernel_store / "d" / "kernel.py").read_text() == "shipped\n"


def test_a_repository_seeded_before_the_shipped_ref_existed(ships, tmp_path):
    """Seeded by the optbot before this module: one commit, copied files, no ref. Its first commit is
    the base."""
    store, lessons = ships
    home = tmp_path / "home" / "knowledge"
    shutil.copytree(store, home / "kernel_store", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(lessons, home / "lessons")
    repo = git.Repo.init(home, initial_branch="main")
    _commit_here(repo, f"{shipped.SEED_MESSAGE}/somewhere's kernel_store/ and lessons/")
    _write(store / "a" / "kernel.py", "A = 2\n")
    k = locate()
    assert "took 1 updates" in k.why and (k.kernel_store / "a" / "kernel.py").read_text() == "A = 2\n"
    assert repo.commit(shipped.SHIPPED_REF).parents[0] == repo.commit("HEAD~1")


def test_a_repository_not_seeded_by_optbot_only_gains_what_it_lacks(ships, tmp_path):
    """No known base: an entry that differs is kept (whose edit is it?), a new one is added."""
    store, _ = ships
    home = tmp_path / "home" / "knowledge"
    _write(home / "kernel_store" / "a" / "entry.yaml", "id: a\nmine: true\n")
    _commit_here(git.Repo.init(home, initial_branch="main"), "my own knowledge")
    s = shipped.sync(home)
    assert s.kept == ["kernel_store/a"] and s.taken == ["kernel_store/b", "kernel_store/d", "lessons/one.md"]
    assert (home / "kernel_store" / "a" / "entry.yaml").read_text() == "id: a\nmine: true\n"


def test_it_can_be_turned_off(ships, monkeypatch):
    store, _ = ships
    k = locate()
    _write(store / "d" / "entry.yaml", "id: d\nv: 2\n")
    monkeypatch.setenv(shipped.SYNC_ENV, "off")
    assert shipped.sync(k.root) == shipped.Sync() and (k.kernel_store / "d" / "entry.yaml").read_text() == "id: d\n"


def _sync_in_child(root: str, q) -> None:
    q.put(shipped.sync(Path(root)).taken)


def test_two_commands_starting_at_once_take_it_once(ships, monkeypatch):
    store, _ = ships
    k = locate()
    slow = shipped._files_of  # each reads main, then takes its time: without the lock both would commit

    def files_of(repo, treeish):
        time.sleep(0.5)
        return slow(repo, treeish)

    monkeypatch.setattr(shipped, "_files_of", files_of)
    _write(store / "d" / "entry.yaml", "id: d\nv: 2\n")
    ctx = multiprocessing.get_context("fork")  # the children inherit this test's shipped folders
    q = ctx.Queue()
    procs = [ctx.Process(target=_sync_in_child, args=(str(k.root), q)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = sorted([q.get(timeout=5), q.get(timeout=5)])
    assert results == [[], ["kernel_store/d"]]
    assert len(list(k.repo.iter_commits("main"))) == 2


def test_a_command_says_what_it_took(ships, cli_runner):
    store, _ = ships
    locate()
    location._SYNCED.clear()
    _write(store / "c" / "entry.yaml", "id: c\n")
    r = cli_runner.invoke(cli, ["lessons", "list"])
    first = r.stderr.splitlines()[0]
    assert first.startswith("knowledge: ") and "took 1 updates that ship with this optbot (c) in commit" in first
