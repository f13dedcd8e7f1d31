"""optbot store list|show|check|record-bench|tune (bot/commands/store.py), through the real CLI."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from bot.cli import cli
from bot.knowledge.location import SHIPPED_STORE as STORE_DIR

ROOT = STORE_DIR.parent


def test_store_list_and_show(cli_runner):
    r = cli_runner.invoke(cli, ["store", "list", "--knowledge-path", str(ROOT)])
    assert r.exit_code == 0, r.output
    assert "flux2-qk-rmsnorm-rope" in r.stdout and "attention-waste" in r.stdout and "authored" in r.stdout
    assert r.stderr.splitlines()[0] == f"knowledge: {ROOT} (--knowledge-path)"  # where it read, said once
    r = cli_runner.invoke(cli, ["store", "show", "flux2-swiglu", "--knowledge-path", str(ROOT)])
    assert r.exit_code == 0 and "patch.diff" in r.stdout and "test_swiglu.py" in r.stdout
    assert (STORE_DIR / "flux2-swiglu" / "bench.json").read_text()[:3000] in r.stdout  # the file, as it is


def test_store_check_patch_only(cli_runner, diffusers_engine, tmp_path):
    out = tmp_path / "check.json"
    r = cli_runner.invoke(cli, ["store", "check", "--no-kernels", "--json", str(out), "--knowledge-path", str(ROOT),
                                "flux2-swiglu", "qwen-image-cfg-modulation-cache"])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["ok"] and [e["entry_id"] for e in data["entries"]] == ["flux2-swiglu", "qwen-image-cfg-modulation-cache"]
    names = [c["name"] for c in data["entries"][0]["checks"]]
    assert names == ["schema", "sources", "patch"]


def test_store_check_runs_the_validator_and_records_it(cli_runner, diffusers_engine, tmp_path):
    """The full validator runs on the replayed commit (tiny preset on CPU) and --record copies its
    verdict into bench.json; a patch that changes the math fails the same check."""
    store = tmp_path / "store"
    shutil.copytree(STORE_DIR / "flux2-merge-qkv", store / "flux2-merge-qkv")
    out = tmp_path / "check.json"
    r = cli_runner.invoke(cli, ["store", "check", "--store", str(store), "--record", "--json", str(out)])
    assert r.exit_code == 0, r.output
    checks = {c["name"]: c for c in json.loads(out.read_text())["entries"][0]["checks"]}
    assert checks["validate:flux2"]["ok"] is True and checks["validate:flux2"]["details"]["status"] == "accepted"
    rec = json.loads((store / "flux2-merge-qkv" / "bench.json").read_text())["correctness"]["cpu_validation"]
    assert rec["device"] == "cpu" and rec["workloads"]["flux2"]["status"] == "accepted"
    assert rec["workloads"]["flux2"]["speed"] == {}  # CPU: no speed verdict (DESIGN decision 7)

    # the same entry, but its patch scales the merged weight: applies, then fails correctness
    bad = store / "flux2-merge-qkv" / "patch.diff"
    text = bad.read_text()
    assert "merged.requires_grad_(False)" in text
    bad.write_text(text.replace("merged.requires_grad_(False)", "merged.requires_grad_(False); merged.weight.mul_(1.5)", 1))
    r = cli_runner.invoke(cli, ["store", "check", "--store", str(store), "--json", str(out)])
    assert r.exit_code == 1, r.output
    checks = {c["name"]: c for c in json.loads(out.read_text())["entries"][0]["checks"]}
    assert checks["patch"]["ok"] is True
    assert checks["validate:flux2"]["ok"] is False and checks["validate:flux2"]["details"]["reason"] == "correctness"


def test_a_stopped_store_check_resumes_where_its_validation_stopped(cli_runner, diffusers_engine, tmp_path,
                                                                    monkeypatch):
    """A store check stopped from outside (here: the moment the candidate's process has finished, as a
    device call's limit would) goes on with --resume: the entry's validation keeps its seeds and the
    candidate's process, and runs the rest; a run id that is no store check is exit 2, named."""
    import re

    from bot.validate.context import Context

    store = tmp_path / "store"
    shutil.copytree(STORE_DIR / "flux2-merge-qkv", store / "flux2-merge-qkv")
    real = Context.ran

    def stop_after_the_candidate(self, what, out):
        real(self, what, out)
        if what.startswith("candidate "):
            raise KeyboardInterrupt("the call's time limit")

    monkeypatch.setattr(Context, "ran", stop_after_the_candidate)
    r = cli_runner.invoke(cli, ["store", "check", "--store", str(store)])
    assert r.exit_code == 1 and "Aborted!" in r.output, r.output  # click's answer to the interrupt
    run_id = re.search(r"run directory \S+/([^/\s]+)", r.stderr).group(1)
    monkeypatch.setattr(Context, "ran", real)

    out = tmp_path / "check.json"
    r = cli_runner.invoke(cli, ["store", "check", "--store", str(store), "--resume", run_id, "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert f"resuming store check {run_id}" in r.stderr
    assert re.search(r"candidate [0-9a-f]{12}: finished in an earlier attempt \(\d+ s\), kept", r.stderr), r.stderr
    assert re.search(r"base [0-9a-f]{12}: ok, \d+ s", r.stderr), r.stderr
    checks = {c["name"]: c for c in json.loads(out.read_text())["entries"][0]["checks"]}
    assert checks["validate:flux2"]["details"]["status"] == "accepted"

    r = cli_runner.invoke(cli, ["store", "check", "--store", str(store), "--resume", "20261207-000000-optimize-abcdef"])
    assert r.exit_code == 2 and "20261207-000000-optimize-abcdef: no store check run directory" in r.output


PLANT = """
import json as _json
import os as _os

# a store entry's kernel test that plants a finished process for the next (resumed) check's validation
for _d in (_os.getcwd(), _os.path.dirname(_os.getcwd())):
    try:
        _p = _os.path.join(_d, "validate-flux2", "done")
        _os.makedirs(_p, exist_ok=True)
        with open(_os.path.join(_p, "candidate-timing.json"), "w") as _f:
            _json.dump({"key": "FORGED", "outcome": {"status": "ok"}}, _f)
    except OSError:
        pass
"""


def test_a_kernel_test_cannot_plant_a_process_for_a_resumed_check(cli_runner, diffusers_engine, tmp_path):
    """The kernel tests run before the validation on every (resumed) check, in a process that may write its
    own folder: a folder beside the validation's, never around it, so what a kernel test writes is
    nowhere the next attempt reads (the sandbox hides the rest of the run directory)."""
    store = tmp_path / "store"
    shutil.copytree(STORE_DIR / "flux2-swiglu", store / "flux2-swiglu")
    test = store / "flux2-swiglu" / "test_swiglu.py"
    test.write_text(test.read_text() + PLANT)
    r = cli_runner.invoke(cli, ["store", "check", "--store", str(store)])
    assert r.exit_code == 0, r.output
    run_id = r.stderr.split("run directory ")[1].split()[0].rsplit("/", 1)[1]
    r = cli_runner.invoke(cli, ["store", "check", "--store", str(store), "--resume", run_id])
    assert r.exit_code == 0, r.output
    from bot.paths import runs_dir

    validation = runs_dir() / run_id / "flux2-swiglu" / "validate-flux2"
    assert (validation / "done" / "candidate.json").is_file()
    # the plant lands in the kernel jobs' own folders, never in done/, the only place an attempt reads
    assert not any("FORGED" in f.read_text() for f in (validation / "done").glob("*.json"))


def test_store_check_fails_on_a_patch_that_does_not_apply(cli_runner, diffusers_engine, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(STORE_DIR / "flux2-swiglu", store / "flux2-swiglu")
    p = store / "flux2-swiglu" / "patch.diff"
    p.write_text(p.read_text().replace("         self.gate_fn = nn.SiLU()", "         self.gate_fn = nn.GELU()"))
    r = cli_runner.invoke(cli, ["store", "check", "--no-kernels", "--store", str(store)])
    assert r.exit_code == 1
    assert "FAIL flux2-swiglu" in r.output and "does not apply" in r.output


def test_record_bench_copies_measured_numbers(cli_runner, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(STORE_DIR / "flux2-swiglu", store / "flux2-swiglu")
    res = tmp_path / "bench.json"
    res.write_text(json.dumps({"command": "optbot store bench", "e2e": {"flux2-swiglu": {
        "device": "cuda", "preset": "full", "workloads": {"flux2": {"base_step_ms": 2.0, "patched_step_ms": 1.0}}}}}))
    r = cli_runner.invoke(cli, ["store", "record-bench", "--store", str(store), str(res)])
    assert r.exit_code == 0, r.output
    bench = json.loads((store / "flux2-swiglu" / "bench.json").read_text())
    e2e = bench["gpu"]["end_to_end"]
    assert e2e["workloads"]["flux2"]["patched_step_ms"] == 1.0 and e2e["source"] == str(res) and e2e["recorded_at"]


def test_schema_error_exits_2_without_traceback(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(STORE_DIR / "flux2-swiglu", store / "flux2-swiglu")
    f = store / "flux2-swiglu" / "entry.yaml"
    f.write_text(f.read_text().replace("pattern: fuse-elementwise-chain", "pattern: go-fast"))
    p = subprocess.run([sys.executable, "-m", "bot", "store", "list", "--store", str(store)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"{f}: key 'pattern': got 'go-fast'" in p.stderr


def test_store_tune_on_cpu_checks_every_config_and_commits_nothing(cli_runner, tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path / "runs"))
    out = tmp_path / "tune.json"
    r = cli_runner.invoke(cli, ["store", "tune", "flux2-swiglu", "flux2-merge-qkv", "--device", "cpu", "--json", str(out),
                                "--knowledge-path", str(ROOT)])
    assert r.exit_code == 0, r.output
    assert "flux2-merge-qkv: no config_space declared, skipped" in r.output
    d = json.loads(out.read_text())["entries"]["flux2-swiglu"]
    assert len(d["rows"]) == 12 and all(row["correct"] for row in d["rows"])
    assert d["timings"] == {} and d["chosen"] == {} and "speed needs a GPU" in d["note"]
    r = cli_runner.invoke(cli, ["store", "tune", "flux2-merge-qkv", "--device", "cpu", "--knowledge-path", str(ROOT)])
    assert r.exit_code != 0 and "declares a config_space" in str(r.exception)


def test_gpu_store_commands_on_a_machine_without_one_say_so_before_any_work():
    """store check (kernels or validation), store bench and store tune with --device cuda where torch
    sees no GPU: one line naming the option, exit 2, no run started (they used to fail inside every
    runner job, once per entry or config, with torch's own error). A patch-only check needs no device."""
    import pytest

    from bot.target import cuda_device_count

    n = cuda_device_count()
    if n:
        pytest.skip("a machine with a GPU: the case is one without")
    for args in (["check", "flux2-swiglu", "--device", "cuda"], ["bench", "flux2-swiglu"], ["tune", "flux2-swiglu"],
                 ["check", "flux2-swiglu", "--device", "cuda:1", "--no-validate"]):
        r = subprocess.run([sys.executable, "-m", "bot", "store", *args, "--knowledge-path", str(ROOT)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert "no CUDA device is visible to torch on this machine" in r.stderr and "Traceback" not in r.stderr, args
        assert "run directory" not in r.stderr, args
    r = subprocess.run([sys.executable, "-m", "bot", "store", "check", "flux2-swiglu", "--device", "cuda", "--no-kernels",
                        "--knowledge-path", str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_gpu_index_past_the_machines_devices_is_refused(monkeypatch):
    """On a machine with one GPU (as torch counts them), cuda and cuda:0 pass and cuda:1 is refused,
    naming what torch sees."""
    import pytest

    from bot import target
    from bot.errors import OptbotError

    monkeypatch.setattr(target, "cuda_device_count", lambda: 1)
    target.require_device("cuda")
    target.require_device("cuda:0")
    target.require_device("cpu")
    with pytest.raises(OptbotError, match=r"--device cuda:1: torch sees 1 CUDA device\(s\) on this machine \(cuda:0..cuda:0\)"):
        target.require_device("cuda:1")
