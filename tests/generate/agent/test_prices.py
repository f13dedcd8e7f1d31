"""The price table, the cost of a response from its usage, and a model the table does not know."""
from __future__ import annotations

import pytest

from bot.errors import ConfigError
from bot.generate.agent.config import AgentConfig
from bot.generate.agent.prices import PRICES, Price, cost_usd, price_for


def test_price_table_and_cost():
    assert price_for("claude-sonnet-5-5") == PRICES["claude-sonnet-5-5"]
    assert price_for("claude-sonnet-4-5-20250929") == PRICES["claude-sonnet-4-5"]  # dated id -> its family
    assert price_for("claude-sonnet-5-5-20260901") == PRICES["claude-sonnet-5-5"]  # longest prefix wins
    p = Price(2.0, 10.0, 2.5, 0.2)
    u = {"input_tokens": 1000, "output_tokens": 500, "cache_creation_input_tokens": 2000, "cache_read_input_tokens": 10000}
    assert cost_usd(p, u) == pytest.approx((1000 * 2 + 500 * 10 + 2000 * 2.5 + 10000 * 0.2) / 1e6)


def test_unknown_model_needs_a_price(monkeypatch):
    monkeypatch.delenv("OPTBOT_AGENT_PRICES", raising=False)
    with pytest.raises(ConfigError, match="OPTBOT_AGENT_MODEL"):
        AgentConfig(model="claude-unknown-9")
    monkeypatch.setenv("OPTBOT_AGENT_PRICES", "1,2,3,4")
    assert AgentConfig(model="claude-unknown-9").price == Price(1, 2, 3, 4)
