"""The process boundary: crashes, timeouts and forged output become typed outcomes."""
from __future__ import annotations

import json
import re
import time

import pytest

from bot.errors import RunnerError
from bot.jobs import JobOutcome, run_job
from runner.job import Job


def _probe_job(tmp_path, engine_root):
    return Job(kind="probe", workload={}, preset="tiny", device="cpu", dtype="float32", engine_root=str(engine_root),
               engine_sha="x", model_class="m.C", shapes=[])


def _bad_engine_job(tmp_path, body: str) -> Job:
    """A fake engine whose model module misbehaves on import: the step job imports it in the child."""
    root = tmp_path / "eng"
    (root / "badengine").mkdir(parents=True)
    (root / "badengine" / "__init__.py").write_text("")
    (root / "badengine" / "model.py").write_text(body)
    return Job(kind="step", workload={"presets": {"tiny": {"config": {}}}, "family": "flux2"}, preset="tiny",
               device="cpu", dtype="float32", engine_root=str(root), engine_sha="x",
               model_class="badengine.model.Model", shapes=[])


def test_probe_round_trip(tmp_path):
    out = run_job(_probe_job(tmp_path, tmp_path), tmp_path, timeout_s=120)
    assert out.ok and out.result["env"]["device_kind"] == "cpu" and out.result["env"]["torch"]
    # every result's environment says how the job's process started (here: the warm zygote's fork)
    assert out.result["env"]["runner_start"] == "forked from the warm zygote", out.result["env"]


def test_segfault_becomes_crashed(tmp_path):
    out = run_job(_bad_engine_job(tmp_path, "import os, signal\nprint('about to fault')\nos.kill(os.getpid(), signal.SIGSEGV)\n"), tmp_path)
    assert out.status == "crashed" and "SIGSEGV" in out.reason() and "about to fault" in out.log_tail


def test_hang_becomes_timeout_and_the_group_is_killed(tmp_path):
    job = _bad_engine_job(tmp_path, "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\ntime.sleep(60)\n")
    t0 = time.monotonic()
    out = run_job(job, tmp_path, timeout_s=3)
    assert out.status == "timeout" and time.monotonic() - t0 < 30


def test_printing_a_result_does_not_forge_one(tmp_path):
    forged = json.dumps({"ok": True, "latency": {"median_ms": 0.001}})
    out = run_job(_bad_engine_job(tmp_path, f"print({forged!r})\nimport os\nos._exit(0)\n"), tmp_path)
    assert out.status == "crashed" and out.result == {}


def test_an_engine_cannot_shadow_the_runner(tmp_path):
    root = tmp_path / "eng"
    (root / "runner").mkdir(parents=True)
    (root / "runner" / "__init__.py").write_text("")
    (root / "runner" / "__main__.py").write_text("raise SystemExit('shadowed')\n")
    out = run_job(_probe_job(tmp_path, root), tmp_path)
    assert out.ok


def test_cuda_lane_gets_only_its_gpu(monkeypatch):
    """cuda:N -> the child sees one GPU (N indexes the parent's visible list) and calls it "cuda"."""
    from bot.jobs import child_env

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    env = child_env("/engine", "cuda:1")
    assert env["CUDA_VISIBLE_DEVICES"] == "6" and env["OPTBOT_JOB_DEVICE"] == "cuda"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert child_env("/engine", "cuda:1")["CUDA_VISIBLE_DEVICES"] == "1"
    assert "OPTBOT_JOB_DEVICE" not in child_env("/engine", "cuda")
    assert "OPTBOT_JOB_DEVICE" not in child_env("/engine", "cpu")


@pytest.mark.parametrize("outcome, says", [
    (JobOutcome("timeout", seconds=31.2), "timeout after 31 s"),
    (JobOutcome("crashed", returncode=-11), "crashed (signal SIGSEGV) with no result"),
    (JobOutcome("failed", result={"ok": False, "error": {"kind": "exception", "message": "ValueError: no weights"}}),
     "exception: ValueError: no weights"),
])
def test_a_job_the_caller_needs_fails_as_one_error(outcome, says):
    """JobOutcome.error: what the job was, why it failed, where its log is, and the log's tail."""
    outcome.log_path, outcome.log_tail = "/runs/x/profile.log", "x" * 2000 + "Traceback: boom"
    err = outcome.error("profile job")
    assert isinstance(err, RunnerError)
    first, tail = str(err).split("\n", 1)
    assert first == f"profile job {says}; log: /runs/x/profile.log"
    assert tail.endswith("Traceback: boom") and len(tail) == 1500


