"""Step 5, generate: candidates from the opportunities, one engine commit each in its own worktree.

The generators (bot/generate/), in order: store replay (every matching kernel_store entry), the
template generator (norm + elementwise and elementwise chains written by rule, skipped where a
replayed entry covers the opportunity or its statement), variant
search (a replayed entry's config space, on a GPU), compile region (the hot repeated blocks under
torch.compile, on a GPU) and the Anthropic agent (with ANTHROPIC_API_KEY; on the uncovered
opportunities in rank order while its budget lasts). What the knowledge holds
for this run (bot/knowledge/recall.py) decides what is not generated again: a known-rejected entry
is skipped, an entry a person declined in review (unchanged patch, same engine and workload) is not
proposed again, a searched config space is not searched again, a learned compile region is replayed.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from bot.analyze.opportunity import Opportunity
from bot.generate.candidate import Candidate
from bot.knowledge import recall
from bot.knowledge.known import KnownVerdict
from bot.knowledge.store import load_store
from bot.run.context import RunContext
from bot.run.resume import bundle_candidates
from bot.trailers import parse_trailers
from bot.validate.verdict import Verdict


@dataclass
class Search:
    """A finished variant search that kept the entry's own config (no candidate): learn records it
    so the space is not searched again on this hardware."""
    entry_id: str
    config: str  # the kept config's label, e.g. "block_m=16,num_warps=4"
    status: str
    reason: str


@dataclass
class Attempt:
    """An agent's candidate that was not handed to validation (another agent's was stronger), with
    the verdict of the agent's own validation: the learn step writes a caveat lesson of a failed one."""
    candidate: Candidate
    verdict: Verdict


@dataclass
class Result:
    status: str
    reason: str
    candidates: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    agent_cost_usd: float = 0.0
    searches: list[Search] = field(default_factory=list)
    # candidate id -> the store's recorded GPU verdict that applies unchanged (validate reuses it)
    known: dict[str, KnownVerdict] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)  # the agents' failed attempts besides the best

    def summary(self) -> str:
        return self.reason

    def by_id(self) -> dict[str, Candidate]:
        return {c.id: c for c in self.candidates}


def _complete(ctx: RunContext, c: Candidate, n: int, opps: list[Opportunity]) -> Candidate:
    """A generator's candidate with what the run keeps of its commit: the message, its trailers, and
    the estimated gain: the generator's own where it set one (a template kernel at several places
    sums their opportunities), else that of the opportunity it names."""
    commit = ctx.target.checkout.repo.commit(c.commit_sha)
    trailers = parse_trailers(commit.message)
    opp_id = c.opportunity_id or trailers.get("Optbot-Opportunity", "")
    gain = next((o.gain_ms for o in opps if o.id == opp_id), None)
    return dataclasses.replace(c, id=c.id or f"c{n + 1}", title=c.title or commit.summary, description=commit.message,
                               trailers=trailers, kind=c.kind or trailers.get("Optbot-Kind", ""), opportunity_id=opp_id,
                               estimated_gain_ms=c.estimated_gain_ms if c.estimated_gain_ms is not None else gain)


def on_production_paths(opps: list[Opportunity]) -> tuple[list[Opportunity], list[str]]:
    """The opportunities a generator may work on, and a note for each left out because its ops run
    on a stand-in (Opportunity.stand_in): a candidate there would be measured against code production
    does not run."""
    keep = [o for o in opps if not o.stand_in]
    return keep, [f"{o.id} ({o.kind} at {o.location.module_pattern}, {o.gain_ms:.1f} ms): not generated for: "
                  f"its ops run on a stand-in ({o.stand_in})" for o in opps if o.stand_in]


def run(ctx: RunContext) -> Result:
    ana = ctx.results.analyze
    opps, left_out = on_production_paths(ana.opportunities if ana else [])
    if not opps:
        why = "every opportunity runs on a stand-in" if left_out else (ana.reason if ana else "no opportunities")
        return Result("skipped", f"nothing to generate from: {why}", notes=left_out)
    t, gens, res = ctx.target, set(ctx.options.generators), Result("done", "", notes=list(left_out))
    replayed = _replay(ctx, opps, res) if "replay" in gens else []
    if "replay" not in gens:
        res.notes.append("store replay: not selected (--generators)")
    if "template" in gens:
        res.notes += _template(ctx, replayed, opps, res)
    if "variants" in gens:
        res.notes += _variants(ctx, replayed, opps, res)
    else:
        res.notes.append("variant search: not selected (--generators)")
    res.notes.append(_compile_region(ctx, replayed, opps, res) if "compile-region" in gens
                     else "compile region: not selected (--generators)")
    res.notes += _agent(ctx, opps, res) if "agent" in gens else ["agent: not selected (--generators)"]
    if ctx.budget.exhausted():
        res.notes.append("wall-time budget spent during generation")
    if res.candidates:
        res.notes.append(bundle_candidates(t.checkout.repo, ctx.run_dir, ctx.run_id,
                                           [c.commit_sha for c in res.candidates]
                                           + [a.candidate.commit_sha for a in res.attempts]))
    res.reason = f"{len(res.candidates)} candidates"
    return res


