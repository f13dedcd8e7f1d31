"""Fan-out of one run's validation over several machines (docs/optimize.md, Fan-out).

GitHub Actions is the distributed engine: a plan job, a matrix of shard jobs, an aggregate job.
This module is what each of them runs; it holds no scheduling of its own.

  plan     a run stopped after generate (`optimize --stop-after generate`) -> a self-contained plan
           directory: plan.json (ShardPlan: which candidate goes to which shard), run/ (the run
           directory: state, step results, seeds, candidates.bundle) and knowledge/kernel_store
           (the store the run read: the kernel tests of Optbot-Entry candidates come from it).
  shard    one shard's candidates through the validate step's own code (steps.validate.
           validate_candidates: THE validator, the sandboxed runner) in a copy of the run
           directory; out: shard.json (ShardResult) and verdicts/<id>.json, each exactly the
           checkpoint the validate step keeps (bot/run/resume.save_checkpoint).
  merge    every shard's results, read as untrusted input (sizes bounded, no links, strict typed
           parse), checked against the plan: each planned candidate has exactly one verdict, from
           the shard it was assigned to, of this plan, for the planned commit. Only then are they
           written as the run's checkpoints; `optimize --resume` then validates nothing again and
           goes on with combine (the stack validated on the aggregate's machine), learn, deliver.
"""
from __future__ import annotations

import json
import platform
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bot import __version__
from bot.errors import OptbotError
from bot.jsonable import from_json, write_json_atomic
from bot.knowledge.records import now
from bot.paths import runs_dir
from bot.run.resume import BUNDLE, load_checkpoint, save_checkpoint
from bot.run.state import RunState
from bot.steps.validate import tuned_variants
from bot.trigger.grammar import MAX_SHARDS
from bot.validate.verdict import Verdict

VERSION = 1
PLAN, SHARD, VERDICTS = "plan.json", "shard.json", "verdicts"
SHA = re.compile(r"[0-9a-f]{40}")
CANDIDATE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
PLAN_ID = re.compile(r"[0-9a-f]{32}")
MAX_SHARD_JSON = 256 * 1024  # bytes of shard.json: ids and a few numbers
MAX_VERDICT_JSON = 4 * 1024 * 1024  # bytes of one verdict record (its logs are tails, its checks a few dozen)
MAX_FILES = 1000  # entries under one shard directory
# what a plan does not carry: runner outputs (tensors, traces) and the machine's base-output cache
_NOT_CARRIED = ("*.pt", "*.pt.tmp", "trace*.json", "base-cache", "__pycache__")


@dataclass(frozen=True)
class Planned:
    id: str
    commit_sha: str
    shard: int  # 1..shards


@dataclass
class ShardPlan:
    plan_id: str  # random: results of another plan (of this run or another) name another id
    run_id: str
    workload: str
    base_sha: str
    shards: int
    candidates: list[Planned]  # the candidates the shards measure, in the run's order
    # candidates that need no measuring: an applicable store verdict, or a checkpoint made before the plan
    not_sharded: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    version: int = VERSION

    def of(self, shard: int) -> list[Planned]:
        return [p for p in self.candidates if p.shard == shard]


@dataclass
class ShardResult:
    """What one shard job did, beside its verdicts/ (written by `shard validate`)."""
    plan_id: str
    run_id: str
    shard: int
    shards: int
    candidates: list[str]  # ids whose verdict is in verdicts/<id>.json
    not_validated: dict[str, str] = field(default_factory=dict)  # id -> why no verdict (budget spent)
    device: str = ""
    hardware: str = ""  # bot/hardware.hardware_name: cpu, h200, ...
    host: str = ""
    optbot: str = ""  # optbot's version on the shard's machine
    env: dict[str, Any] = field(default_factory=dict)  # the environment a verdict recorded (torch, triton, GPU)
    seconds: float = 0.0
    gpu_s: float = 0.0
    finished_at: str = ""
    version: int = VERSION


def parse_shard(text: str) -> tuple[int, int]:
    """"2/3" -> (2, 3)."""
    m = re.fullmatch(r"([1-9][0-9]?)/([1-9][0-9]?)", text.strip())
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise OptbotError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/3")
    return int(m[1]), int(m[2])


