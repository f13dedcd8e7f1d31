"""What the knowledge already holds about this run, and what the run adds about its stack.

The optimize stages ask here, never the bench.json files directly:
  entry_verdict     an entry's recorded GPU verdict, when it applies unchanged (generate, validate)
  searched          whether an entry's config space was already searched on this hardware (generate)
  learned_from      a replayed entry that an earlier run's generator produced (generate)
  stack_ablation    the leave-one-out an earlier run measured for exactly this stack (combine)
  record_stack_ablation   this run's measured leave-one-out, into the members' bench.json (learn)
  stack_check       an earlier run's correctness check of exactly this stack (combine)
  record_stack_checks     this run's stack checks, into the members' bench.json (learn)

All of it is keyed by RunKey: the store the run reads and what a recorded GPU result must match.
The matching rules themselves live in bot/knowledge/known.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bot.errors import OptbotError
from bot.trailers import trailer_values


@dataclass(frozen=True)
class RunKey:
    store_root: Path  # the kernel_store/ this run replays from
    workload: str
    hardware: str  # bot.hardware.hardware_name: "h200", "cpu"
    base_sha: str
    preset: str
    dtype: str
    on_cuda: bool
    revalidate: bool  # --revalidate: nothing recorded is reused
    env: dict = field(default_factory=dict)  # this run's baseline environment: torch, triton, device_name


def _entry(key: RunKey, entry_id: str):
    from bot.knowledge.store import get_entry
    try:
        return get_entry(entry_id, key.store_root)
    except OptbotError:
        return None


def entry_id_of(trailers: dict | None) -> str:
    return next(iter(trailer_values((trailers or {}).get("Optbot-Entry"))), "")


def entry_verdict(key: RunKey, entry_id: str):
    """(KnownVerdict | None, why not): the entry's recorded GPU verdict when it applies to this run
    unchanged. Only on CUDA, and not with --revalidate."""
    if not key.on_cuda or key.revalidate:
        return None, ""
    from bot.knowledge.known import known_verdict
    entry = _entry(key, entry_id)
    if entry is None:
        return None, ""
    return known_verdict(entry, key.workload, key.hardware, key.base_sha, key.preset, key.dtype, key.env)


def learned_from(key: RunKey, entry_ids: list[str], generator: str) -> str:
    """The id of a replayed entry that an earlier run's `generator` produced (provenance), or ""."""
    for eid in entry_ids:
        e = _entry(key, eid)
        if e is not None and e.provenance.kind == "generated" and e.provenance.agent == generator:
            return e.id
    return ""


def searched(key: RunKey, entry) -> str:
    """Why the entry's config space needs no search on this hardware, or "": a search for the same
    patch, torch and triton is recorded in its bench.json (bot/knowledge/records.record_search)."""
    if key.revalidate:
        return ""
    from bot.knowledge.known import patch_sha256
    gpu = entry.bench().gpu
    rec = gpu.variant_search.get(key.hardware) if gpu else None
    if (rec is not None and rec.patch_sha256 == patch_sha256(entry) and rec.torch == key.env.get("torch")
            and rec.triton == key.env.get("triton")):
        what = "adopted" if rec.adopted else f"{rec.status} ({(rec.reason or '')[:80]})"
        return f"searched in run {rec.run_id} on {key.hardware}: {rec.config} {what}"
    return ""


def stack_ablation(key: RunKey, commits: list, candidates: dict, stack_sha256: str,
                   rounds: int) -> tuple[dict, dict[str, object]] | None:
    """(the recorded leave-one-out of this exact stack, entry id -> this run's stack commit) when an
    earlier run measured it (bot/knowledge/known.known_ablation); None when it must be measured.
    `commits` are the stack's StackCommits, `candidates` the run's Candidates by id."""
    if key.revalidate:
        return None
    from bot.knowledge.known import known_ablation
    entries = _member_entries(key, [sc.candidate_id for sc in commits], candidates)
    if entries is None:
        return None  # a member that is no store entry (yet): nothing can be known about it
    rec, _why = known_ablation(list(entries.values()), key.workload, stack_sha256, key.hardware, key.base_sha,
                               key.preset, key.dtype, key.env, rounds)
    return None if rec is None else (rec, {entries[sc.candidate_id].id: sc for sc in commits})


