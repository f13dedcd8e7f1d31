"""The nightly proposal's rules (bot/knowledge/upkeep.py): an entry's check -> outcome -> action,
with checks and verdicts made by the real types (bot/knowledge/check.Check, bot.validate Verdict);
and the staged actions: a re-record and a retirement written into a copy, never the entry itself."""
from __future__ import annotations

import re
import shutil

import pytest

from bot.errors import ConfigError
from bot.knowledge.check import Check, EntryCheck, Prepared, record_validation
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import load_entry
from bot.knowledge.upkeep import Staging, act, decide, env_changes, retire
from bot.validate.verdict import Speed
from tests.knowledge.verdicts import ENV, gpu_verdict, record_verdict

TUNABLE, PLAIN = "flux2-swiglu", "qwen-image-cfg-modulation-cache"  # with and without a config_space
TIP = "e" * 40


@pytest.fixture
def store(tmp_path):
    for eid in (TUNABLE, PLAIN):
        shutil.copytree(SHIPPED_STORE / eid, tmp_path / "kernel_store" / eid)
    return tmp_path / "kernel_store"


def _check(entry, verdict, device="cuda:0") -> EntryCheck:
    v = verdict.to_json()
    return EntryCheck(entry.id, device, [
        Check("schema", True, "parses"), Check("sources", True, "match"),
        Check("patch", True, f"applied at {TIP[:12]}", {"status": "applied", "at": TIP, "patch_sha256": "x"}),
        Check("validate:flux2", v["status"] == "accepted", f"{v['status']} ({v['reason']}): {v['summary']}", v)])


def test_no_longer_wins_on_a_gpu_retunes_or_retires(store):
    slow = gpu_verdict(status="rejected", reason="no-change", speedup=1.002, base_sha=TIP)
    tunable, plain = load_entry(store / TUNABLE), load_entry(store / PLAIN)
    d = decide(tunable, _check(tunable, slow))
    assert (d.outcome, d.action) == ("no-longer-wins", "re-tune") and d.measured_on == "cuda:0 (NVIDIA H200)"
    d = decide(plain, _check(plain, slow))
    assert (d.outcome, d.action) == ("no-longer-wins", "retire") and "no-change" in d.why


def test_cpu_timings_never_say_no_longer_wins(store):
    """On CPU the validator's speed is informational (accepted, speed labelled cpu): the row holds,
    and says speed was not checked."""
    e = load_entry(store / TUNABLE)
    cpu_env = {"device_kind": "cpu", "device_name": "x86_64", "torch": "2.13.0+cpu", "triton": "3.9.0"}
    slower = [Speed("eager", "cpu", [10.0, 10.1], [20.0, 20.2], 0.5, 0.5, "slower", n=3, passes=1)]
    v = gpu_verdict(device="cpu", env=cpu_env, speed=slower, base_sha=TIP)
    r = _check(e, v, device="cpu")
    d = decide(e, r)  # the seed entry's CPU verdict was made at another engine sha
    assert (d.outcome, d.action) == ("environment-changed", "re-record") and f"-> {TIP[:12]}" in d.why
    record_validation(e, r.to_json(), "optbot store check")
    d = decide(load_entry(e.path), r)
    assert (d.outcome, d.action) == ("holds", "none") and d.why.endswith("speed not checked: needs a GPU")
    # a rejection for speed measured on CPU (whatever produced it) is never taken as "no longer wins"
    v = gpu_verdict(device="cpu", env=cpu_env, speed=slower, status="rejected", reason="slower", base_sha=TIP)
    d = decide(e, _check(e, v, device="cpu"))
    assert (d.outcome, d.action) == ("needs-a-person", "none")


def test_no_longer_applies_when_the_tip_computes_something_else(store):
    e = load_entry(store / PLAIN)
    for reason in ("correctness", "not-engaged", "crashed"):
        d = decide(e, _check(e, gpu_verdict(status="rejected", reason=reason, base_sha=TIP)))
        assert (d.outcome, d.action) == ("no-longer-applies", "retire"), reason
    d = decide(e, _check(e, gpu_verdict(status="held", reason="implausible", base_sha=TIP)))
    assert (d.outcome, d.action) == ("needs-a-person", "none")


