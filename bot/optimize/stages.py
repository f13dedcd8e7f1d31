"""The nine steps of `optbot optimize`, each a method of ``Stages`` returning a typed result.

This module is THE adapter between the orchestrator and the pieces built elsewhere:
  analyze   bot.analyze   (opportunities)           -> Stages.analyze
  generate  bot.generate  (store replay, variant search, agent, compile region) -> Stages.generate
  validate  bot.validate  (validate -> Verdict, ablation)                     -> Stages.validate / combine
  learn     bot.knowledge.learn     (store entries, lessons)                            -> Stages.learn
Each adapter looks its piece up with ``_piece`` and converts what comes back into the dataclasses
below. Where a piece is not installed, the step is recorded as "skipped" with the reason; it never
makes up a result. checkout, baseline and profile use the foundation's own code (bot/target,
runner `step` and `profile` jobs through bot/jobs.run_job).

Every result is a dataclass that bot/run/state.py writes as <step>.json in the run directory.
"""
from __future__ import annotations

import json

import dataclasses
import importlib
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable

import git

from bot.engine import add_worktree
from bot.errors import OptbotError, RunnerError
from bot.jobs import run_job
from bot.knowledge import recall
from bot.run.resume import (bundle_candidates, fetch_candidates, load_checkpoint, save_checkpoint,
                                 staged_changes, staging_copy)
from bot.target import Target, base_worktree, resolve_target
from bot.trailers import parse_trailers, trailer_values
from runner.job import Job

# ------------------------------------------------------------------------------------------------
# typed results


@dataclass
class Measurement:
    """One latency measurement and THE device that measured it."""
    device: str  # cpu | cuda: which clock
    device_name: str
    mode: str  # eager | graph
    median_ms: float
    min_ms: float
    max_ms: float
    stdev_ms: float
    n: int
    passes: int = 1

    @property
    def per_pass_ms(self) -> float:
        return self.median_ms / max(self.passes, 1)

    @classmethod
    def from_timing(cls, t: dict | None, device_name: str, passes: int) -> "Measurement | None":
        if not t or not isinstance(t, dict) or "median_ms" not in t:
            return None
        return cls(device=t.get("device", "?"), device_name=device_name, mode=t.get("mode", "eager"),
                   median_ms=float(t["median_ms"]), min_ms=float(t.get("min_ms", t["median_ms"])),
                   max_ms=float(t.get("max_ms", t["median_ms"])), stdev_ms=float(t.get("stdev_ms", 0.0)),
                   n=int(t.get("n", 1)), passes=passes)


@dataclass
class CheckoutResult:
    workload: str
    engine: str
    repo_path: str
    base_sha: str
    ref: str
    import_root: str
    model_class: str
    base_worktree: str
    preset: str
    device: str
    dtype: str
    shape: str


@dataclass
class BaselineResult:
    status: str
    eager: Measurement | None
    graph: Measurement | None
    graph_note: str
    outputs: list[dict]
    env: dict
    log: str


@dataclass
class ProfileResult:
    status: str
    device: str
    total_ms: float
    categories: dict[str, float]
    top_kernels: list[dict]
    launches: int | None
    profile_file: str
    env: dict


@dataclass
class AnalyzeResult:
    status: str  # done | skipped
    reason: str
    opportunities: list[dict] = field(default_factory=list)


@dataclass
class CandidateRecord:
    id: str
    title: str
    sha: str
    worktree: str
    generator: str = ""
    kind: str = ""
    opportunity: str = ""
    description: str = ""
    trailers: dict[str, str] = field(default_factory=dict)
    estimated_gain_ms: float | None = None
    known: dict = field(default_factory=dict)  # the store's recorded GPU verdict that applies unchanged


