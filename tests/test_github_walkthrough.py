"""The README's "On GitHub" walkthrough, step by step, as a new user follows it. What needs a real
GitHub repository runs against the local stand-in of GitHub's API (tests/deliver/github_standin.py,
the real PyGithub client over HTTP on 127.0.0.1), and what needs a GPU runs with the measuring
steps of tests/fakes.py (fixed numbers, labelled so); everything else is the real command.

  1. install the workflows in the engine repository and set what they read (README's table)
  2. a runner: the labels it registers with are what the workflows ask for
  3. a maintainer comments `/optimize flux2`: the comment job (`python -m bot comment`)
  4. the GPU job runs the request: engine PR, knowledge PR, the reply, the dashboard, 🚀
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from bot.cli import cli
from bot.hardware import parse_gpus, runner_labels

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
REPO = "team/engine"


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## On GitHub")
    return text[start:text.index("\n## ", start + 1)]


def test_step1_the_readme_names_every_variable_and_secret_the_workflows_read():
    """The README's table is what to set: exactly the vars.* and secrets.* the two workflow files
    that go into the engine repository use."""
    used = set()
    for name in ("optimize.yml", "scheduled.yml"):
        used |= set(re.findall(r"\b((?:vars|secrets)\.[A-Z_]+)", (WORKFLOWS / name).read_text()))
    told = set(re.findall(r"`((?:vars|secrets)\.[A-Z_]+)`", _readme_section()))
    assert used and told == used, (sorted(used - told), sorted(told - used))
    for name in ("optimize.yml", "scheduled.yml"):
        assert f".github/workflows/{name}" in _readme_section()


def test_step2_a_runner_of_runner_setup_takes_the_gpu_jobs():
    """An H200 box registers with its labels plus GitHub's self-hosted one; every GPU job's runs-on
    is among them (the README's runner step, runner/setup/README.md)."""
    labels = {"self-hosted", *runner_labels(parse_gpus("NVIDIA H200, 580.159.04, 143771 MiB"))}
    for name in ("optimize.yml", "scheduled.yml"):
        wf = yaml.safe_load((WORKFLOWS / name).read_text())
        gpu = [j for j in wf["jobs"].values() if isinstance(j["runs-on"], list)]
        assert gpu and all(set(j["runs-on"]) <= labels for j in gpu), name
    assert "runner/setup/install.sh" in _readme_section() and "optbot runner check" in _readme_section()


def test_step3_and_4_a_comment_becomes_a_run_a_reply_and_a_rocket(pr, standin, tmp_path, monkeypatch):
    from click.testing import CliRunner

    import bot.run.orchestrator as orch
    from tests.commands.test_comment import comment, reactions, replies
    from tests.fakes import fake_steps, stack_validator

    # 3. the comment job, as the workflow runs it: a subprocess, the event file, $GITHUB_OUTPUT
    ev, cid = comment(standin, tmp_path, "/optimize flux2")
    out = tmp_path / "github-output"
    p = subprocess.run([sys.executable, "-m", "bot", "comment", "--event", str(ev), "--github-output", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"optbot comment: dispatched: flux2 at {pr['sha'][:12]} of PR #1"), p.stdout
    assert reactions(standin, cid) == ["eyes"]
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert outputs["status"] == "dispatched" and outputs["workload"] == "flux2" and outputs["sha"] == pr["sha"]
    request = tmp_path / "optbot-request.json"
    request.write_text(outputs["request"])  # the GPU job's `printf '%s' "$OPTBOT_REQUEST" > ...`

    # 4. the GPU job: `optbot optimize flux2 --request FILE --engine CHECKOUT`
    real = orch.run_optimize
    monkeypatch.setattr(orch, "run_optimize", lambda options, **kw: real(
        options, steps=fake_steps(Path(pr["knowledge"].working_tree_dir)), validate=stack_validator, **kw))
    res = CliRunner().invoke(cli, ["optimize", "flux2", "--request", str(request), "--device", "cpu",
                                   "--engine", str(pr["engine"].working_tree_dir), "--knowledge-repo", "team/optbot",
                                   "--knowledge-path", str(pr["knowledge"].working_tree_dir)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (engine_pr,) = standin.pulls(REPO, f"optbot/flux2/{pr['sha'][:12]}")
    assert standin.pulls("team/optbot")  # the knowledge PR: store entries and lessons
    (reply,) = [r for r in replies(standin) if "<!-- optbot-run:" in r]
    assert f"#{engine_pr['number']}" in reply or engine_pr["html_url"] in reply, reply
    assert "Dashboard:" in reply
    board = [i for i in standin.issues(REPO) if "<!-- optbot-dashboard -->" in (i.get("body") or "")]
    assert len(board) == 1 and "<!-- optbot-dashboard-section: flux2 -->" in board[0]["body"]
    assert reactions(standin, cid) == ["eyes", "rocket"]
    (tmp_path / "walkthrough.json").write_text(json.dumps({"comment": p.stdout, "reply": reply}))