def test_a_refusal_the_runner_explained_comes_without_the_log():
    """A typed error (runner/harness.HarnessError: the config, the inputs, the quantization) says
    what is wrong; the traceback that reached it would only bury that line."""
    outcome = JobOutcome("failed", result={"ok": False, "error": {"kind": "quant", "message": "HarnessError: why"}},
                         log_path="/runs/x/profile.log", log_tail="Traceback: boom")
    assert str(outcome.error("profile job")) == "profile job quant: HarnessError: why; log: /runs/x/profile.log"


def test_an_exit_hook_cannot_rewrite_the_report(tmp_path):
    """The atexit forgery of issue 14: engine code registers a hook that, when the runner exits, writes
    a well-formed result claiming success. The runner sends its one report and ends with os._exit, so
    the hook never runs: the honest outcome (this engine has no model class) is what comes back."""
    forged = json.dumps({"result": {"ok": True, "runs": [], "timing": {}, "profile": {}, "flops": {}, "passes": 1,
                                    "env": {}}})
    job = _bad_engine_job(tmp_path, "import atexit, os, sys\n"
                                    f"atexit.register(lambda: os.write(int(sys.argv[2]), {forged!r}.encode() + b'\\n'))\n")
    job.kind = "validate_step"
    out = run_job(job, tmp_path, timeout_s=300)
    assert out.status == "failed" and "has no class 'Model'" in out.reason(), out.reason()


@pytest.mark.parametrize("sent, says", [
    ('{"result": {"ok": true}}', "no valid result (a validate_step result without ['runs', 'timing', 'profile', "
                                 "'flops', 'passes', 'env'])"),
    ("[1, 2]", "no valid result (the report's message is '[1, 2]', not {\"result\": {...}})"),
    ('{"result": {"ok": false}}', "no valid result (a validate_step result without ['error'])"),
    ("not json", "no valid result (a report line is not JSON: b'not json')"),
])
def test_a_message_written_into_the_channel_is_no_result(tmp_path, sent, says):
    """Engine code that writes into the report channel itself (it is the runner's argv[2]) and exits gets
    a crashed outcome saying what is wrong with it, never a bot KeyError."""
    job = _bad_engine_job(tmp_path, f"import os, sys\nos.write(int(sys.argv[2]), {sent!r}.encode() + b'\\n')\nos._exit(0)\n")
    job.kind = "validate_step"
    out = run_job(job, tmp_path, timeout_s=300)
    assert out.status == "crashed" and says in out.reason(), out.reason()
    assert out.result == {}


def test_a_second_result_makes_the_report_invalid(tmp_path):
    """A forged result sent before the runner's own: two result messages are no valid result."""
    forged = json.dumps({"result": {"ok": False, "error": {"kind": "x", "message": "forged"}}})
    job = _bad_engine_job(tmp_path, f"import os, sys\nos.write(int(sys.argv[2]), {forged!r}.encode() + b'\\n')\n")
    out = run_job(job, tmp_path, timeout_s=300)
    assert out.status == "crashed" and "2 result messages, not one" in out.reason(), out.reason()


def test_a_killed_bot_leaves_no_runner_behind(tmp_path):
    """SIGKILL of the bot (its whole process group) while a job hangs: the runner child, which runs
    in a session of its own, dies with it instead of keeping its device."""
    import os
    import signal
    import subprocess
    import sys

    job = _bad_engine_job(tmp_path, "import time\ntime.sleep(120)\n")
    job_file = tmp_path / "bot-job.pkl"
    import pickle
    job_file.write_bytes(pickle.dumps(job))
    bot = subprocess.Popen([sys.executable, "-c", "import pickle, sys; from pathlib import Path; from bot.jobs import run_job; "
                            f"run_job(pickle.loads(Path({str(job_file)!r}).read_bytes()), Path({str(tmp_path / 'w')!r}), "
                            "timeout_s=300, name='hang')"], start_new_session=True)

    def runner_pids() -> list[int]:
        # the job's processes (forked by the runner's zygote: its command line is the zygote's)
        # work in the job's directory
        out = []
        for d in os.listdir("/proc"):
            try:
                cwd = os.readlink(f"/proc/{d}/cwd")
            except OSError:
                continue
            if cwd == str(tmp_path / "w") and d.isdigit():
                out.append(int(d))
        return out

    deadline = time.monotonic() + 60
    while not runner_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert runner_pids(), "the runner child never started"
    time.sleep(1.0)  # the child is inside the engine's import now
    os.killpg(bot.pid, signal.SIGKILL)
    bot.wait()
    deadline = time.monotonic() + 10
    while runner_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = runner_pids()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"runner {left} outlived the bot"


def _timed(phase: str, samples_ms: list[float]) -> dict:
    return {"ok": True, "timing": {"eager": {"device": "cpu", "median_ms": 1.0, "n": len(samples_ms),
                                             "samples_ms": samples_ms, "phase": phase}}}


