"""Agent settings: model, budgets, strategies. Read from the environment, overridable in code.

  ANTHROPIC_API_KEY        required; without it the agent is off (one line says so)
  ANTHROPIC_BASE_URL       optional; the anthropic client's own variable (tests point it at the stand-in)
  OPTBOT_AGENT_MODEL       model id (default below)
  OPTBOT_AGENT_MAX_TURNS   model calls per agent (default 30)
  OPTBOT_AGENT_MAX_TOKENS  billed tokens per agent: input + output + cache writes + cache reads (default 2,000,000)
  OPTBOT_AGENT_MAX_COST    USD for all the agent's work in a run: every opportunity, agent and round (default 5.0;
                           `optimize --budget` replaces it); each opportunity gets what earlier ones left
  OPTBOT_AGENT_MAX_WALL_S  wall seconds for the same (default: none; `optimize` passes what is left of its
                           --budget wall time, the smaller of the two)
  OPTBOT_AGENT_STRATEGIES  comma-separated strategy names run in parallel (default fuse,tile-tune,restructure)
  OPTBOT_AGENT_SAMPLES     agents per strategy in round 1, each told its sample number (default 2)
  OPTBOT_AGENT_ROUNDS      refinement rounds on the strongest candidate after the first, each told what the
                           other agents found (default 2; 0: none)
  OPTBOT_AGENT_PARALLEL    agents running at once (default 6)
  OPTBOT_AGENT_MAX_OPPORTUNITIES  opportunities worked in rank order, while the budgets last (default 3)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from bot.generate.agent.prices import Price, price_for
from bot.errors import ConfigError

DEFAULT_MODEL = "claude-sonnet-5-5"
DEFAULT_STRATEGIES = ("fuse", "tile-tune", "restructure")
OFF_MESSAGE = "agent generator off: ANTHROPIC_API_KEY is not set (set it to let the Anthropic agent write candidates)"


def api_key_present() -> bool:
    return bool(os.environ.get("ANTHROPIC_API_KEY", "").strip())


def _env_num(name: str, default, cast, zero_ok: bool = False):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        val = cast(raw)
    except ValueError:
        raise ConfigError("environment", name, raw, f"a {cast.__name__}") from None
    if val < 0 or (val == 0 and not zero_ok):
        raise ConfigError("environment", name, raw, "a number >= 0" if zero_ok else "a positive number")
    return val


@dataclass
class AgentConfig:
    model: str = DEFAULT_MODEL
    max_turns: int = 30
    max_tokens: int = 2_000_000
    max_cost_usd: float = 5.0
    max_wall_s: float | None = None  # the whole generation, all agents
    max_output_tokens: int = 8192  # per response
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    samples: int = 2  # round-1 agents per strategy
    rounds: int = 2  # refine rounds after round 1
    parallel: int = 6  # agents at once
    max_opportunities: int = 3  # opportunities the generate step works on, in rank order
    max_retries: int = 2  # the anthropic client's own retries on 429/5xx/529
    timeout_s: float = 600.0  # per request
    job_timeout_s: float = 900.0  # per validation job the agent starts
    price: Price = field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        if self.price is None:
            self.price = price_for(self.model)

    @classmethod
    def from_env(cls, **overrides) -> "AgentConfig":
        kw = dict(
            model=os.environ.get("OPTBOT_AGENT_MODEL") or DEFAULT_MODEL,
            max_turns=_env_num("OPTBOT_AGENT_MAX_TURNS", 30, int),
            max_tokens=_env_num("OPTBOT_AGENT_MAX_TOKENS", 2_000_000, int),
            max_cost_usd=_env_num("OPTBOT_AGENT_MAX_COST", 5.0, float),
            max_wall_s=_env_num("OPTBOT_AGENT_MAX_WALL_S", None, float),
            samples=_env_num("OPTBOT_AGENT_SAMPLES", 2, int),
            rounds=_env_num("OPTBOT_AGENT_ROUNDS", 2, int, zero_ok=True),
            parallel=_env_num("OPTBOT_AGENT_PARALLEL", 6, int),
            max_opportunities=_env_num("OPTBOT_AGENT_MAX_OPPORTUNITIES", 3, int),
        )
        strat = os.environ.get("OPTBOT_AGENT_STRATEGIES")
        if strat:
            kw["strategies"] = tuple(s.strip() for s in strat.split(",") if s.strip())
        kw.update(overrides)
        return cls(**kw)