# ------------------------------------------------------------------------------------------------ plan

def assign(todo: list, shards: int) -> tuple[int, dict[str, int]]:
    """(how many shards, candidate id -> its shard 1..n): round-robin in the run's order over at most
    `shards`; a plain replay goes to its tuned variant's shard, which validates it only if the
    variant is not accepted (bot/steps/validate.py), so it is not a shard of its own."""
    variant_of = tuned_variants(todo)
    own = [c for c in todo if c.id not in variant_of]
    n = max(1, min(shards, len(own)))
    shard_of = {c.id: i % n + 1 for i, c in enumerate(own)}
    shard_of.update({cid: shard_of[v.id] for cid, v in variant_of.items()})
    return n, shard_of


def plan(run_id: str, shards: int, out: Path) -> ShardPlan:
    """The plan of run `run_id` (stopped after generate) for at most `shards` shards, written to
    `out` with everything a shard needs. Candidates go round-robin in the run's order, so the same
    run and count always give the same assignment; never more shards than candidates to measure. A
    plain replay goes with its tuned variant (bot/steps/validate.py: validated only if the variant is
    not accepted)."""
    from bot.knowledge.location import knowledge_of
    from bot.steps.validate import run_seeds

    if not 1 <= shards <= MAX_SHARDS:
        raise OptbotError(f"--shards {shards}: expected 1 to {MAX_SHARDS}")
    state = RunState.load(run_id)
    if not state.is_done("generate"):
        raise OptbotError(f"run {run_id} has not finished generate (next step: {state.next_step()}); plan a run "
                          f"made with: optbot optimize {state.workload} ... --stop-after generate")
    if state.is_done("validate"):
        raise OptbotError(f"run {run_id}: validate is already recorded; there is nothing to fan out "
                          f"(continue with: optbot optimize {state.workload} --resume {run_id})")
    if out.exists() and any(out.iterdir()):
        raise OptbotError(f"--out {out}: exists and is not empty; a plan is written into a new directory")
    gen, co = state.result("generate"), state.result("checkout")
    todo, skip = [], {}
    for c in gen.candidates:
        known = gen.known.get(c.id)
        if known is not None and known.status == "accepted":
            skip[c.id] = f"store verdict of {known.entry_id} applies unchanged (reused)"
        elif load_checkpoint(state.run_dir, c.id, c.commit_sha) is not None:
            skip[c.id] = "validated before the plan (checkpoint in the run directory)"
        else:
            todo.append(c)
    n, shard_of = assign(todo, shards)
    p = ShardPlan(plan_id=uuid.uuid4().hex, run_id=state.run_id, workload=state.workload, base_sha=co.base_sha,
                  shards=n, candidates=[Planned(c.id, c.commit_sha, shard_of[c.id]) for c in todo],
                  not_sharded=skip, created_at=now())
    run_seeds(state.run_dir)  # drawn now: every shard and the stack validate on the same seeds
    if not (state.run_dir / BUNDLE).is_file() and gen.candidates:
        raise OptbotError(f"{state.run_dir / BUNDLE}: missing; generate writes it with the candidate commits")
    write_json_atomic(state.run_dir / PLAN, p)  # the run remembers its plan (merge refuses any other); copied too
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(state.run_dir, out / "run", ignore=shutil.ignore_patterns(*_NOT_CARRIED))
    store = knowledge_of(state.options).kernel_store
    if store.is_dir():
        shutil.copytree(store, out / "knowledge" / "kernel_store", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (out / "knowledge" / "lessons").mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / PLAN, p)
    return p


