"""The commit being validated (a Revision), resolved from a candidate REF or a patch file.

A candidate REF is either a commit/branch of the engine repository on top of the base, or a path to
a patch file. A patch file is applied onto the base in a fresh worktree and committed there
deterministically (fixed author and date), so the same patch on the same base always gives the same
sha. Text before the first ``diff --git`` of a plain patch is its commit message (trailers
included); an mbox patch (``git format-patch``) is applied with ``git am`` and keeps its own message.

Metadata travels in git trailers of the commit messages (DESIGN decision 5):
  Optbot-Opportunity, Optbot-Kind, Optbot-Adds-Kernels, Optbot-Removes-Kernels, Optbot-Entry,
  Optbot-Kernel-Tests (paths in the engine repository of kernel test modules, docs/validate.md).
Comma-separated values; a stack's trailers are the union over its commits.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import git

from bot.engine import BOT_ACTOR, FIXED_DATE, EngineCheckout, add_worktree
from bot.errors import OptbotError
# the validator reads trailer values as lists ("none" = no values); bot/trailers.py is the one parser
from bot.trailers import parse_trailer_lists as parse_trailers

# what gitpython raises for a ref that names no commit: "nope", "HEAD~999", "HEAD@{1000}" (IndexError)
BAD_REF = (git.BadName, ValueError, IndexError, git.GitCommandError)

GIT_ENV = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE,
           "GIT_AUTHOR_NAME": BOT_ACTOR.name, "GIT_AUTHOR_EMAIL": BOT_ACTOR.email,
           "GIT_COMMITTER_NAME": BOT_ACTOR.name, "GIT_COMMITTER_EMAIL": BOT_ACTOR.email}


@dataclass
class Revision:
    """The commit being validated, in its own worktree (not bot/generate's Candidate, which is what a
    generator proposes)."""
    spec: str  # what the user passed
    sha: str
    base_sha: str
    worktree: Path
    commits: list[tuple[str, str]] = field(default_factory=list)  # (sha, subject), oldest first
    trailers: dict[str, list[str]] = field(default_factory=dict)


def resolve_base(checkout: EngineCheckout, base: str | None) -> str:
    if base is None:
        return checkout.base_sha
    try:
        return checkout.repo.commit(base).hexsha
    except BAD_REF:
        raise OptbotError(f"--base {base!r}: no such commit or branch in engine repository {checkout.repo_path}") from None


def resolve_candidate(checkout: EngineCheckout, spec: str, base_sha: str) -> Revision:
    repo = checkout.repo
    p = Path(spec)
    if p.is_file():
        sha, wt = _commit_patch(checkout, p, base_sha)
    else:
        try:
            sha = repo.commit(spec).hexsha
        except BAD_REF:
            raise OptbotError(f"--candidate {spec!r}: neither a patch file nor a commit/branch of the engine "
                              f"repository {checkout.repo_path}") from None
        wt = add_worktree(checkout, f"cand-{sha[:12]}", sha)
    if sha == base_sha:
        raise OptbotError(f"--candidate {spec!r} is the base commit {base_sha[:12]} itself: nothing to validate")
    if not repo.is_ancestor(base_sha, sha):
        raise OptbotError(f"--candidate {spec!r} ({sha[:12]}) is not on top of the base {base_sha[:12]}; "
                          f"rebase it, or pass --base")
    commits = [(c.hexsha, c.summary) for c in repo.iter_commits(f"{base_sha}..{sha}")][::-1]
    trailers: dict[str, list[str]] = {}
    for c in repo.iter_commits(f"{base_sha}..{sha}"):
        for k, vs in parse_trailers(c.message).items():
            trailers.setdefault(k, [])
            trailers[k] += [v for v in vs if v not in trailers[k]]
    return Revision(spec, sha, base_sha, wt, commits, trailers)


def candidate_labels(specs: list[str]) -> list[str]:
    """Row names of several candidates (bench): "candidate" for one, else candidate:<name>, a patch
    file named by its store entry's folder (kernel_store/<entry>/patch.diff) or its stem, a ref by
    itself; a name already taken gets #2, #3 (two patch.diff rows once shared one name)."""
    if len(specs) == 1:
        return ["candidate"]
    out: list[str] = []
    for spec in specs:
        p = Path(spec)
        name = (p.parent.name if p.name == "patch.diff" and p.parent.name else p.stem) if p.is_file() else spec
        label, n = f"candidate:{name}", 1
        while label in out:
            n += 1
            label = f"candidate:{name}#{n}"
        out.append(label)
    return out


def _commit_patch(checkout: EngineCheckout, patch: Path, base_sha: str) -> tuple[str, Path]:
    try:
        text = patch.read_text()
    except UnicodeDecodeError as e:
        raise OptbotError(f"{patch}: not a text patch (byte {e.start} is not UTF-8); expected a git patch "
                          f"(`git diff` or `git format-patch` output)") from None
    digest = hashlib.sha256((base_sha + text).encode()).hexdigest()[:12]
    wt = add_worktree(checkout, f"patch-{patch.stem}-{digest}", base_sha)
    repo = git.Repo(wt)
    if repo.head.commit.hexsha != base_sha or repo.is_dirty(untracked_files=True):
        repo.git.reset("--hard", base_sha)
        repo.git.clean("-fdx")
    try:
        if text.startswith("From "):
            repo.git.am("--committer-date-is-author-date", str(patch.resolve()), env=GIT_ENV)
        else:
            i = text.find("diff --git")
            if i < 0:
                raise OptbotError(f"{patch}: no 'diff --git' in the file; expected a git patch")
            message = text[:i].strip() or f"candidate from {patch.name}"
            repo.git.apply("--index", "--whitespace=nowarn", str(patch.resolve()))
            repo.git.commit("-q", "--no-gpg-sign", "--no-verify", "-m", message, env=GIT_ENV)
    except git.GitCommandError as e:
        try:
            repo.git.am("--abort")
        except git.GitCommandError:
            pass
        repo.git.reset("--hard", base_sha)
        raise OptbotError(f"{patch}: does not apply onto base {base_sha[:12]}: "
                          f"{(e.stderr or str(e)).strip().splitlines()[-1][:300]}") from None
    return repo.head.commit.hexsha, wt
