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


@pytest.mark.parametrize("damage, says", [
    (lambda d: {**d, "steps": []}, r"state\.json: not a run state written by this optbot .*steps.*expected an object"),
    (lambda d: {**d, "options": {**d["options"], "turbo": True}}, r"not a run state .*unknown keys \['turbo'\]"),
    (lambda d: {**d, "options": "flux2"}, r"not a run state .*RunOptions: expected an object"),
])
def test_a_damaged_state_is_a_clear_error_and_stays_as_it_was(tmp_path, monkeypatch, damage, says):
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path))
    st = RunState("run-3", "flux2", RunOptions(workload="flux2"), "2026-12-01T00:00:00Z")
    (tmp_path / "run-3").mkdir()
    st.record("checkout", "done", _results().checkout, 1.0, "s")
    f = tmp_path / "run-3" / "state.json"
    f.write_text(json.dumps(damage(json.loads(f.read_text()))))
    before = f.read_bytes()
    with pytest.raises(OptbotError, match=says):
        RunState.load("run-3")
    assert f.read_bytes() == before  # nothing rewrote it on the way to the error


def test_a_missing_step_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path))
    st = RunState("run-4", "flux2", RunOptions(workload="flux2"), "2026-12-01T00:00:00Z")
    (tmp_path / "run-4").mkdir()
    st.record("checkout", "done", _results().checkout, 1.0, "s")
    (tmp_path / "run-4" / "checkout.json").unlink()
    with pytest.raises(OptbotError, match=r"checkout\.json: the checkout step's result is missing"):
        RunState.load("run-4").result("checkout")


def test_resume_of_a_damaged_state_exits_2_without_a_traceback(tmp_path):
    import os
    import subprocess
    import sys

    run = tmp_path / "20261201-000000-optimize-abcdef"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"run_id": run.name, "workload": "flux2", "options": {"workload": "flux2"},
                                                "created_at": "x", "steps": []}))
    p = subprocess.run([sys.executable, "-m", "bot", "optimize", "flux2", "--resume", run.name], capture_output=True,
                       text=True, env={**os.environ, "OPTBOT_RUNS_DIR": str(tmp_path)}, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "state.json: not a run state written by this optbot" in p.stderr


def test_resume_refuses_options_it_would_ignore(tmp_path):
    """A resumed run keeps the options it started with: `--resume X --ablation-rounds 0` would still
    ablate, so it is refused with the option named (exit 2, no traceback); --pause-after and --json
    are per attempt and pass (here on to the missing run's own error)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OPTBOT_RUNS_DIR": str(tmp_path)}
    base = [sys.executable, "-m", "bot", "optimize", "flux2", "--resume", "20261201-000000-optimize-abcdef"]
    p = subprocess.run([*base, "--ablation-rounds", "0", "--preset", "full"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "--preset, --ablation-rounds would be ignored" in p.stderr
    p = subprocess.run([*base, "--pause-after", "5m", "--json", str(tmp_path / "r.json")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 2 and "would be ignored" not in p.stderr and "no run state" in p.stderr, p.stderr
