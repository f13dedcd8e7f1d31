"""The base's correctness outcome is made once a run and shared by its candidates, on a GPU as on the
CPU (bot/steps/validate.verdict_of: the run's seeds, Options.cache_dir): one base correctness process
(and at a quantized precision one unquantized reference) a run instead of one a candidate. Its
timings are never reused: each candidate is timed against base processes run beside it. A candidate
cannot copy the shared outputs (the sandbox hides them), and an outcome from another machine is not
used."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bot.validate import Options, validate
from tests.validate.conftest import ADV


def _shared(session_seeds, cache: Path, run_dir: Path, lines: list, **kw) -> Options:
    seeds, wseed = session_seeds
    return Options(seeds=seeds, weight_seed=wseed, cache_dir=cache, run_dir=run_dir, log=lines.append, **kw)


def _processes(lines: list[str]) -> list[str]:
    """The runner processes a validation ran, in order, by what its progress line calls them."""
    out = []
    for ln in lines:
        m = re.fullmatch(r"(candidate [0-9a-f]{12}|base [0-9a-f]{12}|reference|compare|kernels|"
                         r"(candidate|base): timed process \d): ok, .*", ln)
        if m:
            out.append(re.sub(r" [0-9a-f]{12}$", "", m.group(1)))
    return out


def test_a_shared_base_is_timed_afresh_beside_each_candidate(flux2_cpu, session_seeds, tmp_path):
    """Speed gated on the CPU (so that the GPU's path runs; the processes are real): the first
    candidate of a run makes the base's outcome; the second reuses it and gets a base process that
    only times before and after its own timed process, so each side has two processes, interleaved,
    and no base timing from another candidate's window."""
    cache, patch = tmp_path / "validate" / "base-cache", str(ADV / "honest_merge_qkv.patch")
    timing = dict(speed_gates=True, retimes=0, modes=("eager",), iters=2)
    first: list[str] = []
    v1 = validate(flux2_cpu, patch, opts=_shared(session_seeds, cache, tmp_path / "validate" / "one", first, **timing))
    assert _processes(first) == ["candidate", "base", "compare", "candidate: timed process 2",
                                 "base: timed process 2"], first
    second: list[str] = []
    v2 = validate(flux2_cpu, patch, opts=_shared(session_seeds, cache, tmp_path / "validate" / "two", second, **timing))
    assert any(ln.startswith("base: reusing ") for ln in second), second
    assert _processes(second) == ["candidate", "compare", "base: timed process 1", "candidate: timed process 2",
                                  "base: timed process 2"], second
    for v in (v1, v2):
        eager = next(s for s in v.speed if s.mode == "eager")
        assert len(eager.base_ms) == 2 and len(eager.candidate_ms) == 2 and v.correctness.ok, v.render()
    # the second validation's base numbers are its own processes', not the shared outcome's
    done = tmp_path / "validate" / "two" / "done"
    own = [json.loads((done / f"{n}.json").read_text())["outcome"]["result"]["timing"]["eager"]["median_ms"]
           for n in ("base-timing-0", "base-timing")]
    eager2 = next(s for s in v2.speed if s.mode == "eager")
    assert eager2.base_ms == [round(x, 4) for x in own]

    # the same run resumed on another machine (a device call that got another GPU): the shared
    # outcome does not stand beside this candidate; the base runs again
    [outcome] = cache.glob("*/outcome.json")  # one base outcome for the run's seeds and modes
    d = json.loads(outcome.read_text())
    d["result"]["env"]["device_name"] = "another machine"
    outcome.write_text(json.dumps(d))
    third: list[str] = []
    validate(flux2_cpu, patch, opts=_shared(session_seeds, cache, tmp_path / "validate" / "three", third, **timing))
    assert any("the shared outcome came from another machine or software (device_name another machine -> "
               in ln for ln in third), third
    assert _processes(third)[:2] == ["candidate", "base"], third


def test_the_unquantized_reference_runs_once_a_run(session_seeds, tmp_path, diffusers_engine):
    """At a quantized precision the base's unquantized reference is shared too (the FP8 validations of
    2026-12-07 ran it once a candidate: ~150 s a process on an H100)."""
    from bot.target import resolve_target

    target = resolve_target("flux2", None, None, "tiny", "cpu", quant="fp8")
    cache, patch = tmp_path / "validate" / "base-cache", str(ADV / "honest_merge_qkv.patch")
    runs = []
    for name in ("one", "two"):
        lines: list[str] = []
        v = validate(target, patch, opts=_shared(session_seeds, cache, tmp_path / "validate" / name, lines, speed=False))
        assert v.status == "accepted" and [c for c in v.correctness.checks if c.against == "unquantized"], v.render()
        runs.append(lines)
    assert "reference" in _processes(runs[0]) and "reference" not in _processes(runs[1]), runs
    assert any(ln.startswith("reference: reusing ") for ln in runs[1]), runs[1]


def test_a_candidate_cannot_copy_the_shared_base_outputs(flux2_cpu, session_seeds, tmp_path, monkeypatch):
    """The hostile candidate this sharing invites: it looks for the run's shared base outputs from its
    working directory up (RUN/validate/base-cache/*/out_*.pt, exactly where verdict_of keeps them) and
    returns them, call by call; finding nothing, it returns zeros. Sandboxed, it finds nothing:
    rejected. Without the sandbox (OPTBOT_SANDBOX=off: trusted code only) the same candidate copies
    the base and passes: the sandbox is what stops it."""
    if os.environ.get("OPTBOT_SANDBOX", "on") != "on":
        pytest.skip("the sandbox is off for this test session")
    cache = tmp_path / "validate" / "base-cache"
    validate(flux2_cpu, str(ADV / "honest_merge_qkv.patch"),
             opts=_shared(session_seeds, cache, tmp_path / "validate" / "honest", [], speed=False))
    assert list(cache.glob("*/out_*.pt"))  # the shared outputs are there while the next candidate runs
    forged = str(ADV / "reads_shared_base.patch")
    v = validate(flux2_cpu, forged, opts=_shared(session_seeds, cache, tmp_path / "validate" / "forged", [], speed=False))
    assert v.status == "rejected" and v.reason == "correctness", v.render()
    assert all(c.rel_l2 is not None and c.rel_l2 > 0.9 for c in v.correctness.checks if not c.ok), v.render()
    monkeypatch.setenv("OPTBOT_SANDBOX", "off")
    off = validate(flux2_cpu, forged, opts=_shared(session_seeds, cache, tmp_path / "validate" / "off", [],
                                                   speed=False, engagement=False))
    assert off.correctness is not None and off.correctness.ok, off.render()
