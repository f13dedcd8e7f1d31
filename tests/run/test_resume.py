"""What makes a run resumable (bot/run/resume.py): verdict checkpoints."""
from __future__ import annotations

from bot.run.resume import load_checkpoint, save_checkpoint
from bot.validate.verdict import Speed, Verdict


def test_a_candidate_verdict_is_checkpointed_for_resume(tmp_path):
    """validate keeps each verdict as soon as it is reached; a resumed run takes it back as the same
    Verdict, for the same commit only."""
    v = Verdict(status="rejected", reason="no-change", summary="correct and engaged, but eager 1.004x", workload="flux2",
                preset="full", device="cuda", dtype="bfloat16", base_sha="0" * 40, candidate_sha="a" * 40,
                candidate="replay-x", trailers={"Optbot-Entry": ["x"]},
                speed=[Speed("eager", "cuda", [10.0, 10.1], [9.97, 10.06], 1.004, 0.6, "no-change", n=10)])
    assert load_checkpoint(tmp_path, "replay-x", "a" * 40) is None
    save_checkpoint(tmp_path, "replay-x", "a" * 40, v)
    back = load_checkpoint(tmp_path, "replay-x", "a" * 40)
    assert isinstance(back, Verdict) and back == v
    assert load_checkpoint(tmp_path, "replay-x", "b" * 40) is None  # another commit under the same id