def _add(ctx: RunContext, res: Result, c: Candidate, opps: list[Opportunity]) -> Candidate:
    c = _complete(ctx, c, len(res.candidates), opps)
    res.candidates.append(c)
    return c


def _replay(ctx: RunContext, opps: list[Opportunity], res: Result) -> list:
    """Every matching kernel_store entry -> a commit in its own worktree; the replays kept."""
    from bot.generate.replay import replay, superseded_by

    t, hardware, replayed = ctx.target, ctx.hardware(), []
    knowledge = ctx.knowledge()
    env = ctx.results.profile.env if ctx.results.profile else {}
    # the modes the validator will check (bot/validate/context.py Context.modes): where an entry that
    # enables a mode can be offered
    modes = t.workload.production_modes if ctx.on_cuda else ("eager",)
    results = list(replay(t.checkout, opps, t.engine_name or t.workload.default_engine, hardware, t.workload.name,
                          store_root=knowledge.kernel_store, lessons_root=knowledge.lessons,
                          stand_in_code=env.get("stand_in_code"), modes=modes, precision=t.dtype))
    if not results:
        n = sum(1 for p in knowledge.kernel_store.glob("*/entry.yaml")) if knowledge.kernel_store.is_dir() else 0
        res.notes.append(f"store replay: none of the {n} store entries is for {t.workload.name} on engine "
                         f"{t.engine_name or t.workload.default_engine} (a new model starts with an empty store)")
    offered = []
    for r in results:
        if r.candidate is None:
            res.notes.append(f"store replay {r.entry_id}: {r.status}: {r.reason}")
            continue
        # a replay whose kernels step aside under compile is not the entry's patch: measured afresh
        known, why = (None, "") if r.under_compile == "reference" else recall.entry_verdict(ctx.run_key(), r.entry_id)
        if known is not None and known.status != "accepted":
            # the same patch, base, workload and machine were measured: measuring again would spend
            # GPU time on a known answer (--revalidate to do it anyway)
            res.notes.append(f"store replay {r.entry_id}: skipped, known on {hardware}: {known.line()}")
            continue
        offered.append((r, known, why))
    # An entry that includes another's changes (entry.yaml `supersedes`) conflicts with it in a stack;
    # combine would keep whichever came first. Offer the superseding one, and the other only when the
    # superseding one is not offered (no match, a conflict, known rejected on this machine).
    superseded = superseded_by([r.entry_id for r, _, _ in offered], load_store(knowledge.kernel_store)) if offered else {}
    for r, known, why in offered:
        if r.entry_id in superseded:
            res.notes.append(f"store replay {r.entry_id}: skipped, superseded by {superseded[r.entry_id]} "
                             "(its entry.yaml `supersedes`), which is offered")
            continue
        c = _add(ctx, res, r.candidate, opps)
        if known is not None:
            res.known[c.id] = known
        replayed.append(r)
        res.notes.append(f"store replay {r.entry_id}: {r.reason}"
                         + (f"; known on {hardware}: {known.line()}" if known else (f"; {why}" if why else "")))
    return replayed


def _template(ctx: RunContext, replayed: list, opps: list[Opportunity], res: Result) -> list[str]:
    """The template generator (no LLM) on the norm + elementwise and elementwise-chain opportunities
    no replayed entry covers; a refused one stays for the agent. Entry files go to <run dir>/template/."""
    import json

    from bot.analyze.graph import Graph
    from bot.generate.template.generator import TemplateContext, changed_lines, generate_templates

    full = ctx.run_dir / "analysis.full.json"
    graph_file = json.loads(full.read_text()).get("meta", {}).get("graph_file") if full.is_file() else None
    if not graph_file or not os.path.isfile(graph_file):
        return [f"template: no captured graph for this run ({full.name} names none)"]
    t = ctx.target
    tctx = TemplateContext(workload=t.workload.name, engine=t.engine_name or t.workload.default_engine,
                           engine_source=str(t.checkout.repo_path), hardware=ctx.hardware() or "", run_id=ctx.run_id,
                           entries_dir=ctx.run_dir / "template", dtype=t.dtype,
                           covered=frozenset(r.opportunity_id for r in replayed),
                           claimed=tuple(c for r in replayed
                                         for c in changed_lines(t.checkout, r.candidate.commit_sha, f"store entry {r.entry_id}")))
    notes = []
    for r in generate_templates(t.checkout, Graph.load(graph_file), opps, tctx):
        if r.candidate is not None:
            _add(ctx, res, r.candidate, opps)
            notes.append(f"template {r.opportunity_id}: {r.program}: {r.reason}; entry files {r.entry_dir}")
        elif r.status in ("covered", "duplicate", "small", "grouped"):
            notes.append(f"template {r.opportunity_id}: skipped, {r.reason}")
        else:
            notes.append(f"template {r.opportunity_id}: {r.status}: {r.reason} (left to the agent)")
    return notes or ["template: no fuse-norm-consumer or fuse-elementwise-chain opportunity"]