def load_plan(path: Path) -> ShardPlan:
    """plan.json of a plan directory (or the file), checked: it travels as an artifact too."""
    f = path / PLAN if path.is_dir() else path
    data = _read_json(f, MAX_VERDICT_JSON, "the plan")
    try:
        p = from_json(ShardPlan, data, strict=True)
    except (TypeError, ValueError) as e:
        raise OptbotError(f"{f}: not a shard plan written by this optbot ({e})") from None
    why = ("" if p.version == VERSION else f"version {p.version}, this optbot reads {VERSION}") or \
        ("" if PLAN_ID.fullmatch(p.plan_id) else "plan_id is not 32 hex digits") or \
        ("" if 1 <= p.shards <= MAX_SHARDS else f"shards {p.shards} is not 1 to {MAX_SHARDS}") or \
        next((f"candidate {c.id!r} is not valid (id, 40-hex sha, shard 1..{p.shards})" for c in p.candidates
              if not (CANDIDATE_ID.fullmatch(c.id) and SHA.fullmatch(c.commit_sha) and 1 <= c.shard <= p.shards)), "")
    if why:
        raise OptbotError(f"{f}: not a valid shard plan: {why}")
    return p


# ------------------------------------------------------------------------------------------------ shard

def validate_shard(plan_dir: Path, shard: int, shards: int, out: Path,
                   log: Callable[[str], None] = print) -> ShardResult:
    """Shard `shard`/`shards` of the plan in `plan_dir`: its candidates through the validate step's
    own code in a copy of the run directory (under runs_dir(), named after the plan and shard; a
    retried shard keeps the verdicts it reached), the results into `out`."""
    import dataclasses

    from bot.jobs import LEDGER
    from bot.run.context import Budget, RunContext
    from bot.steps.validate import validate_candidates

    p = load_plan(plan_dir)
    if shards != p.shards:
        raise OptbotError(f"--shard {shard}/{shards}: plan {p.plan_id[:12]} of run {p.run_id} has {p.shards} "
                          f"shard(s)")
    if out.exists() and any(out.iterdir()):
        raise OptbotError(f"--out {out}: exists and is not empty; a shard writes into a new directory")
    work = runs_dir() / f"{p.run_id}.plan-{p.plan_id[:12]}.shard-{shard}-of-{shards}"
    if not (work / PLAN).is_file():
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(plan_dir / "run", work)
    state = RunState.load(p.run_id, at=work)
    opts = state.options
    if (plan_dir / "knowledge").is_dir():  # the store the plan's run read, not this machine's
        opts = dataclasses.replace(opts, knowledge_path=str((plan_dir / "knowledge").resolve()))
    gen = state.result("generate")
    by_id = gen.by_id() if gen else {}
    mine = []
    for planned in p.of(shard):
        c = by_id.get(planned.id)
        if c is None or c.commit_sha != planned.commit_sha:
            raise OptbotError(f"{plan_dir / PLAN}: candidate {planned.id} @ {planned.commit_sha[:12]} is not the "
                              f"run's (generate.json of {plan_dir / 'run'})")
        mine.append(c)
    ctx = RunContext(run_id=state.run_id, run_dir=work, options=opts,
                     budget=Budget(opts.budget_wall_s, opts.budget_cost_usd), results=state.results(), log=log)
    t0, gpu0 = time.monotonic(), LEDGER.snapshot().get("cuda", 0.0)
    log(f"shard {shard}/{shards} of plan {p.plan_id[:12]} (run {p.run_id}): {len(mine)} candidate(s): "
        + (", ".join(c.id for c in mine) or "none"))
    verdicts, superseded = validate_candidates(ctx, mine) if mine else ({}, {})
    out.mkdir(parents=True, exist_ok=True)
    (out / VERDICTS).mkdir()
    done, missing = [], {}
    for c in mine:
        f = work / "validate" / c.id / "verdict-record.json"
        if c.id in superseded:
            missing[c.id] = f"not validated: its tuned variant {superseded[c.id]} was accepted"
            continue
        if load_checkpoint(work, c.id, c.commit_sha) is None:
            missing[c.id] = verdicts[c.id].summary or "no verdict was reached"
            continue
        shutil.copyfile(f, out / VERDICTS / f"{c.id}.json")  # byte for byte what validate checkpointed
        done.append(c.id)
    env = next((v.env for v in verdicts.values() if v.env), {})
    res = ShardResult(plan_id=p.plan_id, run_id=p.run_id, shard=shard, shards=shards, candidates=done,
                      not_validated=missing, device=ctx.target.device if mine else "", host=platform.node(),
                      hardware=ctx.hardware() if mine else "", optbot=__version__, env=env,
                      seconds=round(time.monotonic() - t0, 2),
                      gpu_s=round(LEDGER.snapshot().get("cuda", 0.0) - gpu0, 2), finished_at=now())
    write_json_atomic(out / SHARD, res)
    return res