@pytest.mark.parametrize("samples_ms, seen_s, device, says", [
    ([50.0] * 10, 0.51, "cpu", ""),                       # honest: the samples fill the phase
    ([25.0] * 10, 0.51, "cpu", "a clock in the child runs slow"),  # a clock at half speed
    ([25.0] * 10, 0.51, "cuda", "a clock in the child runs slow"),
    ([100.0] * 10, 0.51, "cpu", "more than passed"),
    ([0.01] * 200, 0.08, "cuda", ""),                     # microsecond kernels: per-trial overhead dominates
])
def test_the_bots_clock_checks_the_claimed_timings(samples_ms, seen_s, device, says):
    from bot.jobs import clock_check

    got = clock_check(_timed("t0", samples_ms), {"t0": [100.0, 100.0 + seen_s]}, device)
    assert (says in got and got.startswith("implausible: phase 't0' took")) if says else got == "", got


def test_timings_of_a_phase_the_bot_never_saw_are_implausible():
    from bot.jobs import clock_check

    assert "which the bot never saw start and end" in clock_check(_timed("t7", [5.0]), {"t0": [1.0, 2.0]}, "cpu")
    assert "which the bot never saw start and end" in clock_check(_timed("t0", [5.0]), {"t0": [1.0]}, "cpu")


def test_an_honest_timed_job_passes_the_clock_check(tmp_path):
    """A real timed step (runner/timing.py in the child, marks on the channel): the bot's clock agrees."""
    from bot.target import resolve_target

    t = resolve_target("flux2", None, None, "tiny", "cpu")
    job = t.job("validate_step", t.checkout.repo_path, tmp_path / "out", iters=10,
                params={"correctness": False, "timing": {"modes": ["eager"]}})
    out = run_job(job, tmp_path, timeout_s=600, name="timed")
    assert out.ok, out.reason()
    eager = out.result["timing"]["eager"]
    assert eager["phase"] and eager["n"] == 10, eager
    # The share can pass 1 by a little: the bot stamps a mark when its reader thread gets it, a few
    # ms late on a loaded machine (clock_check allows 5% and 10 ms for that).
    share = sum(eager["samples_ms"]) / 1e3 / out.phases[eager["phase"]]
    assert 0.9 < share < 1.1, (share, out.phases)
    # where the job's time went, by the bot's clock: its stages, in the order they ran
    stages = [k for k in out.phases if k.startswith("stage:")]
    assert stages == ["stage:build", "stage:eager"], out.phases
    assert out.phases["stage:eager"] >= out.phases[eager["phase"]]
    assert re.fullmatch(r"ok, \d+ s \(build \d+, eager \d+\)", out.took()), out.took()


def test_the_progress_line_shows_stage_names_a_child_could_not_abuse():
    """Stage names come from the child: only short plain names reach the log line, at most twelve."""
    from bot.jobs import JobOutcome

    phases = {"t0": 1.0, "stage:build": 12.4, "stage:\x1b[2Jcleared": 1.0, "stage:" + "x" * 40: 1.0,
              **{f"stage:s{i}": 1.0 for i in range(20)}}
    line = JobOutcome("ok", seconds=37.2, phases=phases).took()
    assert line.startswith("ok, 37 s (build 12, s0 1, ") and "\x1b" not in line and "xxx" not in line
    assert line.count(",") == 12 and "s10 1)" in line, line
    assert JobOutcome("failed", seconds=3).took() == "failed, 3 s"


# The warm start (runner/zygote.py): each job is a fork of a process that imported torch once.

def test_zygote_job_holds_no_descriptor_of_the_zygote(tmp_path):
    """The job sees its stdin, log and report channel, nothing of the zygote's (its socket to the
    bot, other jobs' files): it could otherwise ask the zygote for processes or forge replies."""
    out_file = tmp_path / "fds.json"
    body = ("import json, os\n"
            "fds = {}\n"
            "for f in os.listdir('/proc/self/fd'):\n"
            "    try:\n"
            "        fds[int(f)] = os.readlink(f'/proc/self/fd/{f}')\n"
            "    except OSError:\n"
            "        pass  # the listing's own descriptor, closed by now\n"
            "cmd = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
            f"open({str(out_file)!r}, 'w').write(json.dumps({{'fds': fds, 'cmd': [c.decode() for c in cmd]}}))\n"
            "raise SystemExit(3)\n")
    job = _bad_engine_job(tmp_path, body)
    job.out_dir = str(tmp_path)  # the probe's file is written there
    out = run_job(job, tmp_path / "w")
    assert out.status == "crashed"  # SystemExit(3) while the model module imports: no result
    seen = json.loads(out_file.read_text())
    fds = {int(k): v for k, v in seen["fds"].items()}
    assert sorted(fds) == [0, 1, 2, 3], fds
    assert fds[0] == "/dev/null" and fds[1] == fds[2] and fds[1].endswith("job.log")
    assert fds[3].startswith("socket:")
    assert "runner.zygote" in seen["cmd"]  # a fork of the zygote: the warm start was used


