"""A validation that resumes: the runner processes an earlier attempt finished are kept, with the seeds
they ran on.

A GPU validation is a handful of runner processes of minutes each (the candidate's, the base's, the
unquantized reference's, the kernel tests, the timed pairs). Stopped from outside (a device call's time
limit, a CI timeout, a lost machine), it used to start again from nothing: new seeds, every process
again; a diffusers Qwen-Image FP8 validation in four modes never fitted one 600 s call. Now, when the
run directory (Options.run_dir) holds an earlier attempt at the same candidate and base, the
validation draws no new seeds and reuses each process that finished: its outcome, written by the bot
once the child's report had passed bot/jobs' checks, into `done/`, a folder no runner child may write
(a child writes only its own output folder and scratch: bot/sandbox.py).

The candidate and base are matched by their git trees, not commit shas: `store check` commits an
entry's patch anew on every invocation (a new sha for the same code). Each process is matched by its
whole job (seeds, weights, shapes, modes, output folder, engine tree) and reused only if every output file
its result names is still there.

Why this keeps the validator's guarantees (docs/validate.md, docs/security.md): the seeds stay the
attempt's secret until the candidate's correctness process runs, and the base's outputs are made only
after that process has finished, in every attempt (the order of the jobs does not change, and a base
process is reused only from an attempt where the candidate's finished before it). A candidate process
cut in an earlier attempt saw the seeds and nothing of the base. Every verdict is still decided from
outputs compared in a clean process.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path

from bot.jobs import JobOutcome

ATTEMPT = "attempt.json"
DONE = "done"


def tree_of(repo, sha: str) -> str:
    """The git tree of `sha` in `repo` (gitpython), or sha itself where the repository lacks it."""
    from gitdb.exc import ODBError

    try:
        return repo.commit(sha).tree.hexsha
    except (ODBError, ValueError):  # BadName, BadObject: not in this repository
        return sha


def begin(run_dir: Path, ident: dict, seeds: list[int] | None, weight_seed: int | None,
          fresh) -> tuple[list[int], int, bool]:
    """(seeds, weight seed, resumed). `ident`: what makes two attempts the same validation (trees,
    workload, preset, device, dtype); `seeds`, `weight_seed`: the caller's, where it fixes them;
    `fresh(n)`: n fresh seeds. An earlier attempt that matches gives its seeds; otherwise its finished
    processes are removed and this attempt is recorded."""
    f = run_dir / ATTEMPT
    if f.is_file():
        try:
            old = json.loads(f.read_text())
        except ValueError:
            old = {}
        if (old.get("ident") == ident and (seeds is None or old.get("seeds") == list(seeds))
                and (weight_seed is None or old.get("weight_seed") == weight_seed)):
            return list(old["seeds"]), int(old["weight_seed"]), True
    shutil.rmtree(run_dir / DONE, ignore_errors=True)
    new_seeds = list(seeds) if seeds else fresh(3)
    weight_seed = weight_seed if weight_seed is not None else fresh(1)[0]
    run_dir.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"ident": ident, "seeds": new_seeds, "weight_seed": weight_seed}, indent=2))
    return new_seeds, weight_seed, False


def job_key(job, tree: str) -> str:
    """The job as run, its engine commit and worktree replaced by that commit's tree (a worktree is named
    by its commit, and the same code committed again gets another)."""
    spec = {**asdict(job), "engine_sha": tree, "engine_root": tree}
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def _files(result: dict) -> list[str]:
    return [r["file"] for r in result.get("runs", []) if r.get("file")] + list((result.get("mode_outputs") or {}).values())


def reuse(run_dir: Path, name: str, key: str) -> JobOutcome | None:
    """The finished process `name` of an earlier attempt, when it ran exactly this job and its outputs remain."""
    f = run_dir / DONE / f"{name}.json"
    if not f.is_file():
        return None
    try:
        d = json.loads(f.read_text())
        out = JobOutcome(**d["outcome"])
    except (ValueError, KeyError, TypeError):
        return None
    if d.get("key") != key or not out.ok or not all(Path(p).is_file() for p in _files(out.result)):
        return None
    return out


def keep(run_dir: Path, name: str, key: str, out: JobOutcome) -> None:
    """Record a finished process (atomically: a stop while writing leaves the earlier file or none)."""
    d = run_dir / DONE
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{name}.json.tmp"
    tmp.write_text(json.dumps({"key": key, "outcome": out.__dict__}, default=str))
    tmp.replace(d / f"{name}.json")