def _variants(ctx: RunContext, replayed: list, opps: list[Opportunity], res: Result) -> list[str]:
    """Variant search for each replayed entry that declares a config_space: its configs checked and
    timed on the run's GPUs, the fastest committed as the entry's patch with that config, a
    candidate of its own beside the plain replay. All configs, times and the device are kept in
    <run dir>/variants/<entry>/variants.json. On CPU nothing is timed, so nothing runs."""
    from bot.generate.variants import search_entry
    from bot.knowledge.store import get_entry

    tunable = [(r, get_entry(r.entry_id, ctx.knowledge().kernel_store)) for r in replayed]
    tunable = [(r, e) for r, e in tunable if e.config_space]
    if not tunable:
        return ["variant search: no replayed entry declares a config_space"]
    t = ctx.target
    if not ctx.on_cuda:
        return ["variant search: needs a GPU to choose a config (config spaces of "
                + ", ".join(e.id for _, e in tunable) + " not searched)"]
    notes = []
    for r, e in tunable:
        if ctx.budget.exhausted():
            notes.append(f"variant search {e.id}: not run, the wall-time budget is spent")
            continue
        done = recall.searched(ctx.run_key(), e)
        if done:
            notes.append(f"variant search {e.id}: not run, {done}")
            continue
        try:
            sr = search_entry(e.path, device=t.device, run_dir=ctx.run_dir / "variants" / e.id,
                              gpus=max(1, ctx.options.gpus), dtype=t.dtype, checkout=t.checkout,
                              opportunity_id=r.opportunity_id, aside=(r.under_compile, r.under_compile_why))
        except Exception as err:  # noqa: BLE001 - a broken config space, test module or worker is this
            # entry's problem only: the plain replay stays a candidate, the run goes on
            notes.append(f"variant search {e.id}: failed: {type(err).__name__}: {err}"[:400])
            continue
        ctx.log(sr.table())
        if sr.candidate is not None:
            _add(ctx, res, sr.candidate, opps)
        elif sr.kept and not sr.failures:
            res.searches.append(Search(e.id, sr.kept, "kept", sr.commit_note))
        failed = f"; {len(sr.failures)} workers failed" if sr.failures else ""
        notes.append(f"variant search {e.id}: {len(sr.rows)} configs on {sr.device_name or sr.device}{failed}; "
                     f"{sr.commit_note}")
    return notes


def _compile_region(ctx: RunContext, replayed: list, opps: list[Opportunity], res: Result) -> str:
    """The hot repeated blocks under torch.compile, chosen from the profile."""
    from bot.generate.compile_region import generate

    learned = recall.learned_from(ctx.run_key(), [r.entry_id for r in replayed], "compile-region")
    if learned:
        return f"compile region: learned by an earlier run as store entry {learned}, replayed above"
    if not ctx.on_cuda:
        return ("compile region: not run on CPU (inductor compiles in every validation process, and its speed "
                "needs a GPU)")
    t = ctx.target
    opp = next((o for o in opps if o.generator == "compile-region"), None)
    c = generate(t.checkout, t.checkout.base_sha, ctx.results.profile.load(), t.model_class, t.checkout.import_root,
                 ctx.run_id, opportunity=opp.to_json() if opp else None)
    if c is None:
        return "compile region: no repeated region holds enough of the step's time"
    _add(ctx, res, c, opps)
    return f"compile region: {c.title}"


