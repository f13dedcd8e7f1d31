"""The nine steps of `optbot optimize`, each a method of ``Stages`` returning a typed result.

This module is THE adapter between the orchestrator and the pieces built elsewhere:
  analyze   bot.analyze   (opportunities)           -> Stages.analyze
  generate  bot.generate  (store replay, variant search, agent, compile region) -> Stages.generate
  validate  bot.validate  (validate -> Verdict, ablation)                     -> Stages.validate / combine
  learn     bot.learn     (store entries, lessons)                            -> Stages.learn
Each adapter looks its piece up with ``_piece`` and converts what comes back into the dataclasses
below. Where a piece is not installed, the step is recorded as "skipped" with the reason; it never
makes up a result. checkout, baseline and profile use the foundation's own code (bot/target,
runner `step` and `profile` jobs through bot/jobs.run_job).

Every result is a dataclass that bot/optimize/state.py writes as <step>.json in the run directory.
"""
from __future__ import annotations

import concurrent.futures as futures
import importlib
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable

import git

from bot.engine import add_worktree
from bot.errors import OptbotError, RunnerError
from bot.jobs import run_job
from bot.target import Target, base_worktree, resolve_target
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


@dataclass
class GenerateResult:
    status: str
    reason: str
    candidates: list[CandidateRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    agent_cost_usd: float = 0.0


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
    """Git trailers of a commit (DESIGN decision 5), e.g. {"Optbot-Kind": "merge-siblings"}."""
    out = repo.git.log("-1", "--format=%(trailers:only,unfold)", sha)
    trailers = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            trailers[k.strip()] = v.strip()
    return trailers


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
        from bot.optimize.state import write_json_atomic
        write_json_atomic(full, p)
        kernels = sorted(p.get("kernels", []), key=lambda k: -float(k.get("ms", 0)))[:15]
        return ProfileResult(status="done", device=p.get("device", "?"), total_ms=float(p.get("total_ms", 0.0)),
                             categories=p.get("categories", {}), top_kernels=kernels,
                             launches=p.get("launches") or p.get("launch_count"), profile_file=str(full),
                             env=p.get("env", {}))

    # 4 -------------------------------------------------------------------------------------------
    def analyze(self, ctx: RunContext) -> AnalyzeResult:
        # WIRE (analyze helper): expected `bot.analyze.find_opportunities(profile: dict, target, worktree)
        # -> list[Opportunity]`; Opportunity is a dataclass (kind, location, ops, est. gain, confidence, generator).
        fn = _piece("bot.analyze", "find_opportunities")
        if fn is None:
            return AnalyzeResult("skipped", "analysis not available (bot.analyze.find_opportunities is not installed)")
        import json
        profile = json.loads(Path(ctx.results["profile"]["profile_file"]).read_text())
        wt = Path(ctx.results["checkout"]["base_worktree"])
        opps = [as_dict(o) for o in fn(profile, self.target(ctx), wt)]
        return AnalyzeResult("done", f"{len(opps)} opportunities", opps)

    # 5 -------------------------------------------------------------------------------------------
    def generate(self, ctx: RunContext) -> GenerateResult:
        # WIRE (generate helper): expected `bot.generate.generate(opportunities, target, run_dir, budget=...,
        # new_worktree=callable) -> list[Candidate]` (bot/generate/candidate.py: a commit in its own worktree).
        fn = _piece("bot.generate", "generate")
        if fn is None:
            return GenerateResult("skipped", "candidate generation not available (bot.generate.generate is not installed)")
        if not ctx.results.get("analyze", {}).get("opportunities"):
            why = ctx.results.get("analyze", {}).get("reason", "no opportunities")
            return GenerateResult("skipped", f"nothing to generate from: {why}")
        t = self.target(ctx)

        def new_worktree(name: str) -> Path:
            return add_worktree(t.checkout, f"cand-{t.checkout.base_sha[:12]}-{name}")

        cands = fn(ctx.results["analyze"]["opportunities"], t, ctx.run_dir, budget=ctx.budget,
                   new_worktree=new_worktree)
        recs = [self._candidate_record(t, c, i) for i, c in enumerate(cands)]
        cost = sum(float(getattr(c, "cost_usd", 0.0) or 0.0) for c in cands)
        return GenerateResult("done", f"{len(recs)} candidates", recs, agent_cost_usd=cost)

    @staticmethod
    def _candidate_record(t: Target, c: Any, i: int) -> CandidateRecord:
        d = as_dict(c)
        sha = d.get("sha") or d.get("commit")
        repo = t.checkout.repo
        trailers = commit_trailers(repo, sha)
        return CandidateRecord(id=str(d.get("id") or f"c{i + 1}"), title=d.get("title") or repo.commit(sha).summary,
                               sha=sha, worktree=str(d.get("worktree", "")), generator=str(d.get("generator", "")),
                               kind=d.get("kind") or trailers.get("Optbot-Kind", ""),
                               opportunity=d.get("opportunity") or trailers.get("Optbot-Opportunity", ""),
                               description=d.get("description") or repo.commit(sha).message, trailers=trailers,
                               estimated_gain_ms=d.get("estimated_gain_ms"))

    # 6 -------------------------------------------------------------------------------------------
    def validate(self, ctx: RunContext) -> ValidateResult:
        cands = [CandidateRecord(**c) for c in ctx.results.get("generate", {}).get("candidates", [])]
        if not cands:
            return ValidateResult("skipped", "no candidates to validate")
        fn = self._validator()
        if fn is None:
            return ValidateResult("skipped", "validation not available (bot.validate.validate is not installed); "
                                             "no candidate can be accepted without it")
        t = self.target(ctx)
        gpus = max(1, ctx.options.gpus)
        devices = [f"cuda:{i}" for i in range(gpus)] if t.device.startswith("cuda") and gpus > 1 else [t.device]

        def one(i_c):
            i, c = i_c
            if ctx.budget.exhausted():
                return VerdictRecord(c.id, "held", "wall-time budget spent before this candidate was validated")
            return self.verdict_of(ctx, c.sha, c.id, devices[i % len(devices)])

        with futures.ThreadPoolExecutor(max_workers=len(devices)) as pool:
            verdicts = list(pool.map(one, enumerate(cands)))
        n_ok = sum(v.status == "accepted" for v in verdicts)
        return ValidateResult("done", f"{n_ok} of {len(verdicts)} accepted", verdicts)

    def _validator(self):
        # WIRE (validate helper): expected `bot.validate.validate(target, base: str, candidate: str, device=...,
        # run_dir=...) -> Verdict` with status accepted|rejected|held, reason, and its numbers.
        return _piece("bot.validate", "validate")

    def verdict_of(self, ctx: RunContext, ref: str, cid: str, device: str) -> VerdictRecord:
        fn = self._validator()
        t = self.target(ctx)
        v = as_dict(fn(t, t.checkout.base_sha, ref, device=device, run_dir=ctx.run_dir / "validate" / cid))
        return verdict_from_dict(cid, v)

    # 7 -------------------------------------------------------------------------------------------
    def combine(self, ctx: RunContext) -> CombineResult:
        from bot.optimize.stack import build_stack

        t = self.target(ctx)
        cands = {c["id"]: CandidateRecord(**c) for c in ctx.results.get("generate", {}).get("candidates", [])}
        verdicts = {v["candidate_id"]: verdict_from_dict(v["candidate_id"], v)
                    for v in ctx.results.get("validate", {}).get("verdicts", [])}
        accepted = [cands[cid] for cid, v in verdicts.items() if v.status == "accepted" and cid in cands]
        branch = branch_name(t.workload.name, t.checkout.base_sha)
        commits, dropped, head = build_stack(t.checkout, branch, accepted, verdicts, ctx)
        res = CombineResult("done", branch, t.checkout.base_sha, head, commits, dropped)
        if not commits:
            res.stack_note = "no accepted optimization: the branch equals the base"
            res.ablation_note = "nothing to ablate"
            return res
        if self._validator() is None:
            res.stack_note = "stack re-validation skipped: validation not available"
        else:
            res.stack_verdict = self.verdict_of(ctx, head, "stack", t.device)
            res.stack_note = f"stack re-validated: {res.stack_verdict.status} ({res.stack_verdict.reason})"
        res.ablation, res.ablation_note = self.ablate(ctx, res)
        return res

    def ablate(self, ctx: RunContext, res: CombineResult) -> tuple[list[AblationRow], str]:
        # WIRE (validate helper): expected `bot.validate.ablate(target, base: str, stack: str, run_dir=...)
        # -> rows` with, per commit: sha, without_ms, contribution_ms, contribution_pct, device.
        fn = _piece("bot.validate", "ablate")
        if fn is None:
            return [], "ablation skipped: bot.validate.ablate is not installed"
        if len(res.commits) == 1:
            v = res.stack_verdict
            if v and v.base_eager and v.cand_eager:
                gain = v.base_eager.median_ms - v.cand_eager.median_ms
                c = res.commits[0]
                return [AblationRow(c.candidate_id, c.subject, v.base_eager.median_ms, gain,
                                    100.0 * gain / v.base_eager.median_ms, v.cand_eager.device)], \
                    "one commit: its contribution is the stack's gain"
        t = self.target(ctx)
        rows = fn(t, res.base_sha, res.head_sha, run_dir=ctx.run_dir / "ablation")
        by_sha = {c.sha: c for c in res.commits}
        out = []
        for r in rows:
            d = as_dict(r)
            c = by_sha.get(d.get("sha", ""))
            out.append(AblationRow(c.candidate_id if c else d.get("sha", "")[:12], c.subject if c else d.get("subject", ""),
                                   d.get("without_ms"), d.get("contribution_ms"), d.get("contribution_pct"),
                                   d.get("device", t.device)))
        return out, "leave-one-out over the stack"

    # 8 -------------------------------------------------------------------------------------------
    def learn(self, ctx: RunContext) -> LearnResult:
        # WIRE (generate helper, bot/learn.py): expected `bot.learn.learn(candidates, verdicts, target, run_id,
        # knowledge_root) -> result` with the written files (kernel_store entries, lessons) relative to knowledge_root.
        fn = _piece("bot.learn", "learn")
        if fn is None:
            return LearnResult("skipped", "learning not available (bot.learn.learn is not installed)")
        if not ctx.results.get("validate", {}).get("verdicts"):
            return LearnResult("skipped", "nothing validated, nothing to learn")
        from bot.deliver.knowledge import knowledge_root
        root = knowledge_root(ctx.options)
        out = as_dict(fn(ctx.results["generate"]["candidates"], ctx.results["validate"]["verdicts"],
                         self.target(ctx), ctx.run_id, root))
        return LearnResult("done", f"{len(out.get('entries', []))} entries, {len(out.get('lessons', []))} lessons",
                           str(root), list(out.get("files", [])), list(out.get("entries", [])),
                           list(out.get("lessons", [])))

    # 9 -------------------------------------------------------------------------------------------
    def deliver(self, ctx: RunContext) -> DeliverResult:
        from bot.deliver import deliver
        return deliver.deliver(ctx)


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


def ensure(cond: bool, msg: str) -> None:
    if not cond:
        raise OptbotError(msg)
