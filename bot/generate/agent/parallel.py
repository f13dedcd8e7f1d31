"""Several agents in parallel, one per strategy, then the strongest is iterated on.

Round 1 runs every strategy at once (threads: the work is HTTP calls and runner subprocesses), each
in its own worktree. The strongest by validated result (accepted first, then speedup) starts round 2
("refine"), which begins from that candidate's commit with its verdict as feedback. A refinement
replaces the best only if its own validated result is stronger. All agents share one USD budget and
one wall-time budget.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import anthropic

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

    def to_json(self) -> dict:
        return {"off": self.off, "message": self.message, "spend": self.spend.to_json(),
                "best": self.best.name if self.best else None, "results": [r.to_json() for r in self.results]}


def make_client(cfg: AgentConfig) -> anthropic.Anthropic:
    # base_url None: the client reads ANTHROPIC_BASE_URL itself, else the public endpoint.
    return anthropic.Anthropic(api_key=os.environ["ANTHROPIC_API_KEY"], max_retries=cfg.max_retries, timeout=cfg.timeout_s)


def generate(task: AgentTask, cfg: AgentConfig | None = None, client: anthropic.Anthropic | None = None,
             log=print) -> AgentGeneration:
    if not api_key_present():
        log(OFF_MESSAGE)
        return AgentGeneration(off=True, message=OFF_MESSAGE)
    cfg = cfg or AgentConfig.from_env()
    client = client or make_client(cfg)
    pool = CostPool(cfg.max_cost_usd, cfg.max_wall_s)
    gen = AgentGeneration(spend=pool.spent)
    log(f"agent: {len(cfg.strategies)} strategies ({', '.join(cfg.strategies)}) on {task.opportunity.get('kind')} "
        f"with {cfg.model}; budgets {cfg.max_turns} turns / {cfg.max_tokens:,} tokens per agent, ${cfg.max_cost_usd:.2f} in all"
        + (f", {cfg.max_wall_s:.0f} wall s" if cfg.max_wall_s is not None else ""))
    with ThreadPoolExecutor(max_workers=max(1, min(cfg.parallel, len(cfg.strategies)))) as ex:
        futs = [(s, ex.submit(run_agent, task, s, cfg, client, pool, name=f"r1-{s}", log=log)) for s in cfg.strategies]
        gen.results = [_result_or_failure(s, f"r1-{s}", f, log) for s, f in futs]
    best = _strongest(gen.results)
    for rnd in range(2, 2 + max(0, cfg.rounds)):
        if best is None or best.candidate is None or pool.left() <= 0 or pool.wall_spent():
            break
        fb = best.verdict.render() if best.verdict else best.error
        try:
            r = run_agent(task, "refine", cfg, client, pool, name=f"r{rnd}-refine", start_ref=best.candidate.commit_sha,
                          feedback=fb, log=log)
        except Exception as e:  # noqa: BLE001 - one failed agent must not lose the others' candidates
            r = _failed("refine", f"r{rnd}-refine", e, log)
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