def agent_task(ctx: RunContext, opp: dict, *, vctx=None, store_dir: Path | None = None,
               lessons_dir: Path | None = None):
    """The AgentTask for one opportunity (its JSON) of this run: what the agents of a generation
    share. `vctx` is a ValidationContext to share between opportunities (the base side's cache and
    the verdicts); store_dir / lessons_dir replace the run's knowledge (benchmarks/agent_prompt.py)."""
    from bot.generate.agent.brief import graph_file_of
    from bot.generate.agent.loop import AgentTask
    from bot.generate.agent.validation import ValidationContext

    t = ctx.target
    work = ctx.run_dir / "agent"
    knowledge = ctx.knowledge()
    store = store_dir or knowledge.kernel_store
    vctx = vctx or ValidationContext.from_target(t, work / "validation", kernel_store=store)
    return AgentTask(run_id=ctx.run_id, run_dir=work, checkout=t.checkout, vctx=vctx, opportunity=opp,
                     engine=t.engine_name or t.workload.default_engine, hardware=ctx.hardware(),
                     profile=ctx.results.profile.load(), lessons_dir=lessons_dir or knowledge.lessons, store_dir=store,
                     graph_file=graph_file_of(ctx.run_dir))


def _agent(ctx: RunContext, opps: list[Opportunity], res: Result) -> list[str]:
    """The Anthropic agent on the opportunities no other candidate covers, in rank order, one
    generation each (bot/generate/agent/parallel.generate), while the budgets last: the USD budget
    (--budget's cost, else OPTBOT_AGENT_MAX_COST) and the wall time (what is left of --budget, and of
    OPTBOT_AGENT_MAX_WALL_S) are for all of them, each opportunity getting what the earlier ones left;
    at most AgentConfig.max_opportunities. Every opportunity's best candidate is added; the failed
    attempts besides it are kept for learn. Off without ANTHROPIC_API_KEY. One note per opportunity,
    and one saying why the loop stopped when opportunities were left."""
    if not os.environ.get("ANTHROPIC_API_KEY"):
        return ["agent: off (no ANTHROPIC_API_KEY)"]
    import time

    from bot.generate.agent.budget import usd_buys_no_turn
    from bot.generate.agent.config import AgentConfig
    from bot.generate.agent.parallel import generate

    covered = {c.opportunity_id for c in res.candidates}
    todo = [o for o in opps if o.id not in covered and o.generator in ("agent", "")] or \
           [o for o in opps if o.id not in covered]
    if not todo:
        return ["agent: every opportunity already has a candidate"]
    vctx = None  # the first task's, then shared by all opportunities: the base side's cache and the verdicts
    cfg = AgentConfig.from_env()
    total_usd = ctx.options.budget_cost_usd if ctx.options.budget_cost_usd is not None else cfg.max_cost_usd
    started, spent, notes = time.monotonic(), 0.0, []
    for i, o in enumerate(todo, 1):
        left_usd = total_usd - spent
        wall = ctx.budget.remaining_s()  # the agents stop, with their best snapshots, when it is spent
        if cfg.max_wall_s is not None:
            own = cfg.max_wall_s - (time.monotonic() - started)
            wall = own if wall is None else min(wall, own)
        why = (f"the cap of {cfg.max_opportunities} opportunities is reached (OPTBOT_AGENT_MAX_OPPORTUNITIES)"
               if i > cfg.max_opportunities else
               f"the USD budget is spent (${spent:.4f} of ${total_usd:.2f})" if usd_buys_no_turn(left_usd, cfg.price) else
               "the wall-time budget is spent" if wall is not None and wall <= 0 else "")
        if why:
            rest = todo[i - 1:]
            notes.append(f"agent: stopped after {i - 1} of {len(todo)} opportunities: {why}; not worked: "
                         + ", ".join(f"{x.kind} {x.id}" for x in rest))
            break
        opp = o.to_json()
        task = agent_task(ctx, opp, vctx=vctx)
        vctx = task.vctx
        cfg_i = dataclasses.replace(cfg, max_cost_usd=left_usd,
                                    max_wall_s=None if wall is None else max(0.0, wall))
        g = generate(task, cfg_i, log=ctx.log, prefix=f"o{i}-")
        if g.off:
            notes.append(f"agent: {g.message}")
            break
        spent += g.spend.cost_usd
        res.agent_cost_usd += g.spend.cost_usd
        res.attempts += [Attempt(r.candidate, r.verdict) for r in g.results
                         if r is not g.best and r.candidate is not None and r.verdict is not None
                         and r.verdict.status != "accepted"]
        note = (f"agent on opportunity {i} of {len(todo)}, {o.kind} {o.id}: {len(g.results)} agents, "
                f"${g.spend.cost_usd:.4f} (${spent:.4f} of ${total_usd:.2f} so far), spend {g.spend.to_json()}")
        if g.rounds_note:
            note += f"; {g.rounds_note}"
        if g.best is not None and g.best.candidate is not None:
            c = _add(ctx, res, g.best.candidate, opps)
            judged = g.best.verdict.status if g.best.verdict else (g.best.error or "no verdict")
            note += f"; best {g.best.name} ({judged}) -> candidate {c.commit_sha[:12]}"
        else:
            note += "; no candidate"
        notes.append(note)
    return notes
