"""Several agents in parallel, `samples` per strategy, then the strongest is iterated on.

Round 1 runs every strategy `cfg.samples` times at once (threads: the work is HTTP calls and runner
subprocesses), each agent in its own worktree and named `r1-<strategy>-s<k>` (`r1-<strategy>` when a
strategy has one sample); the samples of a strategy are told their number, and every sample after the
first to take another approach than the obvious one (prompts.sample_line). The strongest by validated
result (accepted first, then speedup) starts round 2 ("refine"), which begins from that candidate's
commit with its verdict as feedback, plus a digest of what the other agents of the earlier rounds
found (prompts.findings_digest). Up to `cfg.rounds` refine rounds run, each from the strongest so
far; a refinement replaces the best only if its own validated result is stronger. All agents share
one USD budget and one wall-time budget (the pool).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import anthropic

from bot.generate.agent import prompts
from bot.generate.agent.budget import CostPool, Spend
from bot.generate.agent.config import OFF_MESSAGE, AgentConfig, api_key_present
from bot.generate.agent.loop import AgentResult, AgentTask, run_agent
from bot.generate.agent.validation import strength, verdict_line


@dataclass
class AgentGeneration:
    off: bool = False
    message: str = ""
    results: list[AgentResult] = field(default_factory=list)
    best: AgentResult | None = None
    spend: Spend = field(default_factory=Spend)
    rounds_note: str = ""  # why fewer refine rounds ran than configured ("" when all ran)

    def to_json(self) -> dict:
        return {"off": self.off, "message": self.message, "spend": self.spend.to_json(),
                "rounds_note": self.rounds_note, "best": self.best.name if self.best else None,
                "results": [r.to_json() for r in self.results]}


def make_client(cfg: AgentConfig) -> anthropic.Anthropic:
    # base_url None: the client reads ANTHROPIC_BASE_URL itself, else the public endpoint.
    return anthropic.Anthropic(api_key=os.environ["ANTHROPIC_API_KEY"], max_retries=cfg.max_retries, timeout=cfg.timeout_s)


def agent_name(prefix: str, strategy: str, sample: int, samples: int) -> str:
    """A round-1 agent's name: r1-<strategy>-s<k>, or r1-<strategy> when the strategy has one sample."""
    return f"{prefix}r1-{strategy}" + (f"-s{sample}" if samples > 1 else "")


def generate(task: AgentTask, cfg: AgentConfig | None = None, client: anthropic.Anthropic | None = None,
             log=print, *, prefix: str = "") -> AgentGeneration:
    """The agents on one opportunity (the module docstring gives the rounds). `prefix` goes before
    every agent's name (its worktree and transcript are named after it): the generate step passes
    one per opportunity."""
    if not api_key_present():
        log(OFF_MESSAGE)
        return AgentGeneration(off=True, message=OFF_MESSAGE)
    cfg = cfg or AgentConfig.from_env()
    client = client or make_client(cfg)
    pool = CostPool(cfg.max_cost_usd, cfg.max_wall_s)
    gen = AgentGeneration(spend=pool.spent)
    samples = max(1, cfg.samples)
    # sample 1 of every strategy first: with fewer agents at once than jobs, each strategy starts early
    jobs = [(s, k) for k in range(1, samples + 1) for s in cfg.strategies]
    log(f"agent: {len(cfg.strategies)} strategies ({', '.join(cfg.strategies)}) x {samples} samples, then up to "
        f"{max(0, cfg.rounds)} refine rounds, on {task.opportunity.get('kind')} {task.opportunity.get('id')} "
        f"with {cfg.model}; budgets {cfg.max_turns} turns / {cfg.max_tokens:,} tokens per agent, "
        f"${cfg.max_cost_usd:.2f} in all" + (f", {cfg.max_wall_s:.0f} wall s" if cfg.max_wall_s is not None else ""))
    with ThreadPoolExecutor(max_workers=max(1, min(cfg.parallel, len(jobs)))) as ex:
        futs = [(s, n, ex.submit(run_agent, task, s, cfg, client, pool, name=n, sample=k, samples=samples, log=log))
                for s, k in jobs for n in [agent_name(prefix, s, k, samples)]]
        gen.results = [_result_or_failure(s, n, f, log) for s, n, f in futs]
    best = _strongest(gen.results)
    for rnd in range(2, 2 + max(0, cfg.rounds)):
        why = ("no agent made a candidate" if best is None else
               f"the wall-time budget is spent ({pool.wall_spent()})" if pool.wall_spent() else
               f"the USD budget is spent (${pool.spent.cost_usd:.4f} of ${pool.max_cost_usd:.4f})"
               if pool.left() <= 0 else "")
        if why:
            gen.rounds_note = f"refine round {rnd} not run: {why}"
            log(f"agent: {gen.rounds_note}")
            break
        fb = best.verdict.render() if best.verdict else best.error
        others = prompts.findings_digest([r for r in gen.results if r is not best])
        name = f"{prefix}r{rnd}-refine"
        try:
            r = run_agent(task, "refine", cfg, client, pool, name=name, start_ref=best.candidate.commit_sha,
                          feedback=fb, findings=others, log=log)
        except Exception as e:  # noqa: BLE001 - one failed agent must not lose the others' candidates
            r = _failed("refine", name, e, log)
        gen.results.append(r)
        if r.candidate and strength(r.verdict) > strength(best.verdict):
            best = r
    gen.best = best
    log(f"agent cost: {pool.spent.line()} (model {cfg.model}); best: "
        + (f"{best.name} ({verdict_line(best.verdict) if best.verdict else best.error})" if best else "none"))
    return gen


def _failed(strategy: str, name: str, e: Exception, log) -> AgentResult:
    log(f"agent {name}: failed: {type(e).__name__}: {e}")
    return AgentResult(name, strategy, f"failed: {type(e).__name__}: {str(e)[:300]}", Spend(), "", "")


def _result_or_failure(strategy: str, name: str, fut, log) -> AgentResult:
    try:
        return fut.result()
    except Exception as e:  # noqa: BLE001 - e.g. a worktree that cannot be made; the other agents go on
        return _failed(strategy, name, e, log)


def _strongest(results: list[AgentResult]) -> AgentResult | None:
    with_cand = [r for r in results if r.candidate is not None]
    return max(with_cand, key=lambda r: strength(r.verdict)) if with_cand else None