# ------------------------------------------------------------------------------------------------ merge

@dataclass
class Merged:
    plan_id: str
    run_id: str
    workload: str
    verdicts: dict[str, str]  # candidate id -> status
    shards: list[ShardResult]

    def line(self) -> str:
        n_ok = sum(s == "accepted" for s in self.verdicts.values())
        return (f"merged {len(self.verdicts)} verdict(s) ({n_ok} accepted) from {len(self.shards)} shard(s) of plan "
                f"{self.plan_id[:12]} into run {self.run_id}")


def merge(plan_dir: Path, shard_dirs: list[Path]) -> Merged:
    """The shards' verdicts into the run's checkpoints, all or nothing, after every check. The run
    directory comes from the plan when this machine does not hold it (the aggregate job)."""
    p = load_plan(plan_dir)
    run_dir = runs_dir() / p.run_id
    if not run_dir.is_dir():
        shutil.copytree(plan_dir / "run", run_dir)
    ours = load_plan(run_dir / PLAN) if (run_dir / PLAN).is_file() else None
    if ours is None or ours.plan_id != p.plan_id:
        raise OptbotError(f"{plan_dir / PLAN}: plan {p.plan_id[:12]} is not the plan of run {p.run_id} in {run_dir} "
                          f"({'it has none' if ours is None else 'that is ' + ours.plan_id[:12]}); merge the plan "
                          f"the shards ran")
    state = RunState.load(p.run_id)
    if state.is_done("validate"):
        raise OptbotError(f"run {p.run_id}: validate is already recorded; nothing to merge")
    planned = {c.id: c for c in p.candidates}
    got: dict[str, tuple[Path, Verdict]] = {}
    results: dict[int, tuple[Path, ShardResult]] = {}
    for d in shard_dirs:
        f = d / SHARD
        r = _shard_result(f)
        if r.plan_id != p.plan_id or r.run_id != p.run_id:
            raise OptbotError(f"{f}: a result of plan {r.plan_id[:12]} of run {r.run_id}, not of plan "
                              f"{p.plan_id[:12]} of run {p.run_id}; refused")
        if r.shards != p.shards or not 1 <= r.shard <= p.shards:
            raise OptbotError(f"{f}: shard {r.shard}/{r.shards}; the plan has {p.shards} shard(s)")
        if r.shard in results:
            raise OptbotError(f"{f}: shard {r.shard}/{r.shards} again (also {results[r.shard][0]}); each shard's "
                              f"result is merged once")
        results[r.shard] = (f, r)
        assigned = {c.id for c in p.of(r.shard)}
        _check_layout(d, r)
        for cid in r.candidates:
            vf = d / VERDICTS / f"{cid}.json"
            if cid in got:
                raise OptbotError(f"{vf}: a second verdict for {cid} (the first from {got[cid][0]}); refused")
            if cid not in assigned:
                where = f"shard {planned[cid].shard}" if cid in planned else "no shard: it is not in the plan"
                raise OptbotError(f"{vf}: {cid} is not shard {r.shard}'s to validate (the plan gives it to {where})")
            got[cid] = (vf, _verdict(vf, planned[cid], p))
    absent = [s for s in range(1, p.shards + 1) if s not in results]
    if absent:
        raise OptbotError(f"plan {p.plan_id[:12]} of run {p.run_id}: no result of shard(s) "
                          f"{', '.join(f'{s}/{p.shards}' for s in absent)} among {', '.join(map(str, shard_dirs))}")
    lost = without_verdict(p.candidates, {cid: v for cid, (_, v) in got.items()}, state.result("generate").candidates)
    if lost:
        why = {cid: w for _, r in results.values() for cid, w in r.not_validated.items()}
        raise OptbotError("no verdict for " + "; ".join(
            f"{c.id} (shard {c.shard}/{p.shards}, {results[c.shard][0]}: {why.get(c.id, 'not in its result')})"
            for c in lost))
    for cid, (_, v) in got.items():
        save_checkpoint(run_dir, cid, planned[cid].commit_sha, v)
    # the shards' time counts as the validate step's: wall seconds of the slowest shard, GPU seconds of all
    state.partial["validate"] = {"seconds": max(r.seconds for _, r in results.values()),
                                 "gpu_s": round(sum(r.gpu_s for _, r in results.values()), 2)}
    state.save()
    return Merged(p.plan_id, p.run_id, p.workload, {cid: v.status for cid, (_, v) in got.items()},
                  [r for _, (_, r) in sorted(results.items())])


