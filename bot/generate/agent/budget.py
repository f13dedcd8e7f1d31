"""Budgets of an agent run: turns, billed tokens, USD and wall seconds. Cost is computed from the usage
fields each response returns (bot/generate/agent/prices.py); the USD and wall-time budgets are shared by
every agent of a generation (the pool), the USD one guarded by a lock (agents run in threads). The
wall-time budget counts from the pool's creation (`optimize` passes what is left of its --budget)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from bot.generate.agent.prices import Price, cost_usd, usage_dict


@dataclass
class Spend:
    """What one agent (or a whole generation) used."""
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def billed_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    def add(self, usage: dict, cost: float) -> None:
        self.turns += 1
        for k, v in usage.items():
            setattr(self, k, getattr(self, k) + v)
        self.cost_usd += cost

    def to_json(self) -> dict:
        return {"turns": self.turns, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cache_creation_input_tokens": self.cache_creation_input_tokens,
                "cache_read_input_tokens": self.cache_read_input_tokens,
                "billed_tokens": self.billed_tokens, "cost_usd": round(self.cost_usd, 6)}

    def line(self) -> str:
        return (f"{self.turns} turns, {self.billed_tokens:,} tokens (in {self.input_tokens:,}, out {self.output_tokens:,}, "
                f"cache write {self.cache_creation_input_tokens:,}, cache read {self.cache_read_input_tokens:,}), "
                f"${self.cost_usd:.4f}")


@dataclass
class CostPool:
    """The USD and wall-time budgets shared by all agents of one generation."""
    max_cost_usd: float
    max_wall_s: float | None = None  # None: no wall-time limit
    spent: Spend = field(default_factory=Spend)
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def wall_left(self) -> float | None:
        """Seconds left of the wall-time budget (None: unlimited)."""
        return None if self.max_wall_s is None else self.max_wall_s - (time.monotonic() - self.started)

    def wall_spent(self) -> str | None:
        """Why the wall-time budget stops further work, or None."""
        left = self.wall_left()
        if left is not None and left <= 0:
            return f"wall-time budget reached ({time.monotonic() - self.started:.0f} of {self.max_wall_s:.0f} s)"
        return None

    def charge(self, usage: dict, cost: float) -> None:
        with self._lock:
            self.spent.add(usage, cost)

    def left(self) -> float:
        with self._lock:
            return self.max_cost_usd - self.spent.cost_usd


# A request whose output could not reach this many tokens within the budget left is not sent: it
# would stop mid-answer, or overshoot by a whole response.
MIN_OUTPUT_TOKENS = 256


def usd_buys_no_turn(left_usd: float, price: Price) -> bool:
    """Whether `left_usd` buys no agent turn: nothing left, or under MIN_OUTPUT_TOKENS of output."""
    return left_usd <= 0 or (price.output > 0 and left_usd / price.output * 1e6 < MIN_OUTPUT_TOKENS)


class AgentBudget:
    """Per-agent limits (turns, tokens) plus the shared USD pool."""

    def __init__(self, price: Price, max_turns: int, max_tokens: int, pool: CostPool, max_output_tokens: int):
        self.price, self.max_turns, self.max_tokens, self.pool = price, max_turns, max_tokens, pool
        self.max_output_tokens = max_output_tokens
        self.spent = Spend()

    def stop_reason(self) -> str | None:
        """Why no further request may be sent, or None."""
        if self.spent.turns >= self.max_turns:
            return f"turn budget reached ({self.spent.turns} of {self.max_turns} turns)"
        if self.spent.billed_tokens >= self.max_tokens:
            return f"token budget reached ({self.spent.billed_tokens:,} of {self.max_tokens:,} tokens)"
        wall = self.pool.wall_spent()
        if wall:
            return wall
        left = self.pool.left()
        if left <= 0:
            return f"cost budget reached (${self.pool.spent.cost_usd:.4f} of ${self.pool.max_cost_usd:.4f})"
        # The next response's output alone must fit in what is left; otherwise stop now rather than
        # overshoot by a whole response.
        if usd_buys_no_turn(left, self.price):
            return f"cost budget nearly spent (${left:.4f} left buys under {MIN_OUTPUT_TOKENS} output tokens)"
        if self.max_tokens - self.spent.billed_tokens < MIN_OUTPUT_TOKENS:
            return f"token budget nearly spent ({self.max_tokens - self.spent.billed_tokens} tokens left)"
        return None

    def _by_cost(self) -> int:
        return int(self.pool.left() / self.price.output * 1e6) if self.price.output > 0 else self.max_output_tokens

    def output_cap(self) -> int:
        """max_tokens for the next request: bounded by the per-response cap, the token budget left and
        the dollars left at the output price."""
        by_tokens = self.max_tokens - self.spent.billed_tokens
        return max(0, min(self.max_output_tokens, self._by_cost(), by_tokens))

    def charge(self, usage_obj) -> tuple[dict, float]:
        usage = usage_dict(usage_obj)
        cost = cost_usd(self.price, usage)
        self.spent.add(usage, cost)
        self.pool.charge(usage, cost)
        return usage, cost