@dataclass
class GenerateResult:
    status: str
    reason: str
    candidates: list[CandidateRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    agent_cost_usd: float = 0.0
    # finished variant searches that kept the entry's own config (no candidate): learn records them
    searches: list[dict] = field(default_factory=list)


@dataclass
class VerdictRecord:
    candidate_id: str
    status: str  # accepted | rejected | held
    reason: str
    device: str = ""
    base_eager: Measurement | None = None
    cand_eager: Measurement | None = None
    base_graph: Measurement | None = None
    cand_graph: Measurement | None = None
    graph_note: str = ""
    correctness: list[dict] = field(default_factory=list)  # output, shape, seed, max_abs, max_rel, ok
    micro: list[dict] = field(default_factory=list)  # kernel, shape, base_ms, cand_ms, speedup, device
    raw: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        if self.base_eager and self.cand_eager and self.cand_eager.median_ms:
            return self.base_eager.median_ms / self.cand_eager.median_ms
        return None


@dataclass
class ValidateResult:
    status: str
    reason: str
    verdicts: list[VerdictRecord] = field(default_factory=list)


@dataclass
class StackCommit:
    candidate_id: str
    sha: str
    subject: str


@dataclass
class AblationRow:
    candidate_id: str
    title: str
    without_ms: float | None
    contribution_ms: float | None
    contribution_pct: float | None
    device: str


@dataclass
class CombineResult:
    status: str
    branch: str
    base_sha: str
    head_sha: str
    commits: list[StackCommit] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    stack_verdict: VerdictRecord | None = None
    stack_note: str = ""
    ablation: list[AblationRow] = field(default_factory=list)
    ablation_note: str = ""
    stack_sha256: str = ""  # sha256 of `git diff base head`: what the stack changes, whatever its commits
    ablation_measured: dict = field(default_factory=dict)  # this run's leave-one-out: mode, rounds, device, ms
    ablation_known_from: str = ""  # run id whose recorded leave-one-out of the same stack was reused


@dataclass
class LearnResult:
    status: str
    reason: str
    knowledge_root: str = ""
    files: list[str] = field(default_factory=list)  # relative to knowledge_root
    entries: list[str] = field(default_factory=list)
    lessons: list[str] = field(default_factory=list)


@dataclass
class PullRequestRef:
    action: str  # opened | updated | closed-by-person | merged | local | none | skipped
    number: int | None = None
    url: str = ""
    note: str = ""


@dataclass
class DeliverResult:
    forge: str  # local | github
    dry_run: bool
    engine_branch: str
    engine_head: str
    engine_pr: PullRequestRef
    knowledge_branch: str
    knowledge_pr: PullRequestRef
    trigger_reply: PullRequestRef
    report_md: str
    report_html: str
    chart_png: str
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# run options and context


@dataclass
class Budget:
    wall_s: float | None = None
    cost_usd: float | None = None
    started: float = field(default_factory=time.time)

    def remaining_s(self) -> float | None:
        return None if self.wall_s is None else self.wall_s - (time.time() - self.started)

    def exhausted(self) -> bool:
        r = self.remaining_s()
        return r is not None and r <= 0


@dataclass
class Options:
    workload: str
    engine: str | None = None
    ref: str | None = None
    preset: str | None = None
    device: str | None = None
    gpus: int = 1
    budget_wall_s: float | None = None
    budget_cost_usd: float | None = None
    dry_run: bool = False
    repo: str | None = None  # GitHub OWNER/NAME of the engine (and of the triggering PR)
    trigger_pr: int | None = None
    trigger_comment: int | None = None
    knowledge_repo: str | None = None  # GitHub OWNER/NAME of the bot's repository
    knowledge_path: str | None = None  # local git repository holding kernel_store/ and lessons/
    engine_remote: str | None = None
    knowledge_remote: str | None = None
    github_api_url: str | None = None
    iters: int | None = None
    command: str = ""
    generators: tuple[str, ...] = ("replay", "variants", "compile-region", "agent")
    revalidate: bool = False  # ignore the store's recorded GPU verdicts: validate every candidate
    ablation_rounds: int = 2  # leave-one-out rounds of the stack on a GPU; 0 = no ablation


@dataclass
class RunContext:
    run_id: str
    run_dir: Path
    options: Options
    budget: Budget
    results: dict[str, dict]  # step name -> its recorded JSON result (from state)
    log: Callable[[str], None] = print
    target: Target | None = None
    forge: Any = None
    pause_at: float | None = None  # time.time() after which the attempt stops at its next safe point

    def check_pause(self, before: str) -> None:
        """Stop here (raise Paused) when the attempt's --pause-after time has passed: `before` names
        the work that would start next. Work in flight is never interrupted."""
        if self.pause_at is not None and time.time() >= self.pause_at:
            from bot.run.state import Paused
            raise Paused(before)

    def jobs_dir(self) -> Path:
        d = self.run_dir / "jobs"
        d.mkdir(parents=True, exist_ok=True)
        return d


def _piece(module: str, attr: str):
    """A function of another part of optbot, or None when that part is not installed."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            return None
        raise
    return getattr(mod, attr, None)


def as_dict(obj: Any) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if is_dataclass(obj):
        return asdict(obj)
    return dict(vars(obj))


def branch_name(workload: str, base_sha: str) -> str:
    return f"optbot/{workload}/{base_sha[:12]}"


def knowledge_branch_name(workload: str, base_sha: str) -> str:
    return f"optbot/knowledge/{workload}/{base_sha[:12]}"


def commit_trailers(repo: git.Repo, sha: str) -> dict[str, str]:
    """Optbot-* trailers of a commit (DESIGN decision 5), e.g. {"Optbot-Kind": "merge-siblings"},
    read by the bot's one trailer parser (bot/trailers.py) so every step agrees on them."""
    return parse_trailers(repo.commit(sha).message)


# ------------------------------------------------------------------------------------------------
# the stages


class Stages:
    """The default stages. Tests of the forge and resume logic subclass this to replace measuring
    stages; the end-to-end test uses it as is."""

    # 1 -------------------------------------------------------------------------------------------
    def checkout(self, ctx: RunContext) -> CheckoutResult:
        t = self.target(ctx)
        wt = base_worktree(t)
        shape = t.workload.preset(t.preset).shapes
        return CheckoutResult(workload=t.workload.name, engine=t.checkout.name, repo_path=str(t.checkout.repo_path),
                              base_sha=t.checkout.base_sha, ref=t.checkout.ref, import_root=t.checkout.import_root,
                              model_class=t.model_class, base_worktree=str(wt), preset=t.preset, device=t.device,
                              dtype=t.dtype, shape=shape.label())

    def target(self, ctx: RunContext) -> Target:
        """Resolve once per process; on resume the base sha recorded by checkout pins the ref."""
        if ctx.target is None:
            o = ctx.options
            co = ctx.results.get("checkout") or {}
            ctx.target = resolve_target(o.workload, o.engine, co.get("base_sha") or o.ref,
                                        co.get("preset") or o.preset, co.get("device") or o.device)
            if ctx.results.get("generate"):
                fetch_candidates(ctx.target.checkout, ctx.run_dir, ctx.run_id, ctx.results)
        return ctx.target

    def _job(self, ctx: RunContext, kind: str, worktree: Path, out_dir: Path, iters: int, **kw) -> Job:
        t = self.target(ctx)
        shape = t.workload.preset(t.preset).shapes
        return Job(kind=kind, workload=t.workload.to_json(), preset=t.preset, device=t.device, dtype=t.dtype,
                   engine_root=t.engine_root(worktree), engine_sha=git.Repo(worktree).head.commit.hexsha,
                   model_class=t.model_class,
                   shapes=[{"resolution": list(shape.resolution), "text_tokens": shape.text_tokens, "batch": shape.batch}],
                   seeds=kw.pop("seeds", [0]), weight_seed=0, warmup=kw.pop("warmup", 2), iters=iters,
                   out_dir=str(out_dir), **kw)

    def _iters(self, ctx: RunContext) -> int:
        t = self.target(ctx)
        return ctx.options.iters or (20 if t.device.startswith("cuda") else 5)

    # 2 -------------------------------------------------------------------------------------------
    def baseline(self, ctx: RunContext) -> BaselineResult:
        wt = Path(ctx.results["checkout"]["base_worktree"])
        out_dir = ctx.jobs_dir() / "baseline"
        job = self._job(ctx, "step", wt, out_dir, self._iters(ctx), seeds=[0])
        out = run_job(job, out_dir, timeout_s=3600, name="baseline")
        if not out.ok:
            raise RunnerError(f"baseline step job {out.reason()}; log: {out.log_path}\n{out.log_tail[-1500:]}")
        r = out.result
        env = r.get("env", {})
        eager = Measurement.from_timing(r.get("latency"), env.get("device_name", ""), r.get("passes", 1))
        return BaselineResult(status="done", eager=eager, graph=None,
                              graph_note="the runner's step job times eager mode only; CUDA-graph numbers come "
                                         "from the validator's end-to-end check of the stack",
                              outputs=r.get("outputs", []), env=env, log=out.log_path)

    # 3 -------------------------------------------------------------------------------------------
    def profile(self, ctx: RunContext) -> ProfileResult:
        wt = Path(ctx.results["checkout"]["base_worktree"])
        out_dir = ctx.jobs_dir() / "profile"
        job = self._job(ctx, "profile", wt, out_dir, max(3, self._iters(ctx) // 2))
        out = run_job(job, out_dir, timeout_s=3600, name="profile")
        if not out.ok:
            raise RunnerError(f"profile job {out.reason()}; log: {out.log_path}\n{out.log_tail[-1500:]}")
        p = out.result
        full = out_dir / "profile.full.json"
        from bot.run.state import write_json_atomic
        write_json_atomic(full, p)
        kernels = sorted(p.get("kernels", []), key=lambda k: -float(k.get("ms", 0)))[:15]
        return ProfileResult(status="done", device=p.get("device", "?"), total_ms=float(p.get("total_ms", 0.0)),
                             categories=p.get("categories", {}), top_kernels=kernels,
                             launches=p.get("launches") or p.get("launch_count"), profile_file=str(full),
                             env=p.get("env", {}))

    # 4 -------------------------------------------------------------------------------------------
    def analyze(self, ctx: RunContext) -> AnalyzeResult:
        # analyze helper: runner `graph` job -> bot.analyze.graph.Graph -> bot.analyze.run.analyze(graph, profile)
        run_analysis = _piece("bot.analyze.run", "analyze")
        graph_cls = _piece("bot.analyze.graph", "Graph")
        from runner.job import job_kinds
        if run_analysis is None or graph_cls is None or "graph" not in job_kinds():
            return AnalyzeResult("skipped", "analysis not available (bot.analyze.run.analyze or the runner "
                                            "`graph` job kind is not installed)")
        import json
        wt = Path(ctx.results["checkout"]["base_worktree"])
        out_dir = ctx.jobs_dir() / "graph"
        out = run_job(self._job(ctx, "graph", wt, out_dir, 0), out_dir, timeout_s=3600, name="graph")
        if not out.ok:
            raise RunnerError(f"graph job {out.reason()}; log: {out.log_path}\n{out.log_tail[-1500:]}")
        profile = json.loads(Path(ctx.results["profile"]["profile_file"]).read_text())
        co = ctx.results["checkout"]
        analysis = run_analysis(graph_cls.load(out.result["graph"]), profile,
                                meta={"workload": co["workload"], "preset": co["preset"], "engine": co["engine"]},
                                profile_source=ctx.results["profile"]["profile_file"])
        from bot.run.state import write_json_atomic
        write_json_atomic(ctx.run_dir / "analysis.full.json", analysis)
        opps = [as_dict(o) for o in analysis.get("opportunities", [])]
        claimed = analysis.get("claimed_ms")
        return AnalyzeResult("done", f"{len(opps)} opportunities"
                             + (f", {claimed:.3f} ms claimed ({analysis['profile'].get('device')})" if claimed else ""),
                             opps)

    # 5 -------------------------------------------------------------------------------------------
    def generate(self, ctx: RunContext) -> GenerateResult:
        opps = ctx.results.get("analyze", {}).get("opportunities") or []
        if not opps:
            why = ctx.results.get("analyze", {}).get("reason", "no opportunities")
            return GenerateResult("skipped", f"nothing to generate from: {why}")
        t = self.target(ctx)
        notes: list[str] = []
        recs: list[CandidateRecord] = []
        hardware = self._hardware(ctx)
        # store replay (store helper): every matching kernel_store entry -> a commit in its own worktree
        replay = _piece("bot.generate.replay", "replay")
        replayed = []
        gens = set(ctx.options.generators)
        if "replay" not in gens:
            notes.append("store replay: not selected (--generators)")
        elif replay is None:
            notes.append("store replay: not available (bot.generate.replay is not installed)")
        else:
            for r in replay(t.checkout, opps, t.engine_name or t.workload.default_engine, hardware,
                            t.workload.name, store_root=self._store_root(ctx)):
                if r.candidate is None:
                    notes.append(f"store replay {r.entry_id}: {r.status}: {r.reason}")
                    continue
                rec = self._candidate_record(t, r.candidate, len(recs), opps)
                known, why = recall.entry_verdict(self._key(ctx), r.entry_id)
                if known is not None and known.status != "accepted":
                    # the same patch, base, workload and machine were measured: measuring again
                    # would spend GPU time on a known answer (--revalidate to do it anyway)
                    notes.append(f"store replay {r.entry_id}: skipped, known on {hardware}: {known.line()}")
                    continue
                if known is not None:
                    rec.known = dataclasses.asdict(known)
                replayed.append(r)
                recs.append(rec)
                notes.append(f"store replay {r.entry_id}: {r.reason}"
                             + (f"; known on {hardware}: {known.line()}" if known else (f"; {why}" if why else "")))
        searches: list[dict] = []
        if "variants" in gens:
            notes += self._variants(ctx, replayed, recs, opps, searches)
        else:
            notes.append("variant search: not selected (--generators)")
        # compile region (generate helper): the hot repeated blocks under torch.compile, from the profile
        cr = _piece("bot.generate.compile_region", "generate")
        learned_cr = recall.learned_from(self._key(ctx), [r.entry_id for r in replayed], "compile-region")
        if "compile-region" not in gens:
            notes.append("compile region: not selected (--generators)")
        elif learned_cr:
            notes.append(f"compile region: learned by an earlier run as store entry {learned_cr}, replayed above")
        elif cr is None:
            notes.append("compile region: not available (bot.generate.compile_region is not installed)")
        elif not t.device.startswith("cuda"):
            notes.append("compile region: not run on CPU (inductor compiles in every validation process, and "
                         "its speed needs a GPU)")
        else:
            import json
            profile = json.loads(Path(ctx.results["profile"]["profile_file"]).read_text())
            opp = next((o for o in opps if o.get("generator") == "compile-region"), None)
            c = cr(t.checkout, t.checkout.base_sha, profile, t.model_class, t.checkout.import_root, ctx.run_id,
                   opportunity=opp)
            if c is None:
                notes.append("compile region: no repeated region holds enough of the step's time")
            else:
                recs.append(self._candidate_record(t, c, len(recs), opps))
                notes.append(f"compile region: {c.title}")
        notes += self._agent(ctx, opps, recs) if "agent" in gens else ["agent: not selected (--generators)"]
        if ctx.budget.exhausted():
            notes.append("wall-time budget spent during generation")
        if recs:
            notes.append(bundle_candidates(t.checkout.repo, ctx.run_dir, ctx.run_id, [r.sha for r in recs]))
        return GenerateResult("done", f"{len(recs)} candidates", recs, notes, searches=searches)

    def _variants(self, ctx: RunContext, replayed: list, recs: list[CandidateRecord], opps: list[dict],
                  searches: list[dict]) -> list[str]:
        """Variant search (generate helper) for each replayed entry that declares a config_space: its
        configs checked and timed on the run's GPUs, the fastest committed as the entry's patch with
        that config, a candidate of its own beside the plain replay. All configs, times and the device
        are kept in <run dir>/variants/<entry>/variants.json. On CPU nothing is timed, so nothing runs."""
        search_entry = _piece("bot.generate.variants", "search_entry")
        if search_entry is None:
            return ["variant search: not available (bot.generate.variants is not installed)"]
        from bot.knowledge.store import get_entry
        tunable = [(r, get_entry(r.entry_id, self._store_root(ctx))) for r in replayed]
        tunable = [(r, e) for r, e in tunable if e.config_space]
        if not tunable:
            return ["variant search: no replayed entry declares a config_space"]
        t = self.target(ctx)
        if not t.device.startswith("cuda"):
            return ["variant search: needs a GPU to choose a config (config spaces of "
                    + ", ".join(e.id for _, e in tunable) + " not searched)"]
        notes = []
        for r, e in tunable:
            if ctx.budget.exhausted():
                notes.append(f"variant search {e.id}: not run, the wall-time budget is spent")
                continue
            done = recall.searched(self._key(ctx), e)
            if done:
                notes.append(f"variant search {e.id}: not run, {done}")
                continue
            try:
                res = search_entry(e.path, device=t.device, run_dir=ctx.run_dir / "variants" / e.id,
                                   gpus=max(1, ctx.options.gpus), dtype=t.dtype, checkout=t.checkout,
                                   opportunity_id=r.opportunity_id)
            except Exception as err:  # noqa: BLE001 - a broken config space, test module or worker is this
                # entry's problem only: the plain replay stays a candidate, the run goes on
                notes.append(f"variant search {e.id}: failed: {type(err).__name__}: {err}"[:400])
                continue
            ctx.log(res.table())
            failed = f"; {len(res.failures)} workers failed" if res.failures else ""
            if res.candidate is not None:
                recs.append(self._candidate_record(t, res.candidate, len(recs), opps))
            elif res.kept and not res.failures:
                searches.append({"entry_id": e.id, "config": res.kept, "status": "kept", "reason": res.commit_note})
            notes.append(f"variant search {e.id}: {len(res.rows)} configs on {res.device_name or res.device}{failed}; "
                         f"{res.commit_note}")
        return notes

    def _agent(self, ctx: RunContext, opps: list[dict], recs: list[CandidateRecord]) -> list[str]:
        """The Anthropic agent (generate helper) on the best-ranked opportunity no replayed entry covers.
        Off without ANTHROPIC_API_KEY; the USD budget (--budget $N) caps its spend."""
        import os
        if not os.environ.get("ANTHROPIC_API_KEY"):
            return ["agent: off (no ANTHROPIC_API_KEY)"]
        gen = _piece("bot.generate.agent.parallel", "generate")
        if gen is None:
            return ["agent: not available (bot.generate.agent is not installed)"]
        import dataclasses
        import json
        from bot.generate.agent.config import AgentConfig
        from bot.generate.agent.loop import AgentTask, opportunity_dict
        from bot.generate.agent.validation import ValidationContext
        from bot.knowledge.location import knowledge_of
        t = self.target(ctx)
        covered = {r.opportunity for r in recs}
        todo = [o for o in opps if o.get("id") not in covered and o.get("generator") in ("agent", None, "")] or \
               [o for o in opps if o.get("id") not in covered]
        if not todo:
            return ["agent: every opportunity already has a candidate"]
        opp = opportunity_dict(todo[0])
        work = ctx.run_dir / "agent"
        vctx = ValidationContext.from_target(t, Path(ctx.results["checkout"]["base_worktree"]), work / "validation")
        knowledge = knowledge_of(ctx.options)
        profile = json.loads(Path(ctx.results["profile"]["profile_file"]).read_text())
        task = AgentTask(run_id=ctx.run_id, run_dir=work, checkout=t.checkout, vctx=vctx, opportunity=opp,
                         engine=t.engine_name or t.workload.default_engine, hardware=self._hardware(ctx),
                         profile=profile, lessons_dir=knowledge.lessons, store_dir=knowledge.kernel_store)
        cfg = AgentConfig.from_env()
        if ctx.options.budget_cost_usd is not None:
            cfg = dataclasses.replace(cfg, max_cost_usd=ctx.options.budget_cost_usd)
        g = gen(task, cfg, log=ctx.log)
        spend = as_dict(g).get("spend", {})
        note = f"agent on {opp.get('kind')} {opp.get('id')}: {len(g.results)} agents, spend {spend}"
        if g.best is not None and g.best.candidate is not None:
            recs.append(self._candidate_record(t, g.best.candidate, len(recs), opps))
            note += f"; best {g.best.name} -> candidate {g.best.candidate.commit_sha[:12]}"
        else:
            note += "; no candidate"
        return [note]

    @staticmethod
    def _store_root(ctx: RunContext) -> Path:
        from bot.knowledge.location import knowledge_of
        return knowledge_of(ctx.options).kernel_store

    def _key(self, ctx: RunContext) -> "recall.RunKey":
        """What recorded GPU results must match to apply to this run (bot/knowledge/recall.py)."""
        t = self.target(ctx)
        return recall.RunKey(self._store_root(ctx), t.workload.name, self._hardware(ctx), t.checkout.base_sha,
                             t.preset, t.dtype, t.device.startswith("cuda"), ctx.options.revalidate,
                             ctx.results.get("baseline", {}).get("env", {}))

    def _hardware(self, ctx: RunContext) -> str:
        t = self.target(ctx)
        env = ctx.results.get("baseline", {}).get("env", {})
        hw = _piece("bot.hardware", "hardware_name")
        if hw is not None:
            return hw(t.device, env.get("device_name", ""))
        return "cpu" if not t.device.startswith("cuda") else (env.get("device_name") or "cuda").lower()

    @staticmethod
    def _candidate_record(t: Target, c: Any, i: int, opps: list | None = None) -> CandidateRecord:
        d = as_dict(c)
        sha = d.get("commit_sha") or d.get("sha")
        repo = t.checkout.repo
        commit = repo.commit(sha)
        trailers = commit_trailers(repo, sha)
        opp_id = d.get("opportunity_id") or trailers.get("Optbot-Opportunity", "")
        gain = next((o.get("gain_ms") for o in (opps or []) if o.get("id") == opp_id), None)
        return CandidateRecord(id=str(d.get("id") or f"c{i + 1}"), title=d.get("title") or commit.summary,
                               sha=sha, worktree=str(d.get("worktree", "")), generator=str(d.get("generator", "")),
                               kind=d.get("kind") or trailers.get("Optbot-Kind", ""), opportunity=opp_id,
                               description=commit.message, trailers=trailers, estimated_gain_ms=gain)

    # 6 -------------------------------------------------------------------------------------------
    def validate(self, ctx: RunContext) -> ValidateResult:
        cands = [CandidateRecord(**c) for c in ctx.results.get("generate", {}).get("candidates", [])]
        if not cands:
            return ValidateResult("skipped", "no candidates to validate")
        if self._validator() is None:
            return ValidateResult("skipped", "validation not available (bot.validate.validate is not installed); "
                                             "no candidate can be accepted without it")
        t = self.target(ctx)
        gpus = max(1, ctx.options.gpus)
        devices = [f"cuda:{i}" for i in range(gpus)] if t.device.startswith("cuda") and gpus > 1 else [t.device]

        def one(c: CandidateRecord, device: str) -> VerdictRecord:
            if c.known and c.known.get("status") == "accepted":
                return reused_verdict(c.id, c.known)
            done = load_checkpoint(ctx.run_dir, c.id, c.sha)
            if done is not None:  # a resumed run: this candidate's verdict was reached before the stop
                return verdict_from_dict(c.id, done)
            if ctx.budget.exhausted():
                return VerdictRecord(c.id, "held", "wall-time budget spent before this candidate was validated")
            ctx.check_pause(f"validating {c.id}")  # the lanes' validations in flight finish and are kept
            v = self.verdict_of(ctx, c.sha, c.id, device)
            save_checkpoint(ctx.run_dir, c.id, c.sha, asdict(v))
            return v

        from bot.lanes import map_on_lanes

        # known verdicts cost nothing: they go first, so the lanes only hold real validations
        verdicts = map_on_lanes(one, cands, devices)
        n_ok = sum(v.status == "accepted" for v in verdicts)
        return ValidateResult("done", f"{n_ok} of {len(verdicts)} accepted", verdicts)

    def _validator(self):
        # validate helper: bot.validate.validate(target, candidate, base=None, opts=Options(...)) -> Verdict
        return _piece("bot.validate", "validate")

    def verdict_of(self, ctx: RunContext, ref: str, cid: str, device: str) -> VerdictRecord:
        import dataclasses
        fn = self._validator()
        t = self.target(ctx)
        if device != t.device:
            t = dataclasses.replace(t, device=device)
        vopts_cls = _piece("bot.validate", "Options")
        opts = None
        if vopts_cls:
            kw = {}
            if not device.startswith("cuda"):
                # DESIGN decision 7: on CPU a candidate gets a correctness (and engagement) verdict
                # only, "speed needs a GPU". Without timing, the base side's outputs can be shared by
                # every candidate of the run: one set of fresh seeds per run, one base process.
                # The candidate's timeout is explicit: the adaptive one (5x the cached base job) is
                # too short for a stack whose Triton kernels all run in the interpreter.
                kw = dict(speed=False, seeds=self._run_seeds(ctx)[0], weight_seed=self._run_seeds(ctx)[1],
                          cache_dir=ctx.run_dir / "validate" / "base-cache", timeout_s=900)
            opts = vopts_cls(run_dir=ctx.run_dir / "validate" / cid, log=ctx.log, kernel_store=self._store_root(ctx), **kw)
        v = fn(t, ref, t.checkout.base_sha, opts)
        return verdict_from_validator(cid, as_dict(v))

    @staticmethod
    def _run_seeds(ctx: RunContext) -> tuple[list[int], int]:
        """Fresh random seeds, drawn once per run and kept in the run directory (a resumed run
        reuses them, so its cached base outputs stay valid)."""
        f = ctx.run_dir / "validate" / "seeds.json"
        if f.is_file():
            d = json.loads(f.read_text())
            return d["seeds"], d["weight_seed"]
        from bot.validate import fresh_seeds

        seeds, w = fresh_seeds(3), fresh_seeds(1)[0]
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"seeds": seeds, "weight_seed": w}))
        return seeds, w

    # 7 -------------------------------------------------------------------------------------------
    def combine(self, ctx: RunContext) -> CombineResult:
        from bot.optimize.stack import build_stack

        t = self.target(ctx)
        cands = {c["id"]: CandidateRecord(**c) for c in ctx.results.get("generate", {}).get("candidates", [])}
        verdicts = {v["candidate_id"]: verdict_from_dict(v["candidate_id"], v)
                    for v in ctx.results.get("validate", {}).get("verdicts", [])}
        accepted = [cands[cid] for cid, v in verdicts.items() if v.status == "accepted" and cid in cands]
        accepted, superseded = _prefer_tuned(accepted)
        branch = branch_name(t.workload.name, t.checkout.base_sha)
        commits, dropped, head = build_stack(t.checkout, branch, accepted, verdicts, ctx)
        res = CombineResult("done", branch, t.checkout.base_sha, head, commits, superseded + dropped)
        if commits:  # the stack joins the bundle: a resume on another machine finds the branch
            bundle_candidates(t.checkout.repo, ctx.run_dir, ctx.run_id, [c.sha for c in cands.values()] + [head])
        if not commits:
            res.stack_note = "no accepted optimization: the branch equals the base"
            res.ablation_note = "nothing to ablate"
            return res
        if self._validator() is None:
            res.stack_note = "stack re-validation skipped: validation not available"
        else:
            done = load_checkpoint(ctx.run_dir, "stack", head)  # a resumed run: validated before the stop
            if done is not None:
                res.stack_verdict = verdict_from_dict("stack", done)
            else:
                ctx.check_pause("validating the stack")
                res.stack_verdict = self.verdict_of(ctx, head, "stack", t.device)
                save_checkpoint(ctx.run_dir, "stack", head, asdict(res.stack_verdict))
            res.stack_note = f"stack re-validated: {res.stack_verdict.status} ({res.stack_verdict.reason})"
        res.stack_sha256 = stack_diff_sha256(t.checkout.repo, res.base_sha, head)
        res.ablation, res.ablation_note = self.ablate(ctx, res)
        return res

    def ablate(self, ctx: RunContext, res: CombineResult) -> tuple[list[AblationRow], str]:
        # validate helper: bot.validate.ablate.ablate(target, candidate, base, run_dir=...) -> Ablation (leave-one-out)
        fn = _piece("bot.validate.ablate", "ablate")
        if fn is None:
            return [], "ablation skipped: bot.validate.ablate.ablate is not installed"
        t = self.target(ctx)
        if not t.device.startswith("cuda"):
            # An ablation is a speed attribution. On CPU the Triton kernels run in the interpreter,
            # whose time says nothing about the kernels (DESIGN decision 7: speed needs a GPU).
            return [], ("ablation needs a GPU: on cpu the Triton kernels run in the interpreter, whose "
                        "timings say nothing about them (DESIGN decision 7)")
        if ctx.options.ablation_rounds <= 0:
            return [], "ablation not run (--ablation-rounds 0)"
        if len(res.commits) < 2:
            return [], "one commit: its contribution is the stack's verdict (nothing to leave out)"
        cands = {c["id"]: c for c in ctx.results.get("generate", {}).get("candidates", [])}
        known = recall.stack_ablation(self._key(ctx), res.commits, cands, res.stack_sha256, ctx.options.ablation_rounds)
        if known is not None:
            rec, members = known
            res.ablation_known_from = rec.get("run_id", "")
            rows = [AblationRow(members[r["entry"]].candidate_id, members[r["entry"]].subject, r.get("without_ms"),
                                r.get("contribution_ms"), r.get("contribution_pct"), rec.get("device") or t.device)
                    for r in rec["rows"]]
            return rows, (f"leave-one-out known from run {rec.get('run_id')} ({rec.get('mode', 'eager')}, "
                          f"{rec.get('rounds')} rounds on {rec.get('device')}; base {_f(rec.get('base_ms'))} ms, stack "
                          f"{_f(rec.get('stack_ms'))} ms): the same stack (diff sha256 {res.stack_sha256[:12]}), base, "
                          f"preset, dtype, hardware, torch and triton, so not measured again (--revalidate measures it)")
        ctx.check_pause("ablating the stack")
        ab = as_dict(fn(t, res.head_sha, res.base_sha, run_dir=ctx.run_dir / "ablation", log=ctx.log,
                        rounds=ctx.options.ablation_rounds))
        res.ablation_measured = {k: ab.get(k) for k in ("mode", "rounds", "device", "base_ms", "stack_ms", "noise_pct")}
        by_sha = {c.sha: c for c in res.commits}
        out = []
        for d in ab.get("rows", []):
            c = by_sha.get(d.get("sha", ""))
            out.append(AblationRow(c.candidate_id if c else d.get("sha", "")[:12], c.subject if c else d.get("subject", ""),
                                   d.get("without_ms"), d.get("contribution_ms"), d.get("contribution_pct"),
                                   ab.get("device", t.device)))
        note = (f"leave-one-out, {ab.get('mode', 'eager')}, {ab.get('rounds')} rounds on {ab.get('device')}; "
                f"base {_f(ab.get('base_ms'))} ms, stack {_f(ab.get('stack_ms'))} ms, "
                f"round-to-round noise {_f(ab.get('noise_pct'), 1)}%")
        notes = [f"{(d.get('sha') or '')[:12]}: {d['note']}" for d in ab.get("rows", []) if d.get("note")]
        return out, note + ("; " + "; ".join(notes) if notes else "")

    # 8 -------------------------------------------------------------------------------------------
    def learn(self, ctx: RunContext) -> LearnResult:
        # generate helper: bot.knowledge.learn.learn(Outcome, store_dir=, lessons_dir=) -> Learned(entry_dir, lesson_path)
        learn_fn, outcome_cls = _piece("bot.knowledge.learn", "learn"), _piece("bot.knowledge.learn", "Outcome")
        if learn_fn is None or outcome_cls is None:
            return LearnResult("skipped", "learning not available (bot.knowledge.learn.learn is not installed)")
        verdicts = ctx.results.get("validate", {}).get("verdicts", [])
        searches = (ctx.results.get("generate") or {}).get("searches") or []
        if not verdicts and not searches:
            return LearnResult("skipped", "nothing validated, nothing to learn")
        from bot.knowledge.location import knowledge_of
        known_root = knowledge_of(ctx.options).root
        root = staging_copy(known_root, ctx.run_dir / "knowledge-staging")
        t = self.target(ctx)
        cands = {c["id"]: CandidateRecord(**c) for c in ctx.results["generate"]["candidates"]}
        repo = t.checkout.repo
        base = t.checkout.base_sha
        entries, lessons = [], []
        entry_of: dict[str, Path] = {}  # candidate id -> its store entry in the staging copy
        for v in verdicts:
            c = cands.get(v["candidate_id"])
            if c is None or (v.get("raw") or {}).get("reused"):
                continue  # a reused store verdict is already the store's knowledge
            added = {f: repo.git.show(f"{c.sha}:{f}", strip_newline_in_stdout=False) for f in
                     repo.git.diff(base, c.sha, "--name-only", "--diff-filter=A").splitlines() if f}
            kt = c.trailers
            o = outcome_cls(candidate_id=c.id, kind=c.kind, generator=c.generator, run_id=ctx.run_id,
                            status=v["status"], reason=v["reason"], numbers=v.get("raw", {}).get("speed_summary", {}),
                            device=v.get("device") or t.device, hardware=self._hardware(ctx),
                            engine=t.engine_name or t.workload.default_engine, engine_source=str(t.checkout.repo_path),
                            base_sha=base, commit_sha=c.sha, title=c.title, patch=repo.git.diff(base, c.sha),
                            verdict=(v.get("raw") or {}).get("verdict") or {}, command=ctx.options.command,
                            config=kt.get("Optbot-Config", ""),
                            changed_files=repo.git.diff(base, c.sha, "--name-only").splitlines(), added_files=added,
                            workload=t.workload.name, dtype=t.dtype,
                            adds_kernels=trailer_values(kt.get("Optbot-Adds-Kernels")),
                            removes_kernels=trailer_values(kt.get("Optbot-Removes-Kernels")), validated_by="bot.validate",
                            entry_id=next(iter(trailer_values(kt.get("Optbot-Entry"))), "")
                            if c.generator in ("replay", "variant-search") else "")
            learned = learn_fn(o, store_dir=root / "kernel_store", lessons_dir=root / "lessons")
            ld = as_dict(learned)
            if ld.get("entry_dir"):
                ed = Path(ld["entry_dir"])
                entry_of[c.id] = ed
                entries.append(str(ed.relative_to(root) / "entry.yaml"))
            if ld.get("lesson_path"):
                lessons.append(str(Path(ld["lesson_path"]).relative_to(root)))
        recall.record_stack_ablation(self._key(ctx), root, ctx.results.get("combine") or {}, cands, entry_of,
                                     ctx.run_id, ctx.options.command)
        record_search = _piece("bot.knowledge.records", "record_search")
        env = ctx.results.get("baseline", {}).get("env", {})
        for sr in searches:  # a search that kept the entry's config is finished: not searched again
            d = root / "kernel_store" / sr["entry_id"]
            if record_search is not None and (d / "entry.yaml").is_file():
                record_search(d, self._hardware(ctx), {"run_id": ctx.run_id, "config": sr["config"],
                                                       "status": sr["status"], "reason": sr["reason"], "adopted": False,
                                                       "torch": env.get("torch"), "triton": env.get("triton")})
        # what to commit is what was written, found by comparison with the knowledge the run read
        # (an adopted variant rewrites its entry's patch.diff and kernel sources; no learner reports it)
        files = staged_changes(known_root, root)
        hist = sum(1 for f in files if f.endswith("bench.json") and f.split("/")[1] not in {Path(e).parts[1] for e in entries})
        return LearnResult("done", f"{len(entries)} entries, {len(lessons)} lessons"
                           + (f", {hist} entry histories" if hist else ""), str(root), files, entries, lessons)

    # 9 -------------------------------------------------------------------------------------------
    def deliver(self, ctx: RunContext) -> DeliverResult:
        from bot.deliver import deliver
        return deliver.deliver(ctx)


