"""Price table of the Anthropic models the agent may use, and the cost of one response.

The one place prices live. USD per million tokens, from Anthropic's published model pages
(platform.claude.com/docs, models/<name>/overview, read 2026-11-29): input, output, 5-minute cache
write, cache read. A model missing here can still be used by giving its prices in
OPTBOT_AGENT_PRICES="input,output,cache_write,cache_read" (USD per million tokens); without a price the
agent refuses to start, because a cost budget it cannot compute is no budget.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from bot.errors import ConfigError


@dataclass(frozen=True)
class Price:
    input: float  # USD per million uncached input tokens
    output: float
    cache_write: float  # 5-minute ephemeral cache write
    cache_read: float


# Model id (or the prefix of a dated id such as claude-sonnet-4-5-20250929) -> price.
PRICES: dict[str, Price] = {
    "claude-sonnet-5-5": Price(2.0, 10.0, 2.5, 0.2),
    "claude-sonnet-5": Price(2.0, 10.0, 2.5, 0.2),
    "claude-opus-5-5": Price(4.0, 20.0, 5.0, 0.4),
    "claude-opus-5": Price(5.0, 25.0, 6.25, 0.5),
    "claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.3),
    "claude-sonnet-4": Price(3.0, 15.0, 3.75, 0.3),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.1),
}


def price_for(model: str) -> Price:
    env = os.environ.get("OPTBOT_AGENT_PRICES")
    if env:
        try:
            a, b, c, d = (float(x) for x in env.split(","))
        except ValueError:
            raise ConfigError("environment", "OPTBOT_AGENT_PRICES", env,
                              "four numbers 'input,output,cache_write,cache_read' in USD per million tokens") from None
        return Price(a, b, c, d)
    # Longest matching prefix: "claude-sonnet-5-5-20260901" is Sonnet 5.5, not Sonnet 5.
    for key in sorted(PRICES, key=len, reverse=True):
        if model == key or model.startswith(key + "-"):
            return PRICES[key]
    raise ConfigError("environment", "OPTBOT_AGENT_MODEL", model,
                      f"a model with a known price ({', '.join(sorted(PRICES))}) or prices in OPTBOT_AGENT_PRICES")


def usage_dict(usage) -> dict[str, int]:
    """The four token counts of a response's usage (an SDK object or a dict); absent counts are 0."""
    get = usage.get if isinstance(usage, dict) else (lambda k, d=None: getattr(usage, k, d))
    return {k: int(get(k, 0) or 0) for k in
            ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")}


def cost_usd(price: Price, usage) -> float:
    """Cost of one response from the usage the API returned. input_tokens counts only the uncached
    input; cache writes and reads are billed at their own rates on top."""
    u = usage_dict(usage)
    return (u["input_tokens"] * price.input + u["output_tokens"] * price.output
            + u["cache_creation_input_tokens"] * price.cache_write
            + u["cache_read_input_tokens"] * price.cache_read) / 1e6