def without_verdict(planned: list[Planned], got: dict[str, Verdict], candidates: list) -> list[Planned]:
    """The planned candidates no shard gave a verdict for, but a replay whose tuned variant (in its
    shard) was accepted: that shard rightly did not validate it (bot/steps/validate.py)."""
    variant_of = tuned_variants(candidates)
    return [c for c in planned if c.id not in got
            and not (c.id in variant_of and variant_of[c.id].id in got and got[variant_of[c.id].id].accepted)]


def _read_json(f: Path, limit: int, what: str) -> Any:
    """JSON of a regular file of at most `limit` bytes (never through a link)."""
    if f.is_symlink() or not f.is_file():
        raise OptbotError(f"{f}: {'a link' if f.is_symlink() else 'missing'}; {what} must be a regular file")
    size = f.stat().st_size
    if size > limit:
        raise OptbotError(f"{f}: {size} bytes, more than the {limit} allowed for {what}")
    try:
        return json.loads(f.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise OptbotError(f"{f}: {what} is not JSON ({e})") from None


def _shard_result(f: Path) -> ShardResult:
    try:
        r = from_json(ShardResult, _read_json(f, MAX_SHARD_JSON, "a shard result"), strict=True)
    except (TypeError, ValueError) as e:
        raise OptbotError(f"{f}: not a shard result written by this optbot ({e})") from None
    if r.version != VERSION:
        raise OptbotError(f"{f}: shard result version {r.version}; this optbot reads {VERSION}")
    bad = [c for c in r.candidates if not CANDIDATE_ID.fullmatch(c)]
    if bad or len(set(r.candidates)) != len(r.candidates):
        raise OptbotError(f"{f}: candidates {r.candidates[:5]!r}: ids must be distinct and plain")
    return r


def _check_layout(d: Path, r: ShardResult) -> None:
    """A shard directory holds shard.json and verdicts/<id>.json for the ids it names, nothing else."""
    entries = list(d.rglob("*"))
    if len(entries) > MAX_FILES:
        raise OptbotError(f"{d}: more than {MAX_FILES} entries; not a shard result")
    want = {d / SHARD, d / VERDICTS} | {d / VERDICTS / f"{c}.json" for c in r.candidates}
    extra = sorted(str(e) for e in entries if e not in want)
    links = sorted(str(e) for e in entries if e.is_symlink())
    if links or extra:
        what = "links (refused: a result is regular files)" if links else "files shard.json does not name"
        raise OptbotError(f"{d / SHARD}: the shard directory holds {what}: {', '.join((links or extra)[:5])}")


def _verdict(f: Path, c: Planned, p: ShardPlan) -> Verdict:
    """verdicts/<id>.json: the record save_checkpoint writes ({"sha", "verdict"}), for the planned commit."""
    data = _read_json(f, MAX_VERDICT_JSON, "a verdict record")
    if not (isinstance(data, dict) and set(data) == {"sha", "verdict"}):
        raise OptbotError(f"{f}: not a verdict record (expected the keys sha and verdict)")
    try:
        v = from_json(Verdict, data["verdict"], strict=True)
    except (TypeError, ValueError) as e:
        raise OptbotError(f"{f}: not a verdict written by this optbot ({e})") from None
    for what, have in (("record's sha", data["sha"]), ("verdict's candidate_sha", v.candidate_sha)):
        if have != c.commit_sha:
            raise OptbotError(f"{f}: the {what} {str(have)[:40]!r} is not {c.id}'s planned commit "
                              f"{c.commit_sha}; refused")
    if v.base_sha != p.base_sha:
        raise OptbotError(f"{f}: measured against base {v.base_sha[:12]}, the run's base is {p.base_sha[:12]}; refused")
    return v