def stack_diff_sha256(repo: git.Repo, base: str, head: str) -> str:
    """The stack's identity for what is known about it: the bytes of its full diff against the base, so
    the same changes reached through other commits (a tuned variant adopted by its entry) match."""
    import hashlib
    return hashlib.sha256(repo.git.diff(base, head, "--no-color", "--no-ext-diff", "--full-index").encode()).hexdigest()


def _prefer_tuned(accepted: list[CandidateRecord]) -> tuple[list[CandidateRecord], list[str]]:
    """A variant-search commit is its entry's patch with a tuned config: it and the plain replay add
    the same kernel file, so they cannot both land. When both are accepted the tuned one stays (its
    config won the microbenchmark) and the replay is dropped with that reason, instead of failing
    to cherry-pick later."""
    tuned = {c.trailers.get("Optbot-Entry"): c.id for c in accepted if c.generator == "variant-search"}
    keep, dropped = [], []
    for c in accepted:
        other = tuned.get(c.trailers.get("Optbot-Entry")) if c.generator == "replay" else None
        if other:
            dropped.append(f"{c.id}: superseded by {other} (the same entry with its tuned config)")
        else:
            keep.append(c)
    return keep, dropped


def reused_verdict(cid: str, known: dict) -> VerdictRecord:
    """A candidate's verdict taken from the store (bot/knowledge/known.py): the recorded numbers,
    labelled with where they came from. Nothing is re-measured or recomputed here."""
    w = known.get("numbers") or {}
    env = w.get("env") or {}

    def meas(mode: str, side: str) -> Measurement | None:
        sp = (w.get("speed") or {}).get(mode) or {}
        ms = sp.get(f"{side}_process_ms") or []
        if not ms:
            return None
        import statistics
        return Measurement(device=sp.get("device", "cuda"), device_name=env.get("device_name", ""), mode=mode,
                           median_ms=float(statistics.median(ms)), min_ms=float(min(ms)), max_ms=float(max(ms)),
                           stdev_ms=float(statistics.stdev(ms)) if len(ms) > 1 else 0.0,
                           n=int(sp.get("trials_per_process") or 0) * len(ms), passes=int(sp.get("passes") or 1))

    worst = w.get("worst_output") or {}
    rec = VerdictRecord(candidate_id=cid, status="accepted",
                        reason=f"reused: {known.get('summary') or w.get('summary', '')} (store verdict recorded "
                               f"{known.get('recorded_at', '?')} by `{known.get('command', '?')}`; same patch, "
                               f"base, workload, preset, dtype, hardware, torch and triton)",
                        device=env.get("device_kind", "cuda"),
                        base_eager=meas("eager", "base"), cand_eager=meas("eager", "patched"),
                        base_graph=meas("graph", "base"), cand_graph=meas("graph", "patched"),
                        graph_note=((w.get("speed") or {}).get("graph") or {}).get("note", "") or "",
                        correctness=[{"output": worst.get("output"), "shape": (worst.get("label") or "").split(" seed ")[0],
                                      "seed": (worst.get("label") or "").partition(" seed ")[2], "max_abs": worst.get("max_abs"),
                                      "max_rel": worst.get("rel_l2"), "ok": True, "device": env.get("device_kind", "cuda")}]
                        if worst else [])
    rec.raw = {"reused": True, "summary": w.get("summary"), "seeds": w.get("seeds"), "shapes": w.get("shapes"),
               "rule": w.get("rule"),
               "speed_summary": {m: {"speedup": sp.get("speedup"), "device": sp.get("device"), "outcome": sp.get("outcome")}
                                 for m, sp in (w.get("speed") or {}).items()}}
    return rec


