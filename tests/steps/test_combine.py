"""The combine step (bot/steps/combine.py): which accepted candidates make the stack."""
from __future__ import annotations

from bot.generate.candidate import Candidate
from bot.steps.combine import _prefer_tuned


def test_tuned_variant_supersedes_its_plain_replay():
    def cand(cid, gen, entry):
        return Candidate(cid, "o", "k", gen, "", "0" * 40, trailers={"Optbot-Entry": entry})

    keep, dropped = _prefer_tuned([cand("replay-a", "replay", "a"), cand("replay-b", "replay", "b"),
                                   cand("variant-a", "variant-search", "a"), cand("agent-1", "agent/fuse", "none")])
    assert [c.id for c in keep] == ["replay-b", "variant-a", "agent-1"]
    assert dropped == ["replay-a: superseded by variant-a (the same entry with its tuned config)"]
