"""Where the knowledge (kernel_store/ and lessons/) lives: decided here, once (DESIGN decision 16).

Every reader and writer of the store and the lessons gets its folders from a `Knowledge` made by
`locate`, in this order:

  1. --knowledge-path PATH                      (the commands pass it as `path`)
  2. $OPTBOT_KNOWLEDGE_PATH
  3. the git repository of the current directory, when it holds kernel_store/: optbot runs from
     inside a knowledge checkout (a clone of optbot, as the README's commands do)
  4. $OPTBOT_HOME/knowledge: optbot's own knowledge repository, created on first use as a git
     repository with one commit holding a copy of the kernel_store/ and lessons/ that ship with
     optbot (SHIPPED_STORE, SHIPPED_LESSONS), and brought up to date with what a newer optbot ships
     whenever a command reads it (bot/knowledge/shipped.py: what changed there is kept)

So a run never writes into a repository the user did not point it at: started from anywhere else,
it does not touch the checkout optbot was installed from (an editable install), whose
kernel_store/ is only the seed of 4. The store and lessons commands may name their folders one by
one (--store, --lessons-dir); the commands that read or write the knowledge print `line()` on
stderr, so where it went is never a guess.
"""
from __future__ import annotations

import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import git

from bot.knowledge import shipped
from bot.paths import REPO_ROOT, optbot_home

ENV = "OPTBOT_KNOWLEDGE_PATH"
# what ships with optbot: defined in shipped.py (which must not import this module), named here too,
# where every reader of the knowledge has always found them
SHIPPED_STORE, SHIPPED_LESSONS = shipped.SHIPPED_STORE, shipped.SHIPPED_LESSONS


@dataclass(frozen=True)
class Knowledge:
    root: Path  # the knowledge repository (or folder): where the knowledge branch is committed
    kernel_store: Path
    lessons: Path
    why: str  # how it was chosen, in words: "--knowledge-path", "$OPTBOT_KNOWLEDGE_PATH", ...

    @classmethod
    def at(cls, root: str | Path, why: str) -> "Knowledge":
        r = Path(root).expanduser().resolve()
        return cls(r, r / "kernel_store", r / "lessons", why)

    @property
    def repo(self) -> git.Repo | None:
        """The git repository at root, when it is one with at least one commit (a knowledge branch
        is made from its HEAD); else None, and delivery writes the files into the run directory."""
        try:
            repo = git.Repo(self.root)
            repo.head.commit
        except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
            return None
        return repo

    def line(self) -> str:
        """One line for stderr: where, and why there."""
        out = f"knowledge: {self.root} ({self.why})"
        if self.kernel_store != self.root / "kernel_store":
            out += f"; kernel store {self.kernel_store}"
        if self.lessons != self.root / "lessons":
            out += f"; lessons {self.lessons}"
        return out

    def say(self) -> "Knowledge":
        print(self.line(), file=sys.stderr, flush=True)
        return self


def locate(path: str | Path | None = None, *, store: str | Path | None = None, lessons: str | Path | None = None,
           cwd: str | Path | None = None) -> Knowledge:
    """The knowledge a command works on (the order is in the module docstring). `store` and
    `lessons` name one folder each instead of the repository's (the store and lessons commands'
    --store / --lessons-dir); lessons sit beside a --store folder unless named too."""
    if path:
        k = Knowledge.at(path, "--knowledge-path")
    elif os.environ.get(ENV):
        k = Knowledge.at(os.environ[ENV], f"${ENV}")
    elif store:
        s = Path(store).expanduser().resolve()
        k = Knowledge(s.parent, s, s.parent / "lessons", "--store")
    else:
        k = default_knowledge(Path(cwd) if cwd else Path.cwd())
    if store:
        k = Knowledge(k.root, Path(store).expanduser().resolve(), k.lessons, k.why)
    if lessons:
        k = Knowledge(k.root, k.kernel_store, Path(lessons).expanduser().resolve(), k.why)
    return k


def knowledge_of(options) -> Knowledge:
    """The knowledge of an optimize run: its Options.knowledge_path (the command records the
    resolved root there, so a resumed run finds the same one), else the default."""
    return locate(getattr(options, "knowledge_path", None))


def default_knowledge(cwd: Path) -> Knowledge:
    here = _repository_of(cwd)
    if here is not None and (here / "kernel_store").is_dir():
        return Knowledge.at(here, "the current directory's git repository holds kernel_store/")
    home = optbot_home() / "knowledge"
    created = _create_home(home) if not home.exists() else False
    why = f"default: {cwd} is in no git repository holding kernel_store/"
    if created:
        why += "; created now from the kernel_store/ and lessons/ that ship with optbot"
    elif str(home) not in _SYNCED:  # optbot's own repository: take what a newer optbot ships (shipped.py)
        _SYNCED.add(str(home))
        clause = shipped.sync(home).clause()
        why += f"; {clause}" if clause else ""
    return Knowledge.at(home, why)


_SYNCED: set[str] = set()  # homes brought up to date with what ships, once a process


def _repository_of(cwd: Path) -> Path | None:
    try:
        top = git.Repo(cwd, search_parent_directories=True).working_tree_dir
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None
    return Path(top).resolve() if top else None


def _create_home(home: Path) -> bool:
    """$OPTBOT_HOME/knowledge as a git repository seeded with optbot's shipped knowledge. Built
    beside it and renamed into place, so two processes starting at once never see half of it;
    False when another process won the race."""
    home.parent.mkdir(parents=True, exist_ok=True)
    tmp = home.parent / f".knowledge-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        shipped.seed(git.Repo.init(tmp, initial_branch="main"),
                     f"{shipped.SEED_MESSAGE}{REPO_ROOT}'s kernel_store/ and lessons/")
        try:
            tmp.rename(home)
        except OSError:
            if home.exists():
                return False  # another process created it first: theirs is the one
            raise
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
