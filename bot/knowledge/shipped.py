"""The knowledge that ships with optbot, and optbot's own knowledge repository kept up to date with it.

`$OPTBOT_HOME/knowledge` (bot/knowledge/location.py, case 4) is made on first use from the
kernel_store/ and lessons/ that ship with optbot. A later optbot ships other files: entries fixed
(a kernel that faulted under compile + CUDA graph), new entries, retired ones, new lessons. Without
this module that repository kept its first copy for ever, and every run from outside a knowledge
checkout replayed the old entries.

The repository keeps the shipped knowledge it last took as the commit `refs/optbot/shipped` (one
commit per shipped version, each the parent of the next). When what ships now differs, `sync` makes
a three-way decision per unit (one entry folder `kernel_store/<id>/`, one lesson file), base = the
last shipped version, theirs = what ships now, ours = the repository's `main`:

  unchanged in what ships                 nothing to do
  ours is the last shipped version        take theirs (updated, added or removed)
  ours already equals theirs              nothing to do
  both changed (a verdict learned here, or an entry edited here, and a new one shipped)
                                          keep ours, and say so: `git checkout refs/optbot/shipped --
                                          kernel_store/<id>` takes the shipped one

and commits what it takes as one commit on `main` (fast-forward: its working tree is updated only
when it is clean, and never when `main` is not checked out). Units the repository holds that never
shipped (lessons learned here) are never touched. `$OPTBOT_KNOWLEDGE_SYNC=off` turns it off.

Trees and blobs are written in-process (gitdb), so the check on every command that reads the
default knowledge costs hashing ~2 MB and reading one tree (~20 ms for the store of 2026-12).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

import git
from git.index.fun import write_tree_from_cache
from git.index.typ import BaseIndexEntry
from git.objects import Commit
from git.util import Actor
from gitdb.base import IStream

from bot.paths import REPO_ROOT

SHIPPED_STORE = REPO_ROOT / "kernel_store"  # what ships with optbot: the seed of a new knowledge repository
SHIPPED_LESSONS = REPO_ROOT / "lessons"
SHIPPED_REF = "refs/optbot/shipped"
BRANCH = "main"
SYNC_ENV = "OPTBOT_KNOWLEDGE_SYNC"
SEED_MESSAGE = "optbot knowledge: seeded from "  # how the repository's first commit begins (since 2026-11)
_BOT = Actor("optbot", "optbot@localhost")
_SKIP_DIRS = {"__pycache__", ".pytest_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")

Files = dict[str, tuple[int, bytes]]  # path in the repository -> (git mode, binary blob sha)


def _shipped_dirs() -> list[tuple[Path, str]]:
    return [(SHIPPED_STORE, "kernel_store"), (SHIPPED_LESSONS, "lessons")]  # read at call time: tests point them elsewhere


def shipped_files(repo: git.Repo) -> Files:
    """What ships with optbot now, each file stored as a blob of `repo` (caches and bytecode left out)."""
    out: Files = {}
    for src, prefix in _shipped_dirs():
        if not src.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for name in sorted(filenames):
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                p = Path(dirpath) / name
                data = p.read_bytes()
                mode = 0o100755 if os.stat(p).st_mode & stat.S_IXUSR else 0o100644
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()  # git's blob id
                if not repo.odb.has_object(blob):  # stored once; the check on every command only hashes
                    repo.odb.store(IStream("blob", len(data), BytesIO(data)))
                out[f"{prefix}/{p.relative_to(src).as_posix()}"] = (mode, blob)
    return out


def _write_tree(repo: git.Repo, files: Files) -> str:
    entries = [BaseIndexEntry((mode, sha, 0, path)) for path, (mode, sha) in sorted(files.items())]
    binsha, _ = write_tree_from_cache(entries, repo.odb, slice(0, len(entries)))
    return binsha.hex()


def _files_of(repo: git.Repo, treeish: str) -> Files:
    return {b.path: (b.mode, b.binsha) for b in repo.tree(treeish).traverse() if b.type == "blob"}


def _unit(path: str) -> str:
    """The unit a file belongs to: `kernel_store/<id>` (an entry and everything in it), `lessons/<file>`."""
    return "/".join(path.split("/")[:2])


def _by_unit(files: Files) -> dict[str, frozenset]:
    units: dict[str, set] = {}
    for path, (mode, sha) in files.items():
        units.setdefault(_unit(path), set()).add((path, mode, sha))
    return {u: frozenset(v) for u, v in units.items()}


def _commit(repo: git.Repo, tree: str, message: str, parents: list[str]) -> str:
    c = Commit.create_from_tree(repo, repo.tree(tree), message, parent_commits=[repo.commit(p) for p in parents],
                                head=False, author=_BOT, committer=_BOT)
    return c.hexsha


def seed(repo: git.Repo, message: str) -> str:
    """The first commit of a new knowledge repository: exactly what ships, on `main`, checked out, and
    recorded as the shipped version it took."""
    sha = _commit(repo, _write_tree(repo, shipped_files(repo)), message, [])
    repo.git.update_ref(f"refs/heads/{BRANCH}", sha)
    repo.git.symbolic_ref("HEAD", f"refs/heads/{BRANCH}")
    repo.git.reset("--hard", "-q", sha)
    repo.git.update_ref(SHIPPED_REF, sha)
    return sha


@dataclass
class Sync:
    """What `sync` did: units taken from what ships, units kept as they are here, and why nothing was
    done where it could not be."""
    taken: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    commit: str = ""  # the commit on main that took them
    not_taken: str = ""  # why shipped updates are waiting (a dirty tree, another branch checked out)

    def clause(self) -> str:
        """For the `knowledge: PATH (why)` line: empty when nothing shipped has changed."""
        parts = []
        if self.not_taken:
            parts.append(f"optbot ships updates to its knowledge, not taken: {self.not_taken}")
        if self.taken:
            names = ", ".join(u.split("/", 1)[-1] for u in self.taken[:6]) + (" ..." if len(self.taken) > 6 else "")
            parts.append(f"took {len(self.taken)} updates that ship with this optbot ({names}) in commit "
                         f"{self.commit[:12]}")
        if self.kept:
            parts.append(f"kept {len(self.kept)} changed here that also changed in what ships "
                         f"({', '.join(self.kept[:6])}{' ...' if len(self.kept) > 6 else ''}; the shipped "
                         f"version: git checkout {SHIPPED_REF} -- PATH)")
        return "; ".join(parts)


def _last_shipped(repo: git.Repo) -> str | None:
    """The shipped version the repository last took: its ref, else (a repository seeded before the ref
    existed) its first commit when that is the seed; None when unknown (then nothing is overwritten)."""
    try:
        return repo.commit(SHIPPED_REF).hexsha
    except (git.BadName, ValueError):
        pass
    roots = repo.git.rev_list("--max-parents=0", "HEAD").split()
    if len(roots) == 1 and repo.commit(roots[0]).message.startswith(SEED_MESSAGE):
        return roots[0]
    return None


def sync(root: Path) -> Sync:
    """Bring optbot's own knowledge repository at `root` up to date with what ships (module docstring)."""
    if os.environ.get(SYNC_ENV, "").lower() in ("off", "0", "false", "no"):
        return Sync()
    try:
        repo = git.Repo(root)
        repo.head.commit
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return Sync()  # not a repository with a commit (made by hand): nothing of ours to keep up to date
    theirs_files = shipped_files(repo)
    last = _last_shipped(repo)
    if last is not None and _files_of(repo, last) == theirs_files:
        return Sync()  # the common case: this optbot ships what the repository last took
    with open(Path(repo.git_dir) / "optbot-shipped.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two commands starting at once: one takes, the other sees it done
        last = _last_shipped(repo)  # another command may have taken it while this one waited
        last_files = _files_of(repo, last) if last is not None else {}
        if last is not None and last_files == theirs_files:
            return Sync()
        return _take(repo, last, last_files, theirs_files)


def _take(repo: git.Repo, last: str | None, last_files: Files, theirs_files: Files) -> Sync:
    if repo.head.is_detached or repo.head.ref.name != BRANCH:
        where = "a detached HEAD" if repo.head.is_detached else f"branch {repo.head.ref.name}"
        return Sync(not_taken=f"{repo.working_tree_dir} has {where} checked out, not {BRANCH}")
    if repo.is_dirty(untracked_files=False):  # untracked files (a __pycache__) stop only the merge that would overwrite them
        return Sync(not_taken=f"{repo.working_tree_dir} has uncommitted changes (git status there)")
    head = repo.head.commit.hexsha
    base = _by_unit(last_files)
    theirs = _by_unit(theirs_files)
    ours_files = _files_of(repo, head)
    ours = _by_unit(ours_files)
    out = Sync()
    new_files = dict(ours_files)
    for u in sorted(set(base) | set(theirs)):
        b, t, o = base.get(u), theirs.get(u), ours.get(u)
        if t == b or o == t:
            continue
        if o == b:  # unchanged here since the last shipped version (or new in what ships)
            for path, _, _ in o or ():
                del new_files[path]
            new_files.update({p: (m, s) for p, m, s in (t or ())})
            out.taken.append(u)
        else:
            out.kept.append(u)
    if out.taken:
        names = "\n".join(f"- {u}" for u in out.taken)
        kept = "".join(f"\n- {u} (changed here too: kept)" for u in out.kept)
        out.commit = _commit(repo, _write_tree(repo, new_files),
                             f"optbot knowledge: take what ships with this optbot\n\n{names}{kept}\n", [head])
        try:
            repo.git.merge("--ff-only", "-q", out.commit)
        except git.GitCommandError as e:  # an untracked file where a shipped one would go
            said = " ".join(str(e.stderr).split()).removeprefix("stderr: '").rstrip("'")
            why = said[said.find("error: ") + 7:] if "error: " in said else "see git status there"
            return Sync(not_taken=f"git would not update {repo.working_tree_dir}: {why[:300]}")
    shipped = _commit(repo, _write_tree(repo, theirs_files), "optbot knowledge: what ships with optbot", [last] if last else [])
    repo.git.update_ref(SHIPPED_REF, shipped)
    return out