def verdict_from_dict(cid: str, v: dict) -> VerdictRecord:
    """Accepts our own VerdictRecord JSON, or the validate helper's Verdict as a dict."""
    def m(key: str) -> Measurement | None:
        x = v.get(key)
        if isinstance(x, Measurement) or x is None:
            return x
        if "median_ms" in x and "mode" in x and "device_name" in x:
            return Measurement(**{k: x[k] for k in Measurement.__dataclass_fields__ if k in x})
        return Measurement.from_timing(x, x.get("device_name", ""), x.get("passes", 1))
    status = v.get("status") or v.get("verdict") or "held"
    return VerdictRecord(candidate_id=cid, status=status, reason=v.get("reason", ""), device=v.get("device", ""),
                         base_eager=m("base_eager"), cand_eager=m("cand_eager"), base_graph=m("base_graph"),
                         cand_graph=m("cand_graph"), graph_note=v.get("graph_note", ""),
                         correctness=list(v.get("correctness", [])), micro=list(v.get("micro", [])),
                         raw=v.get("raw", {}))


def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def verdict_from_validator(cid: str, v: dict) -> VerdictRecord:
    """bot.validate.verdict.Verdict (as a dict) -> VerdictRecord: speed per mode -> Measurements, correctness
    checks -> rows (max abs, rel L2), kernel microbenchmarks -> rows; each labelled with its device."""
    import statistics
    env = v.get("env") or {}
    dev_name = env.get("device_name", "")

    def meas(ms: list, s: dict) -> Measurement | None:
        if not ms:
            return None
        return Measurement(device=s.get("device", "?"), device_name=dev_name, mode=s.get("mode", "eager"),
                           median_ms=float(statistics.median(ms)), min_ms=float(min(ms)), max_ms=float(max(ms)),
                           stdev_ms=float(statistics.stdev(ms)) if len(ms) > 1 else 0.0,
                           n=int(s.get("n", 0)) * len(ms), passes=int(s.get("passes", 1) or 1))

    rec = VerdictRecord(candidate_id=cid, status=v.get("status", "held"),
                        reason=(v.get("reason") or "accepted") + (f": {v['summary']}" if v.get("summary") else ""),
                        device=env.get("device_kind") or v.get("device", ""))
    notes = []
    for s in v.get("speed", []):
        b, c = meas(s.get("base_ms", []), s), meas(s.get("candidate_ms", []), s)
        if s.get("mode") == "graph":
            rec.base_graph, rec.cand_graph = b, c
        else:
            rec.base_eager, rec.cand_eager = b, c
        if s.get("note"):
            notes.append(f"{s.get('mode')}: {s['note']}")
    if rec.base_graph is None:
        notes.append("graph: not measured" + (" (CUDA graphs need a CUDA device)" if rec.device == "cpu" else ""))
    rec.graph_note = "; ".join(notes)
    corr = v.get("correctness") or {}
    for ch in corr.get("checks", []):
        label = ch.get("label", "")
        shape, _, seed = label.partition(" seed ")
        rec.correctness.append({"output": ch.get("output"), "shape": shape, "seed": seed, "max_abs": ch.get("max_abs"),
                                "max_rel": ch.get("rel_l2"), "ok": ch.get("ok"), "device": rec.device})
    for k in corr.get("kernels", []):
        micro = k.get("micro")
        if isinstance(micro, dict) and isinstance(micro.get("reference"), dict) and isinstance(micro.get("kernel"), dict):
            ref, ker = micro["reference"], micro["kernel"]
            aa = micro.get("reference_aa") if isinstance(micro.get("reference_aa"), dict) else None
            rec.micro.append({"kernel": k.get("name"), "shape": micro.get("shape"), "base_ms": ref.get("median_ms"),
                              "cand_ms": ker.get("median_ms"),
                              "speedup": (ref["median_ms"] / ker["median_ms"]) if ker.get("median_ms") else None,
                              "aa_ms": aa.get("median_ms") if aa else None,
                              "n": ker.get("n", ""), "device": ker.get("device", "cuda")})
        elif isinstance(micro, str):
            rec.micro.append({"kernel": k.get("name"), "shape": "", "base_ms": None, "cand_ms": None, "speedup": None,
                              "n": "", "device": micro})
    rec.raw = {"verdict": v,  # the validator's whole verdict: learn records it in the store (bench.json)
               "summary": v.get("summary"), "run_dir": v.get("run_dir"), "notes": v.get("notes", []),
               "speed_summary": {s.get("mode"): {"speedup": s.get("speedup"), "device": s.get("device"),
                                                  "outcome": s.get("outcome")} for s in v.get("speed", [])},
               "seeds": corr.get("seeds"), "shapes": corr.get("shapes"), "rule": corr.get("rule")}
    return rec


def ensure(cond: bool, msg: str) -> None:
    if not cond:
        raise OptbotError(msg)
