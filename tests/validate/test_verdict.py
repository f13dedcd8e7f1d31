"""bot/validate/verdict.py: the typed verdict round-trips through JSON and renders every number."""
from __future__ import annotations

import json

import pytest

from bot.validate.verdict import Correctness, Engagement, OutputCheck, Speed, Verdict


def test_verdict_json_roundtrip_and_render():
    v = Verdict(status="rejected", reason="correctness", summary="bad", workload="flux2", preset="tiny", device="cpu",
                dtype="float32", base_sha="a" * 40, candidate_sha="b" * 40, candidate="x.patch",
                correctness=Correctness(ok=False, seeds=[5, 6, 7], shapes=["256x256/txt32/b1"], rule="bit-exact",
                                        checks=[OutputCheck("256x256/txt32/b1 seed 5", "noise_pred", False,
                                                            "noise_pred: max abs 0.5 at [0, 17, 5]", 0.5, [0, 17, 5],
                                                            0.1, 3)]),
                engagement=Engagement(ok=True, reason="r"), speed=[Speed("eager", "cpu", [1.0, 1.1], [0.9, 0.95])])
    back = Verdict.from_json(json.loads(json.dumps(v.to_json())))
    assert back == v and isinstance(back.correctness.checks[0], OutputCheck) and isinstance(back.speed[0], Speed)
    text = v.render()
    assert "REJECTED (correctness)" in text and "[0, 17, 5]" in text and "cpu" in text


@pytest.mark.parametrize("status, reason", [("maybe", None), ("rejected", "too-slow")])
def test_only_known_statuses_and_reasons(status, reason):
    with pytest.raises(ValueError, match="not in"):
        Verdict(status=status, reason=reason, summary="", workload="", preset="", device="", dtype="", base_sha="",
                candidate_sha="", candidate="")
