"""Run state (bot/run/state.py): every step's result is read back as its own dataclass."""
from __future__ import annotations

import json

import pytest

from bot.errors import OptbotError
from bot.run.context import RunOptions
from bot.run.state import STEPS, RunState, result_type
from tests.deliver.test_report import _results


def test_results_come_back_as_their_dataclasses(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path))
    r = _results()
    st = RunState("run-1", "flux2", RunOptions(workload="flux2", generators=("replay",)), "2026-12-01T00:00:00Z")
    (tmp_path / "run-1").mkdir()
    for step in STEPS:
        res = getattr(r, step)
        if res is not None:
            st.record(step, "done", res, 1.0, "s")
    back = RunState.load("run-1")
    assert back.options == st.options and isinstance(back.options.generators, tuple)
    got = back.results()
    for step in STEPS:
        want = getattr(r, step)
        assert getattr(got, step) == want, step
        if want is not None:
            assert type(getattr(got, step)) is result_type(step)
    assert type(got.validate.verdicts["c1"].speed[0]).__name__ == "Speed"
    assert got.analyze.opportunities[0].location.engine_line == 3


def test_a_result_file_of_another_shape_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path))
    st = RunState("run-2", "flux2", RunOptions(workload="flux2"), "2026-12-01T00:00:00Z")
    (tmp_path / "run-2").mkdir()
    st.record("checkout", "done", _results().checkout, 1.0, "s")
    f = tmp_path / "run-2" / "checkout.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "base_worktre": "/typo"}))
    with pytest.raises(OptbotError, match=r"checkout\.json: not a checkout result written by this optbot .*base_worktre"):
        RunState.load("run-2").result("checkout")