def test_environment_changed_is_re_recorded_and_an_unchanged_one_holds(store):
    e = load_entry(store / PLAIN)
    record_verdict(e, gpu_verdict(base_sha=TIP))
    same = gpu_verdict(base_sha=TIP)
    assert env_changes(e, "cuda:0", "flux2", same.to_json()) == []
    d = decide(e, _check(e, same))
    assert (d.outcome, d.action) == ("holds", "none")
    newer = gpu_verdict(base_sha="f" * 40, env={**ENV, "torch": "2.12.0+cu130"})
    d = decide(e, _check(e, newer))
    assert (d.outcome, d.action) == ("environment-changed", "re-record")
    assert "torch 2.11.0+cu130 -> 2.12.0+cu130" in d.why and f"engine {TIP[:12]} -> {'f' * 12}" in d.why


def test_a_re_record_and_a_retirement_go_into_the_staged_copy(store, tmp_path):
    e = load_entry(store / PLAIN)
    before = {p.name: p.read_bytes() for p in e.path.iterdir()}
    staging = Staging(tmp_path / "stage", "kernel_store", "lessons", tmp_path / "no-lessons")
    newer = gpu_verdict(base_sha=TIP, env={**ENV, "driver": "590.1"})
    r = _check(e, newer)
    d = decide(e, r)
    act(d, e, r, Prepared(r, base_sha=TIP), staging, "optbot store check --propose", tmp_path, None, log=lambda m: None)
    staged = load_entry(tmp_path / "stage" / "kernel_store" / PLAIN)
    rec = staged.bench().gpu.validation
    assert rec.workloads["flux2"].env["driver"] == "590.1" and rec.command == "optbot store check --propose"
    assert staged.status == "validated-gpu" and d.done.startswith("re-recorded")
    assert {p.name: p.read_bytes() for p in e.path.iterdir()} == before  # the entry itself untouched

    retire(staged, "the patch conflicts on the tip", TIP, "optbot store check --propose")
    again = load_entry(staged.path)
    assert again.status == "retired" and again.retired.reason == "the patch conflicts on the tip"
    assert again.retired.engine_sha == TIP


def test_retired_needs_its_reason(store):
    f = store / PLAIN / "entry.yaml"
    f.write_text(re.sub(r"^status: .*$", "status: retired", f.read_text(), count=1, flags=re.M))
    with pytest.raises(ConfigError, match="retired"):
        load_entry(store / PLAIN)
    f.write_text(f.read_text().replace("status: retired", "status: validated-gpu") + "retired: {reason: x}\n")
    with pytest.raises(ConfigError, match="key 'status'"):
        load_entry(store / PLAIN)


def test_a_re_tune_that_finds_no_winning_config_retires_with_both_reasons(store, tmp_path, diffusers_engine):
    """The re-tune path end to end on CPU: the variant search (runner processes, Triton in the
    interpreter) checks every config but chooses none (speed needs a GPU), so the entry is retired
    with the reason it was re-tuned and the search's answer."""
    from bot.knowledge.check import prepare_entry
    from bot.knowledge.upkeep import Decision

    e = load_entry(store / TUNABLE)
    prep = prepare_entry(e, "cpu")
    r = prep.result
    d = Decision(e.id, "no-longer-wins", "re-tune", "flux2: rejected (no-change)", "", "cuda:0 (NVIDIA H200)")
    staging = Staging(tmp_path / "stage", "kernel_store", "lessons", tmp_path / "no-lessons")
    act(d, e, r, prep, staging, "optbot store check --propose", tmp_path / "work", None, log=lambda m: None)
    staged = load_entry(tmp_path / "stage" / "kernel_store" / TUNABLE)
    assert staged.status == "retired" and d.done.startswith("retired (variant search over 12 configs on cpu")
    assert staged.retired.reason.startswith("flux2: rejected (no-change); variant search over 12 configs")
    assert "speed needs a GPU" in staged.retired.reason and staged.retired.engine_sha == e.engine.base_sha
    assert load_entry(store / TUNABLE).status == e.status != "retired"  # the entry itself untouched
