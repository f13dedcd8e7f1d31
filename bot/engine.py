"""Engine repositories: the git repository the bot profiles and patches.

Four kinds of source, all ending as a git repository plus a resolved base sha:
- ``pypi-sdist:PKG==VER``: the release's source distribution, unpacked into one deterministic
  commit ("upstream PKG VER", fixed author and date), so the base sha is the same on every machine.
  The sdist is taken from $OPTBOT_HOME/downloads if it is there (that is how an offline GPU box gets
  it), else downloaded with pip.
- ``pypi-wheel:PKG==VER``: for a release published without a source distribution (sglang): the
  files of its wheel, laid out under ``python/`` the way the project's own repository (and so a
  fork of it) is, as the same kind of deterministic commit. Compiled extension modules and the
  ``.dist-info`` folder are left out: they differ between the wheels of one release (one per Python
  version and platform), and leaving them out makes the commit, and so the base sha, the same
  whichever wheel a machine downloaded (cp311 here, cp312 on the GPU box).
- a local path to a git repository: used in place.
- a git URL: cloned once under $OPTBOT_HOME/engines/.

Candidates never touch the base checkout: each gets its own ``git worktree`` (see ``add_worktree``).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import git

from bot.errors import EngineError
from bot.paths import optbot_home

SDIST_RE = re.compile(r"^pypi-sdist:(?P<pkg>[A-Za-z0-9_.\-]+)==(?P<ver>[A-Za-z0-9_.\-+]+)$")
WHEEL_RE = re.compile(r"^pypi-wheel:(?P<pkg>[A-Za-z0-9_.\-]+)==(?P<ver>[A-Za-z0-9_.\-+]+)$")
# Files of a wheel that are specific to one Python version or platform (compiled extension modules).
_COMPILED_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
WHEEL_LAYOUT_ROOT = "python"  # where a wheel's top-level packages go, as in sglang's repository
# Fixed identity and date: the same sdist always gives the same commit sha.
BOT_ACTOR = git.Actor("optbot", "optbot@localhost")
FIXED_DATE = "2000-01-01T00:00:00+00:00"


@dataclass(frozen=True)
class EngineCheckout:
    name: str  # engine name from the workload, or the URL/path given
    repo_path: Path
    base_sha: str
    ref: str  # what the user asked for (or the default)
    import_root: str

    @property
    def repo(self) -> git.Repo:
        return git.Repo(self.repo_path)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _is_url(s: str) -> bool:
    return "://" in s or s.startswith("git@")


def resolve_source(spec_source: str, engine_opt: str | None, workload_engines: dict) -> tuple[str, str]:
    """--engine NAME|NAME=PATH|NAME=URL|PATH|URL -> (display name, source).

    NAME=PATH|URL is a fork of the workload's engine NAME: its repository, with NAME's import root,
    model class and adapter (e.g. ``--engine sglang=~/src/sglang-fork``).
    """
    if engine_opt is None:
        return "", spec_source
    if engine_opt in workload_engines:
        return engine_opt, workload_engines[engine_opt].source
    name, sep, fork = engine_opt.partition("=")
    if sep and name in workload_engines and fork:
        return name, fork
    return engine_opt, engine_opt


def checkout_engine(source: str, ref: str | None, import_root: str, name: str = "") -> EngineCheckout:
    m = SDIST_RE.match(source)
    w = WHEEL_RE.match(source)
    if m:
        repo_path = materialize_sdist(m["pkg"], m["ver"])
    elif w:
        repo_path = materialize_wheel(w["pkg"], w["ver"])
    elif _is_url(source):
        repo_path = _clone_url(source)
    else:
        p = Path(source).expanduser()
        if not p.exists():
            raise EngineError(f"engine source {source!r}: no such path, and it is not a git URL, "
                              f"pypi-sdist:PKG==VER or pypi-wheel:PKG==VER")
        try:
            repo_path = Path(git.Repo(p, search_parent_directories=False).working_tree_dir or p)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise EngineError(f"engine source {p}: not a git repository") from None
    repo = git.Repo(repo_path)
    want = ref or "HEAD"
    try:
        sha = repo.commit(want).hexsha
    except (git.BadName, ValueError, git.GitCommandError):
        if _is_url(source):
            try:
                repo.git.fetch("origin", want)
                sha = repo.commit("FETCH_HEAD").hexsha
            except git.GitCommandError:
                raise EngineError(f"engine {source}: ref {want!r} not found (also not on origin)") from None
        else:
            raise EngineError(f"engine {repo_path}: ref {want!r} not found") from None
    if not (repo_path / import_root).is_dir():
        raise EngineError(f"engine {repo_path} at {sha[:12]}: import root {import_root!r} is not a folder")
    if ref is None and not (m or w or _is_url(source)) and _has_uncommitted_changes(repo, import_root):
        # runs check out a commit (worktrees), so edits in the working tree would silently not run
        _log(f"engine {repo_path}: its uncommitted changes are not part of this run, which uses commit "
             f"{sha[:12]} (HEAD); commit them, or name another commit with --ref")
    return EngineCheckout(name=name or source, repo_path=repo_path, base_sha=sha, ref=want, import_root=import_root)


def _has_uncommitted_changes(repo: git.Repo, import_root: str) -> bool:
    """Tracked files changed, or new files under the import root (a kernel file a patch would add)."""
    root = import_root.strip("/") + "/"
    return repo.is_dirty(untracked_files=False) or any(f.startswith(root) for f in repo.untracked_files)


def _clone_url(url: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", url)[-60:] + "-" + hashlib.sha1(url.encode()).hexdigest()[:8]
    dest = optbot_home() / "engines" / slug
    if (dest / ".git").is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    _log(f"cloning engine {url} into {dest}")
    try:
        git.Repo.clone_from(url, dest)
    except git.GitCommandError as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise EngineError(f"cannot clone engine {url}: {e.stderr.strip() or e}") from None
    return dest


# --------------------------------------------------------------------------------------------
# sdist -> deterministic repository


def _find_or_download_sdist(pkg: str, ver: str) -> Path:
    downloads = optbot_home() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    norm = pkg.replace("-", "_").lower()
    for cand in downloads.iterdir():
        stem = cand.name.lower().replace("-", "_")
        if stem == f"{norm}_{ver}.tar.gz":
            return cand
    _log(f"downloading the source distribution of {pkg}=={ver} into {downloads}")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
         "-d", str(downloads), f"{pkg}=={ver}"],
        capture_output=True, text=True,
    )
    for cand in downloads.iterdir():
        if cand.name.lower().replace("-", "_") == f"{norm}_{ver}.tar.gz":
            return cand
    raise EngineError(
        f"could not get the source distribution of {pkg}=={ver} (pip download said: "
        f"{(proc.stderr or proc.stdout).strip()[-400:]}); on an offline machine put "
        f"{pkg}-{ver}.tar.gz into {downloads}"
    )


def _find_or_download_wheel(pkg: str, ver: str) -> Path:
    """Any wheel of PKG==VER: its non-compiled files are the same in every one (see the module doc)."""
    downloads = optbot_home() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    prefix = f"{pkg.replace('-', '_').lower()}-{ver}-"

    def found() -> Path | None:
        cands = sorted(c for c in downloads.iterdir()
                       if c.name.lower().startswith(prefix) and c.name.endswith(".whl"))
        return cands[0] if cands else None

    if found() is None:
        _log(f"downloading a wheel of {pkg}=={ver} into {downloads}")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
             "-d", str(downloads), f"{pkg}=={ver}"],
            capture_output=True, text=True,
        )
        if found() is None:
            said = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            raise EngineError(
                f"could not get a wheel of {pkg}=={ver} (pip download said: "
                f"{said[-1][-300:] if said else 'nothing'}); on an offline machine put any wheel "
                f"of {pkg} {ver} (e.g. {pkg}-{ver}-cp312-cp312-manylinux_2_34_x86_64.whl) into {downloads}"
            )
    return found()


def _sdist_files(sdist: Path, pkg: str, ver: str):
    """(relative path, executable, reader) for each file of the sdist that goes into the repository."""
    with tarfile.open(sdist) as tf:
        top = f"{pkg}-{ver}/"
        for member in tf.getmembers():
            name = member.name
            if not member.isfile() or not name.startswith(top) or ".." in Path(name).parts:
                continue  # confine the extraction to the destination
            rel = name[len(top):]
            if not rel or rel == "PKG-INFO" or rel.startswith(f"src/{pkg}.egg-info") or ".egg-info/" in rel:
                continue
            yield rel, bool(member.mode & 0o111), lambda m=member: tf.extractfile(m).read()


def _wheel_files(wheel: Path):
    """The wheel's files minus .dist-info and compiled extensions, under python/."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir() or ".." in Path(name).parts or name.startswith("/"):
                continue
            top = name.split("/", 1)[0]
            if top.endswith((".dist-info", ".data")) or name.endswith(_COMPILED_SUFFIXES):
                continue
            mode = (info.external_attr >> 16) & 0o777
            yield f"{WHEEL_LAYOUT_ROOT}/{name}", bool(mode & 0o111), lambda n=name: zf.read(n)


