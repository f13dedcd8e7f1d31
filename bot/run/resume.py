"""What lets a run continue where it stopped, on this machine or another (docs/optimize.md, Resume).

- Checkpoints: each candidate's verdict is kept as soon as it is reached
  (validate/<id>/verdict-record.json, with the commit sha), so a run stopped half-way through the
  validate step does not validate those candidates again.
- Bundle: the candidate commits and the stack, as a git bundle in the run directory. A run resumed
  on another machine (an ephemeral runner, a new GPU lease) fetches them into its freshly
  materialized engine repository, which has the same base sha (engine repositories are deterministic).
- Staging: what the learn step writes goes into a copy of the knowledge in the run directory, never
  into the knowledge repository's working tree (deliver commits it to the knowledge branch).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import git

from bot.errors import OptbotError
from bot.jsonable import from_json, write_json_atomic
from bot.validate.verdict import Verdict

BUNDLE = "candidates.bundle"


def save_checkpoint(run_dir: Path, cid: str, sha: str, verdict: Verdict) -> None:
    f = run_dir / "validate" / cid / "verdict-record.json"
    f.parent.mkdir(parents=True, exist_ok=True)  # the validator may have stopped before making it
    write_json_atomic(f, {"sha": sha, "verdict": verdict})


def load_checkpoint(run_dir: Path, cid: str, sha: str) -> Verdict | None:
    """The Verdict saved for this candidate id AND commit; another commit under the id: None."""
    f = run_dir / "validate" / cid / "verdict-record.json"
    if not f.is_file():
        return None
    d = json.loads(f.read_text())
    return from_json(Verdict, d["verdict"]) if d.get("sha") == sha else None


def bundle_candidates(repo: git.Repo, run_dir: Path, run_id: str, shas: list[str]) -> str:
    """Write (or rewrite) the run's bundle with these commits; refs/optbot/<run>/c<i> name them."""
    refs = []
    for i, sha in enumerate(shas):
        ref = f"refs/optbot/{run_id}/c{i}"
        repo.git.update_ref(ref, sha)
        refs.append(ref)
    f = run_dir / BUNDLE
    repo.git.bundle("create", str(f), *refs)
    return f"candidate commits bundled in {f.name} (for a resume on another machine)"


def fetch_candidates(checkout, run_dir: Path, run_id: str, results) -> None:
    """On resume: commits of the run's candidates (and stack) missing from this machine's engine
    repository come from the bundle, and the stack branch is set again. Without them the run stops
    with a message naming the missing commits. `results`: the run's Results (bot/run/state.py)."""
    repo = checkout.repo
    shas = [c.commit_sha for c in results.generate.candidates] if results.generate else []
    comb = results.combine
    if comb and comb.commits:
        shas.append(comb.head_sha)

    def missing() -> list[str]:
        out = []
        for sha in shas:
            try:
                repo.commit(sha)
            except (ValueError, git.BadName):
                out.append(sha)
        return out

    if not missing():
        return
    f = run_dir / BUNDLE
    if f.is_file():
        repo.git.fetch("-q", str(f), "refs/optbot/*:refs/optbot/*")
    gone = missing()
    if gone:
        raise OptbotError(f"resume of {run_id}: candidate commits {', '.join(s[:12] for s in gone)} are not in "
                          f"{checkout.repo_path}" + ("" if f.is_file() else f" and {f} does not exist"))
    if comb and comb.commits:
        repo.git.update_ref(f"refs/heads/{comb.branch}", comb.head_sha)


def staging_copy(root: Path, staging: Path) -> Path:
    """A fresh copy of root's kernel_store/ and lessons/ for the learn step to write into; a resumed
    run starts its copy again."""
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for sub in ("kernel_store", "lessons"):
        if (root / sub).is_dir():
            shutil.copytree(root / sub, staging / sub, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return staging


def staged_changes(root: Path, staging: Path) -> list[str]:
    """Every file under the staging copy's kernel_store/ and lessons/ that is new or differs from
    root's: what the learn step wrote, found by comparing bytes, so nothing a learner writes (an
    adopted variant's patch.diff and kernel sources, a bench.json record, a lesson) can be left out
    of the knowledge commit by a caller that forgot to report it. Paths relative to `staging`."""
    out = []
    for sub in ("kernel_store", "lessons"):
        for p in sorted((staging / sub).rglob("*")) if (staging / sub).is_dir() else []:
            if not p.is_file() or "__pycache__" in p.parts or p.suffix == ".pyc":
                continue
            rel = p.relative_to(staging)
            old = root / rel
            if not old.is_file() or old.read_bytes() != p.read_bytes():
                out.append(rel.as_posix())
    return out