def test_zygote_jobs_do_not_share_state(tmp_path):
    """A job that changes a preloaded module (the candidate that tries to make the next job's
    comparison always pass) changes only its own copy."""
    flag = tmp_path / "seen.txt"
    poison = ("import torch\ntorch.allclose = lambda *a, **k: True\ntorch._optbot_poisoned = True\n"
              "raise SystemExit(3)\n")
    look = ("import torch\n"
            f"open({str(flag)!r}, 'w').write(repr((hasattr(torch, '_optbot_poisoned'), "
            "torch.allclose(torch.zeros(1), torch.ones(1)))))\nraise SystemExit(3)\n")
    for i, body in enumerate((poison, look)):
        job = _bad_engine_job(tmp_path / f"e{i}", body)
        job.out_dir = str(tmp_path)
        run_job(job, tmp_path / f"w{i}")
    assert flag.read_text() == "(False, False)"


def test_zygote_jobs_draw_fresh_random_numbers(tmp_path):
    """numpy's and torch's global draws differ between two forked jobs, as between two fresh
    interpreters (both imports seed from the OS); forked unchanged they would be equal."""
    draw = "import numpy, torch\nopen({out!r}, 'w').write(repr((numpy.random.rand(4).tolist(), torch.rand(4).tolist())))\nraise SystemExit(3)\n"
    seen = []
    for i in range(2):
        out = tmp_path / f"draw{i}.txt"
        job = _bad_engine_job(tmp_path / f"e{i}", draw.format(out=str(out)))
        job.out_dir = str(tmp_path)
        run_job(job, tmp_path / f"w{i}")
        seen.append(eval(out.read_text()))
    assert seen[0][0] != seen[1][0] and seen[0][1] != seen[1][1]


def test_zygote_that_dies_fails_its_jobs_and_is_restarted(tmp_path):
    import os
    import signal

    from bot import zygote

    job = _bad_engine_job(tmp_path / "a", "import time\ntime.sleep(120)\n")
    import threading

    outcome = {}
    t = threading.Thread(target=lambda: outcome.update(out=run_job(job, tmp_path / "wa", timeout_s=300)))
    t.start()
    def forked() -> list:  # the zygote that has imported and forked the job's launcher
        for z in zygote.ZYGOTE.processes():
            try:
                if open(f"/proc/{z.pid}/task/{z.pid}/children").read().split():
                    return [z]
            except OSError:
                pass
        return []

    deadline = time.monotonic() + 120
    while not forked() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    os.kill(forked()[0].pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive() and outcome["out"].status == "crashed", outcome
    again = run_job(_probe_job(tmp_path, tmp_path), tmp_path / "wb", timeout_s=120)
    assert again.ok, again.reason() + "\n" + again.log_tail[-2000:]


def test_without_preload_each_job_is_a_fresh_interpreter(tmp_path, monkeypatch):
    """OPTBOT_RUNNER_PRELOAD=off (and a zygote that finds the CUDA driver loaded): the zygote execs
    `python -m runner` for each job, the way without a warm start; the result is the same."""
    from bot import zygote

    seen = tmp_path / "cmd.txt"
    body = (f"open({str(seen)!r}, 'w').write(open('/proc/self/cmdline').read().replace(chr(0), ' '))\n"
            "raise SystemExit(3)\n")
    monkeypatch.setenv("OPTBOT_RUNNER_PRELOAD", "off")
    monkeypatch.setattr(zygote, "ZYGOTE", zygote.Zygotes())
    try:
        job = _bad_engine_job(tmp_path, body)
        job.out_dir = str(tmp_path)
        out = run_job(job, tmp_path / "w")
        assert out.status == "crashed", out.reason()  # the same outcome as with the warm start
        cmd = seen.read_text().split()
        assert cmd[1:3] == ["-m", "runner"] and cmd[-1] == "3" and "runner.zygote" not in cmd, cmd
        probe = run_job(_probe_job(tmp_path, tmp_path), tmp_path / "wp", timeout_s=120)
        assert probe.ok and probe.result["env"]["runner_start"] == "fresh interpreter", probe.result["env"]
    finally:
        zygote.ZYGOTE.close()
    monkeypatch.setenv("OPTBOT_RUNNER_PRELOAD", "maybe")
    with pytest.raises(RunnerError, match=r"OPTBOT_RUNNER_PRELOAD='maybe': expected 'on' .* or 'off'"):
        run_job(_bad_engine_job(tmp_path / "b", "x = 1\n"), tmp_path / "wb")