def materialize_sdist(pkg: str, ver: str) -> Path:
    return _materialize(pkg, ver, "source distribution", lambda: _find_or_download_sdist(pkg, ver),
                        lambda archive: _sdist_files(archive, pkg, ver))


def materialize_wheel(pkg: str, ver: str) -> Path:
    return _materialize(pkg, ver, "wheel", lambda: _find_or_download_wheel(pkg, ver), _wheel_files)


def _materialize(pkg: str, ver: str, what: str, fetch, files) -> Path:
    """One code path for every release archive: files -> one deterministic commit "upstream PKG VER".

    Fixed author, committer, dates and message, no signing and no line-ending conversion: the same
    files give the same sha on every machine.
    """
    dest = optbot_home() / "engines" / f"{pkg}-{ver}"
    message = f"upstream {pkg} {ver}"
    if (dest / ".git").is_dir():
        try:
            if message in git.Repo(dest).git.log("--max-parents=0", "--format=%s", "--all").splitlines():
                return dest
        except (git.GitCommandError, ValueError):
            pass
        raise EngineError(f"{dest} exists but does not hold the commit {message!r}; remove it to re-create it")
    archive = fetch()
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _log(f"materializing engine repository {dest} from the {what} {archive.name}")
    for rel, executable, read in files(archive):
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(read())
        os.chmod(target, 0o755 if executable else 0o644)
    repo = git.Repo.init(tmp, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("core", "autocrlf", "false")
        cw.set_value("user", "name", BOT_ACTOR.name)
        cw.set_value("user", "email", BOT_ACTOR.email)
    repo.git.add("-A", "--force")
    env = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE,
           "GIT_AUTHOR_NAME": BOT_ACTOR.name, "GIT_AUTHOR_EMAIL": BOT_ACTOR.email,
           "GIT_COMMITTER_NAME": BOT_ACTOR.name, "GIT_COMMITTER_EMAIL": BOT_ACTOR.email}
    repo.git.commit("-q", "--no-gpg-sign", "-m", message, env=env)
    repo.close()
    tmp.rename(dest)
    _log(f"engine {pkg} {ver} at {dest} (commit {git.Repo(dest).head.commit.hexsha[:12]})")
    return dest


