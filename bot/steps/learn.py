"""Step 8, learn: verdicts -> knowledge the next run starts from (bot/knowledge/learn.py).

An accepted candidate becomes a kernel_store entry (a replayed entry gets a history row instead),
a rejection a caveat lesson, and so does every failed attempt of an agent that was not handed on
(generate's `attempts`, judged by the agent's own calls of the validator); the stack's measured
leave-one-out and every finished variant search are recorded in the member entries' bench.json. All of it is written into a staging copy of the
knowledge in the run directory, never into the knowledge repository's working tree; deliver commits
what changed to the knowledge branch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bot.knowledge import recall
from bot.knowledge.learn import Outcome, learn, stack_lesson
from bot.knowledge.records import VariantSearch, read_bench, record_search
from bot.run.context import RunContext
from bot.run.resume import staged_changes, staging_copy
from bot.trailers import trailer_values


@dataclass
class Result:
    status: str
    reason: str
    knowledge_root: str = ""
    files: list[str] = field(default_factory=list)  # relative to knowledge_root
    entries: list[str] = field(default_factory=list)
    lessons: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return self.reason


def _outcome(ctx: RunContext, c, v) -> Outcome:
    """What learn is told about candidate `c` and its Verdict `v`."""
    t = ctx.target
    repo, base = t.checkout.repo, t.checkout.base_sha
    added = {f: repo.git.show(f"{c.commit_sha}:{f}", strip_newline_in_stdout=False) for f in
             repo.git.diff(base, c.commit_sha, "--name-only", "--diff-filter=A").splitlines() if f}
    kt = c.trailers
    return Outcome(candidate_id=c.id, kind=c.kind, generator=c.generator, run_id=ctx.run_id, status=v.status,
                   reason=(v.reason or "accepted") + (f": {v.summary}" if v.summary else ""),
                   numbers={s.mode: {"speedup": s.speedup, "device": s.device, "outcome": s.outcome} for s in v.speed},
                   device=(v.env or {}).get("device_kind") or v.device or t.device, hardware=ctx.hardware(),
                   engine=t.engine_name or t.workload.default_engine, engine_source=str(t.checkout.repo_path),
                   base_sha=base, commit_sha=c.commit_sha, title=c.title, patch=repo.git.diff(base, c.commit_sha),
                   verdict=v.to_json(), command=ctx.options.command, config=kt.get("Optbot-Config", ""),
                   changed_files=repo.git.diff(base, c.commit_sha, "--name-only").splitlines(), added_files=added,
                   workload=t.workload.name, dtype=t.dtype,
                   adds_kernels=trailer_values(kt.get("Optbot-Adds-Kernels")),
                   removes_kernels=trailer_values(kt.get("Optbot-Removes-Kernels")), validated_by="bot.validate",
                   entry_id=next(iter(trailer_values(kt.get("Optbot-Entry"))), "")
                   if c.generator in ("replay", "variant-search") else "",
                   config_space=_template_config_space(ctx, c.commit_sha) if c.generator == "template" else {})


def _template_config_space(ctx: RunContext, sha: str) -> dict:
    """The config space the template generator wrote into the run's template/<entry>/ for commit
    `sha` before validation: the learned entry keeps it, so that variant search can tune it."""
    for f in sorted((ctx.run_dir / "template").glob("*/bench.json")):
        b = read_bench(f)
        if b is not None and b.engine_sha == sha:
            return (yaml.safe_load((f.parent / "entry.yaml").read_text()) or {}).get("config_space") or {}
    return {}


def _stack_lessons(ctx: RunContext, root: Path, cands: dict) -> list[str]:
    """A caveat lesson per member whose addition broke the stack in this run's combine (its checks
    taken from an earlier run were written by that run)."""
    comb, out = ctx.results.combine, []
    t = ctx.target

    def name(cid: str) -> str:  # the store entry a candidate replays, else the candidate
        return recall.entry_id_of(cands[cid].trailers) or cid if cid in cands else cid

    for chk in comb.checks if comb else []:
        if chk.added and not chk.passed and not chk.known_from:
            f = stack_lesson(name(chk.added), [name(c) for c in chk.candidate_ids if c != chk.added],
                             cands[chk.added].kind if chk.added in cands else "", t.engine_name or
                             t.workload.default_engine, t.workload.name, ctx.hardware(), chk.reason or chk.status,
                             chk.summary, ctx.run_id, root / "lessons")
            out.append(str(f.relative_to(root)))
    return out


def run(ctx: RunContext) -> Result:
    gen, val = ctx.results.generate, ctx.results.validate
    verdicts = val.verdicts if val else {}
    searches = gen.searches if gen else []
    attempts = [a for a in (gen.attempts if gen else []) if a.verdict.status != "accepted"]
    if not verdicts and not searches and not attempts:
        return Result("skipped", "nothing validated, nothing to learn")
    known_root = ctx.knowledge().root
    root = staging_copy(known_root, ctx.run_dir / "knowledge-staging")
    cands = gen.by_id()
    judged = [(cands.get(cid), v) for cid, v in verdicts.items()] + [(a.candidate, a.verdict) for a in attempts]
    entries, lessons = [], []
    entry_of: dict[str, Path] = {}  # candidate id -> its store entry in the staging copy
    for c, v in judged:
        if c is None or v.reused_from:
            continue  # a reused store verdict is already the store's knowledge
        learned = learn(_outcome(ctx, c, v), store_dir=root / "kernel_store", lessons_dir=root / "lessons")
        if learned.entry_dir:
            entry_of[c.id] = Path(learned.entry_dir)
            entries.append(str(Path(learned.entry_dir).relative_to(root) / "entry.yaml"))
        if learned.lesson_path:
            lessons.append(str(Path(learned.lesson_path).relative_to(root)))
    recall.record_stack_ablation(ctx.run_key(), root, ctx.results.combine, cands, entry_of, ctx.run_id,
                                 ctx.options.command)
    recall.record_stack_checks(ctx.run_key(), root, ctx.results.combine, cands, entry_of, ctx.run_id,
                               ctx.options.command)
    lessons += _stack_lessons(ctx, root, cands)
    env = ctx.env()
    for sr in searches:  # a search that kept the entry's config is finished: not searched again
        d = root / "kernel_store" / sr.entry_id
        if (d / "entry.yaml").is_file():
            record_search(d, ctx.hardware(), VariantSearch(run_id=ctx.run_id, config=sr.config, status=sr.status,
                                                           reason=sr.reason, adopted=False, torch=env.get("torch"),
                                                           triton=env.get("triton")))
    # what to commit is what was written, found by comparison with the knowledge the run read
    # (an adopted variant rewrites its entry's patch.diff and kernel sources; no learner reports it)
    files = staged_changes(known_root, root)
    hist = sum(1 for f in files if f.endswith("bench.json") and f.split("/")[1] not in {Path(e).parts[1] for e in entries})
    return Result("done", f"{len(entries)} entries, {len(lessons)} lessons"
                  + (f", {hist} entry histories" if hist else ""), str(root), files, entries, lessons)
