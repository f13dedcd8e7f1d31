"""`optbot optimize` as a user runs it: its options (--budget, --pause-after) and the main job end to
end with the real steps, on CPU, tiny preset, no tokens: a real `python -m bot optimize flux2`
subprocess is SIGKILLed right after the validate step (fault injection: $OPTBOT_ABORT_AFTER=validate,
$OPTBOT_ABORT_MODE=kill), then resumed with --resume. It must end with the local optimization branch
in the engine repository, and a report (markdown and HTML) whose every latency row names the device
that measured it."""
from __future__ import annotations

import json
import shutil
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import click
import git
import pytest

from bot.commands.optimize import parse_budget

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("values, wall, cost", [
    (("30m",), 1800, None), (("1h30m", "$5"), 5400, 5.0), (("90s,2.5usd",), 90, 2.5), ((), None, None)])
def test_parse_budget(values, wall, cost):
    assert parse_budget(values) == (wall, cost)


@pytest.mark.parametrize("bad", ["30x", "five dollars", "$"])
def test_parse_budget_rejects(bad):
    with pytest.raises(click.BadParameter, match="--budget|expected"):
        parse_budget((bad,))


def test_pause_after_exits_75_with_a_resumable_run(tmp_path):
    """`--pause-after` stops the attempt at a safe point: exit status 75 (not done, not failed), the
    JSON says paused, and the printed line names the --resume command; a bad duration names the option."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "OPTBOT_RUNS_DIR": str(tmp_path / "runs")}
    p = subprocess.run([sys.executable, "-m", "bot", "optimize", "flux2", "--pause-after", "0s", "--json",
                        str(tmp_path / "run.json")], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 75, p.stderr
    d = json.loads((tmp_path / "run.json").read_text())
    assert d["paused"] is True and d["finished"] is False
    assert f"--resume {d['run_id']}" in " ".join(p.stderr.split())
    bad = subprocess.run([sys.executable, "-m", "bot", "optimize", "flux2", "--pause-after", "5x"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "--pause-after" in bad.stderr and "'5x'" in bad.stderr


ENTRY = "flux2-merge-qkv"


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_TOKEN", "OPTBOT_GITHUB_TOKEN", "GH_TOKEN", "ANTHROPIC_API_KEY")}
    know = tmp_path / "knowledge"
    know.mkdir()
    r = git.Repo.init(know, initial_branch="main")
    (know / "README.md").write_text("knowledge\n")
    # a one-entry store: replay reads the knowledge path's store, learn writes back only to its branch.
    # flux2-merge-qkv: the quickest FLUX.2 entry to validate on CPU (no kernel to interpret); what
    # this is about is the run's machinery, not the entry
    shutil.copytree(ROOT / "kernel_store" / ENTRY, know / "kernel_store" / ENTRY)
    (know / "lessons").mkdir()
    r.git.add("-A")
    r.git.commit("-qm", "init", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@l",
                                     "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@l"})
    env.update(OPTBOT_RUNS_DIR=str(tmp_path / "runs"), OPTBOT_KNOWLEDGE_PATH=str(know),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def _killed_after_validate(tmp_path: Path, env: dict, iters: str) -> tuple[list[str], Path]:
    """`optbot optimize flux2` on CPU, SIGKILLed by fault injection right after validate: (the
    command, the run directory it left)."""
    # replay only: on CPU with the agent off it is what the default generators amount to, less the
    # template's two extra candidates (their validation is covered by tests/generate/test_template.py)
    cmd = [sys.executable, "-m", "bot", "optimize", "flux2", "--device", "cpu", "--iters", iters, "--generators", "replay"]
    p = subprocess.run(cmd, env={**env, "OPTBOT_ABORT_AFTER": "validate", "OPTBOT_ABORT_MODE": "kill"},
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    return cmd, runs[0]


@pytest.mark.slow
def test_optimize_flux2_killed_after_validate_then_resumed_on_another_machine(tmp_path, diffusers_engine):
    """`optbot optimize flux2` (store replay) SIGKILLed right after validate, then resumed
    as an ephemeral runner would: OPTBOT_HOME is new (the engine repository re-materialized from the
    release: same base sha, none of the candidate commits). The candidates come from the run's
    bundle, each verdict from its checkpoint; the run finishes where it stopped."""
    env = _env(tmp_path)
    cmd, run = _killed_after_validate(tmp_path, env, "3")
    state = json.loads((run / "state.json").read_text())
    assert list(state["steps"]) == ["checkout", "baseline", "profile", "analyze", "generate", "validate"]
    assert state["finished"] is False
    assert (run / "candidates.bundle").is_file()
    cands = json.loads((run / "generate.json").read_text())["candidates"]
    assert cands and all((run / "validate" / c["id"] / "verdict-record.json").is_file() for c in cands)
    branch = f"optbot/flux2/{diffusers_engine.base_sha[:12]}"

    home = tmp_path / "new-machine"
    shutil.copytree(Path(os.environ["OPTBOT_HOME"]) / "downloads", home / "downloads")
    p2 = subprocess.run([*cmd[:5], "--resume", run.name, "--json", str(tmp_path / "run.json")],
                        env={**env, "OPTBOT_HOME": str(home)}, cwd=tmp_path, capture_output=True, text=True,
                        timeout=600)
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert f"resuming run {run.name} at step combine" in p2.stderr.replace("\n", " ")
    # the knowledge the first attempt chose ($OPTBOT_KNOWLEDGE_PATH), said first and kept by the run
    know_root = Path(env["OPTBOT_KNOWLEDGE_PATH"]).resolve()
    assert p2.stderr.splitlines()[0] == f"knowledge: {know_root} (recorded by run {run.name})"
    out = json.loads((tmp_path / "run.json").read_text())
    assert out["finished"] is True
    assert out["deliver"]["forge"] == "local"
    # baseline and profile were not re-run: their job logs are the first attempt's
    assert json.loads((run / "state.json").read_text())["attempts"] == 2

    repo = git.Repo(home / "engines" / "diffusers-0.42.1")
    assert repo.head.commit.hexsha == diffusers_engine.base_sha  # deterministic engine repository
    for c in cands:
        repo.commit(c["commit_sha"])  # fetched from the bundle
    assert repo.commit(branch).hexsha == out["combine"]["head_sha"]
    n = len(out["combine"]["commits"])
    assert n and len(list(repo.iter_commits(f"{diffusers_engine.base_sha}..{branch}"))) == n

    md = Path(out["deliver"]["report_md"]).read_text()
    html = Path(out["deliver"]["report_html"]).read_text()
    assert "<table>" in html and "latency" in html
    # every latency row names its device (or says it was not measured)
    lat = md.split("### Per-step latency")[1].split("###")[0]
    rows = [r for r in lat.splitlines() if r.startswith("| baseline") or r.startswith("| optimized")]
    assert rows
    for r in rows:
        last = r.rstrip(" |").rsplit("|", 1)[1].strip()
        assert last.startswith(("cpu", "cuda", "not measured")), r
    assert re.search(r"\| baseline \| eager \| [0-9.]+ .*\| cpu", md)
    assert "device:      cpu" in md
    # what is left, from this run's own numbers: the branch's fastest mode on the cpu clock, and the time by
    # category of the base (on the cpu the branch's kernels run in the interpreter: not shown)
    left = md.split("### What is left")[1].split("###")[0]
    assert re.search(r"Fastest production mode of the branch: eager, [0-9.]+ ms/step, measured on cpu", left), left
    assert re.search(r"\| [a-z]+ \| [0-9.]+ \| n/a \| n/a \| cpu \|", left), left  # the base's; the branch's
    assert "where the branch's Triton kernels run in the interpreter" in left, left  # would time the interpreter
    # the knowledge branch carries the chart
    know = git.Repo(env["OPTBOT_KNOWLEDGE_PATH"])
    files = know.git.ls_tree("-r", "--name-only", out["deliver"]["knowledge_branch"]).split()
    assert any(f.endswith("latency.png") for f in files)
    # what the run learned is on the knowledge branch (the replayed entry's history), and the
    # knowledge working tree is as the person left it: it changes when they merge the PR
    assert f"kernel_store/{ENTRY}/bench.json" in out["learn"]["files"]
    hist = json.loads(know.git.show(f"{out['deliver']['knowledge_branch']}:kernel_store/{ENTRY}/bench.json"))["history"]
    assert hist[-1]["run_id"] == run.name and hist[-1]["generator"] == "replay"
    assert not know.is_dirty(untracked_files=True)
    assert "history" not in json.loads((Path(know.working_tree_dir) / f"kernel_store/{ENTRY}/bench.json").read_text())
    # the command said where things are
    assert "report:" in p2.stderr and "optimization branch:" in p2.stderr