# --------------------------------------------------------------------------------------------
# worktrees


# git's worktree bookkeeping ($GIT_DIR/worktrees, its locks) is not made for concurrent adds and
# removes in one repository; the agent's samples run in threads (bot/generate/agent/parallel.py)
_WORKTREES = threading.RLock()
# The worktrees this process added, removed when its command ends (release_worktrees, from bot/cli.py).
# Each is a checkout of a commit the repository keeps (a candidate, a patch committed at the base, a
# stack), so a later process makes it again in about a second; kept, they grew without bound (31 GB of
# candidate checkouts in one test worker's home, 6 GB in a user's after a few sessions' runs).
_ADDED: dict[Path, EngineCheckout] = {}


def add_worktree(checkout: EngineCheckout, name: str, ref: str | None = None) -> Path:
    """A fresh detached worktree of the engine at ref (default: the base sha)."""
    with _WORKTREES:
        return _add_worktree(checkout, name, ref)


def _add_worktree(checkout: EngineCheckout, name: str, ref: str | None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    root = optbot_home() / "worktrees" / hashlib.sha1(str(checkout.repo_path).encode()).hexdigest()[:10]
    path = root / safe
    repo = checkout.repo
    want = repo.commit(ref or checkout.base_sha).hexsha
    if path.exists():
        try:
            wt = git.Repo(path)
            if wt.head.commit.hexsha == want and not wt.is_dirty(untracked_files=True):
                _ADDED[path] = checkout  # ours now: one a killed process left goes when this one ends
                return path  # reuse a clean worktree at the same commit
        except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
            pass
        remove_worktree(checkout, path)
    root.mkdir(parents=True, exist_ok=True)
    try:
        # --force twice: take over an entry that a killed `worktree add` left missing but locked
        # ("initializing"); the name is ours (one per candidate), so no live worktree is taken.
        repo.git.worktree("add", "--detach", "--force", "--force", str(path), want)
    except git.GitCommandError as e:
        raise EngineError(f"cannot add worktree {path} at {ref or checkout.base_sha}: {e.stderr.strip()}") from None
    _ADDED[path] = checkout
    return path


def remove_worktree(checkout: EngineCheckout, path: Path) -> None:
    with _WORKTREES:
        _remove_worktree(checkout, path)


def _remove_worktree(checkout: EngineCheckout, path: Path) -> None:
    _ADDED.pop(Path(path), None)
    try:
        checkout.repo.git.worktree("remove", "--force", "--force", str(path))  # twice: also a locked one
    except git.GitCommandError:
        shutil.rmtree(path, ignore_errors=True)
        checkout.repo.git.worktree("prune")


def release_worktrees(keep: tuple[str, ...] = ("base-",)) -> int:
    """Remove the worktrees this process added, except those whose names start with `keep` (a base
    worktree is one per engine commit, shared by every later job and the runner's zygote). Returns
    how many were removed."""
    with _WORKTREES:
        gone = [p for p in _ADDED if not p.name.startswith(keep)]
        for p in gone:
            try:
                _remove_worktree(_ADDED[p], p)
            except (git.GitError, OSError):  # the repository itself went away: the folder still goes
                shutil.rmtree(p, ignore_errors=True)
                _ADDED.pop(p, None)
        return len(gone)


def prune_orphan_worktrees(home: Path | None = None, all_but_base: bool = False) -> int:
    """Delete worktree folders under $OPTBOT_HOME/worktrees whose repository no longer has them (its
    `.git` file points at a gitdir that is gone: the repository was deleted, as a test's temporary
    engine is, or git pruned it); with all_but_base, every worktree but the base checkouts (a home no
    other process uses, as a test worker's). Returns how many were deleted; the repositories' own
    records of them go at their next `git worktree prune` (_remove_worktree runs one)."""
    root = (home or optbot_home()) / "worktrees"
    n = 0
    for wt in root.glob("*/*"):
        link = wt / ".git"
        try:
            gitdir = link.read_text().strip().removeprefix("gitdir:").strip()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, UnicodeDecodeError):
            continue  # not a linked worktree (or one being made): not ours to judge
        if (gitdir and not Path(gitdir).exists()) or (all_but_base and not wt.name.startswith("base-")):
            shutil.rmtree(wt, ignore_errors=True)
            n += 1
    for d in root.glob("*"):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return n