def record_stack_ablation(key: RunKey, knowledge: Path, combine, candidates: dict, entry_of: dict[str, Path],
                          run_id: str, command: str) -> list[str]:
    """This run's measured leave-one-out (the combine step's Result; one known from an earlier run is
    not recorded again) into each member entry's bench.json in the knowledge copy `knowledge`
    (bot/knowledge/records.record_ablation), when every member is a store entry there (`entry_of`:
    candidate id -> an entry this run's learn step wrote; `candidates`: the run's Candidates by id).
    The files written, relative to `knowledge`."""
    from bot.knowledge.records import AblationRecord, AblationRecordRow, record_ablation

    ab = combine.ablation if combine else None
    if ab is None or combine.ablation_known_from or not ab.rows or not combine.stack_sha256:
        return []
    dirs = _member_dirs(knowledge, [sc.candidate_id for sc in combine.commits], candidates, entry_of)
    if dirs is None:
        return []  # a member with no entry: the record could never be matched
    rows = [AblationRecordRow(dirs[cid].name, r.without_ms, r.contribution_ms, r.contribution_pct)
            for r in ab.rows if (cid := combine.candidate_of(r.sha)) in dirs]
    written = []
    for d in dirs.values():  # one record per member: each file gets its own recorded_at
        rec = AblationRecord(**_stack_key(key, combine.stack_sha256), run_id=run_id, command=command, mode=ab.mode,
                             rounds=ab.rounds, device=ab.device, base_ms=ab.base_ms, stack_ms=ab.stack_ms,
                             noise_pct=ab.noise_pct, rows=rows)
        written.append(str(record_ablation(d, key.workload, rec).relative_to(knowledge)))
    return written


def _stack_key(key: RunKey, stack_sha256: str) -> dict:
    """This run's records.StackKey fields for the stack with this diff."""
    from bot.knowledge.known import stack_key
    return stack_key(stack_sha256, key.base_sha, key.preset, key.dtype, key.hardware, key.env)


def _member_dirs(knowledge: Path, candidate_ids: list[str], candidates: dict,
                 entry_of: dict[str, Path]) -> dict[str, Path] | None:
    """candidate id -> its entry folder in the knowledge copy `knowledge` (`entry_of`: the entries this
    run's learn step wrote), for every id; None when one has no entry there."""
    dirs = {}
    for cid in candidate_ids:
        c = candidates.get(cid)
        eid = entry_id_of(c.trailers) if c else ""
        d = entry_of.get(cid) or (knowledge / "kernel_store" / eid if eid else None)
        if d is None or not (d / "entry.yaml").is_file():
            return None
        dirs[cid] = d
    return dirs


def _member_entries(key: RunKey, candidate_ids: list[str], candidates: dict) -> dict | None:
    """candidate id -> its store Entry, for every id; None when one is no store entry."""
    out = {}
    for cid in candidate_ids:
        c = candidates.get(cid)
        eid = entry_id_of(c.trailers) if c else ""
        e = _entry(key, eid) if eid else None
        if e is None:
            return None
        out[cid] = e
    return out


def stack_check(key: RunKey, candidate_ids: list[str], candidates: dict, stack_sha256: str):
    """The recorded check (records.StackCheckRecord) of a stack with this diff and these members,
    from an earlier run on this hardware and software; None when it must be checked. Only on CUDA,
    not with --revalidate."""
    if not key.on_cuda or key.revalidate:
        return None
    from bot.knowledge.known import known_stack_check
    members = _member_entries(key, candidate_ids, candidates)
    if not members:
        return None
    return known_stack_check(list(members.values()), key.workload, stack_sha256, key.hardware, key.base_sha,
                             key.preset, key.dtype, key.env)


def record_stack_checks(key: RunKey, knowledge: Path, combine, candidates: dict, entry_of: dict[str, Path],
                        run_id: str, command: str) -> list[str]:
    """The stack checks this run made (the combine step's Result.checks; one taken from an earlier
    run is not recorded again) into each member entry's bench.json in the knowledge copy
    `knowledge`, when every member is a store entry there. GPU checks only. The files written,
    relative to `knowledge`."""
    from bot.knowledge.records import StackCheckRecord, record_stack_check

    if not key.on_cuda or combine is None:
        return []
    written: set[str] = set()
    for chk in combine.checks:
        if chk.known_from or not chk.stack_sha256:
            continue
        dirs = _member_dirs(knowledge, chk.candidate_ids, candidates, entry_of)
        if not dirs:
            continue  # a member with no entry: the record could never be matched
        rec = dict(_stack_key(key, chk.stack_sha256), entries=sorted(d.name for d in dirs.values()),
                   added=dirs[chk.added].name if chk.added in dirs else "", status=chk.status, reason=chk.reason,
                   summary=chk.summary[:600], run_id=run_id, command=command)
        for d in dirs.values():
            written.add(str(record_stack_check(d, key.workload, StackCheckRecord(**rec)).relative_to(knowledge)))
    return sorted(written)
