"""A validation stopped from outside resumes from the runner processes it finished (bot/validate/attempt.py):
the same seeds, the finished processes kept, the rest run; a different candidate starts afresh."""
from __future__ import annotations

import json
import re

import pytest

from bot.validate import Options, validate
from tests.validate.conftest import ADV


class Stop(Exception):
    """What a device call's time limit is to the validator: the process ends mid-validation."""


def test_a_cut_validation_resumes_from_its_finished_processes(flux2_cpu, tmp_path):
    run_dir = tmp_path / "v"
    patch = str(ADV / "honest_merge_qkv.patch")
    said: list[str] = []

    def stop_at_the_base(line: str) -> None:
        said.append(line)
        if line.startswith("base ") and "in a runner process" in line:
            raise Stop(line)

    # attempt 1: the candidate's process finishes, the stop comes as the base's starts
    with pytest.raises(Stop):
        validate(flux2_cpu, patch, opts=Options(run_dir=run_dir, speed=False, log=stop_at_the_base))
    first = json.loads((run_dir / "attempt.json").read_text())
    assert [p.name for p in (run_dir / "done").iterdir()] == ["candidate.json"]
    assert any(re.fullmatch(r"candidate [0-9a-f]{12}: ok, \d+ s \(build \d+, correctness \d+, profile \d+\)", ln)
               for ln in said), said

    # attempt 2, as a store check does it: the patch committed anew (another sha, the same tree)
    lines: list[str] = []
    v = validate(flux2_cpu, patch, opts=Options(run_dir=run_dir, speed=False, log=lines.append))
    assert v.status == "accepted", v.render()
    assert v.correctness.seeds == first["seeds"]  # the attempt's seeds, not fresh ones
    assert lines[0].startswith("resuming the validation in ")
    assert any(re.fullmatch(r"candidate [0-9a-f]{12}: finished in an earlier attempt \(\d+ s\), kept", ln)
               for ln in lines), lines
    assert not any(ln.startswith("candidate ") and "in its own process" in ln and "kept" not in ln
                   for ln in lines[lines.index(next(x for x in lines if "kept" in x)):]), lines
    assert any(re.fullmatch(r"base [0-9a-f]{12}: ok, \d+ s \(build \d+, correctness \d+, profile \d+\)", ln)
               for ln in lines), lines  # the base ran now

    # another candidate in the same folder is another validation: fresh seeds, nothing kept
    lines.clear()
    validate(flux2_cpu, str(ADV / "not_engaged.patch"), opts=Options(run_dir=run_dir, speed=False, log=lines.append))
    assert not any("kept" in ln or ln.startswith("resuming") for ln in lines), lines
    assert json.loads((run_dir / "attempt.json").read_text())["seeds"] != first["seeds"]


def test_a_kept_process_whose_outputs_are_gone_runs_again(flux2_cpu, tmp_path):
    """A kept outcome is only as good as the files it names: a removed output makes the process run again."""
    run_dir = tmp_path / "v"
    patch = str(ADV / "honest_merge_qkv.patch")
    validate(flux2_cpu, patch, opts=Options(run_dir=run_dir, speed=False))
    kept = json.loads((run_dir / "done" / "candidate.json").read_text())
    for r in kept["outcome"]["result"]["runs"][:1]:
        from pathlib import Path

        Path(r["file"]).unlink()
    lines: list[str] = []
    v = validate(flux2_cpu, patch, opts=Options(run_dir=run_dir, speed=False, log=lines.append))
    assert v.status == "accepted"
    assert any(re.fullmatch(r"candidate [0-9a-f]{12}: ok, \d+ s \(build \d+, correctness \d+, profile \d+\)", ln)
               for ln in lines), lines  # ran again
    assert any(re.fullmatch(r"base [0-9a-f]{12}: finished in an earlier attempt \(\d+ s\), kept", ln)
               for ln in lines), lines


def test_a_candidate_cannot_plant_a_finished_process(flux2_cpu, tmp_path):
    """The attack this opens: a candidate that writes a "finished base process" (its own outputs as the
    base's) where the validator keeps them, for a resumed attempt to trust. The kept outcomes live in the
    run directory, which the sandbox hides from every runner child (bot/sandbox.py): the write lands
    nowhere the bot reads, and a second attempt runs the base itself."""
    run_dir = tmp_path / "v"
    patch = str(ADV / "forged_kept_process.patch")
    v = validate(flux2_cpu, patch, opts=Options(run_dir=run_dir, speed=False))
    assert v.status == "rejected" and v.reason == "not-engaged", v.render()  # a no-op besides the plant
    for f in run_dir.rglob("*.json"):
        assert "FORGED" not in f.read_text(), f
    assert json.loads((run_dir / "done" / "base.json").read_text())["key"] != "FORGED"
    lines: list[str] = []
    validate(flux2_cpu, patch, opts=Options(run_dir=run_dir, speed=False, log=lines.append))
    assert any(re.fullmatch(r"base [0-9a-f]{12}: finished in an earlier attempt \(\d+ s\), kept", ln)
               for ln in lines), lines  # the bot's own record of its base process, not the plant
