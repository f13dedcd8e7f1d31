"""The comment-triggered workflow (.github/workflows/optimize.yml), read as GitHub reads it: what it
must hold for a hostile comment to stay data and a pull request to stay out of optbot's own code."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bot.trigger.dispatch import RUN_WINDOW_S

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / ".github" / "workflows" / "optimize.yml"
CHECKOUT = "actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683"  # v4.2.2


@pytest.fixture(scope="module")
def wf() -> dict:
    return yaml.safe_load(FILE.read_text())


def _steps(wf):
    return [(name, s) for name, job in wf["jobs"].items() for s in job["steps"]]


def test_only_new_comments_trigger_it(wf):
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as true
    assert on == {"issue_comment": {"types": ["created"]}}


def test_comment_text_never_reaches_a_run_script(wf):
    for job, step in _steps(wf):
        run = step.get("run", "")
        assert not re.search(r"\$\{\{\s*github\.event\.comment", run), (job, step.get("name"))
        assert "${{" not in run, f"{job}/{step.get('name')}: expressions go through env:, never into the script"
    # what comes of the comment reaches the GPU job only as the checked request and names
    text = FILE.read_text()
    uses = [m.group(0) for m in re.finditer(r"github\.event\.comment\.[a-z_.]+", text)]
    assert set(uses) <= {"github.event.comment.body", "github.event.comment.user.type"}
    assert "github.event.comment" in wf["jobs"]["comment"]["if"]  # the cheap pre-check: an expression, no shell
    assert "github.event.comment" not in str(wf["jobs"]["optimize"])


def test_third_party_actions_are_pinned_by_full_sha_with_their_tag():
    lines = [ln for ln in FILE.read_text().splitlines() if re.match(r"\s*(-\s+)?uses:", ln)]
    assert lines
    for ln in lines:
        assert re.search(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$", ln), ln
        if "actions/checkout@" in ln:
            assert CHECKOUT in ln and ln.endswith("# v4.2.2"), ln


def test_least_privilege_permissions(wf):
    assert wf["permissions"] == {}
    for name, job in wf["jobs"].items():
        assert "permissions" in job, name
        assert all(v in ("read", "none") for v in job["permissions"].values()), (name, job["permissions"])
    assert "write-all" not in FILE.read_text()


def test_secrets_only_in_the_steps_that_need_them(wf):
    assert "env" not in wf and all("env" not in job for job in wf["jobs"].values())
    holders = []
    for job, step in _steps(wf):
        for k, v in (step.get("with") or {}).items():
            assert "secrets." not in str(v), (job, step.get("name"), k)
        if "secrets." in str(step.get("env", {})):
            holders.append((job, step["run"]))
    assert len(holders) == 3
    assert all("-m bot comment" in run or "-m bot optimize" in run for _, run in holders)


def test_one_run_per_pull_request_and_workload(wf):
    job = wf["jobs"]["optimize"]
    group = job["concurrency"]["group"]
    assert "github.event.issue.number" in group and "needs.comment.outputs.workload" in group
    assert job["concurrency"]["cancel-in-progress"] is False  # a run is never cancelled by the next comment
    assert job["needs"] == "comment" and "needs.comment.outputs.request" in job["if"]


def test_time_limits_and_runners(wf):
    for name, job in wf["jobs"].items():
        assert isinstance(job.get("timeout-minutes"), int), name
    opt = wf["jobs"]["optimize"]
    assert opt["runs-on"] == ["self-hosted", "gpu"]
    # the comment command's "a run is going" window covers the whole job
    assert opt["timeout-minutes"] * 60 <= RUN_WINDOW_S


def test_optbot_from_its_own_default_branch_the_engine_at_the_recorded_sha(wf):
    for name, job in wf["jobs"].items():
        checkouts = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
        mine = [s for s in checkouts if s["with"].get("path") == "optbot"]
        assert len(mine) == 1, name
        assert mine[0]["with"]["repository"] == "${{ vars.OPTBOT_REPOSITORY }}" and "ref" not in mine[0]["with"]
        assert all(s["with"].get("persist-credentials") is False for s in checkouts), name
    engine = [s for s in wf["jobs"]["optimize"]["steps"] if (s.get("with") or {}).get("path") == "engine"]
    assert engine[0]["with"]["ref"] == "${{ needs.comment.outputs.sha }}" and "repository" not in engine[0]["with"]
    text = FILE.read_text()
    assert "pull_request.head" not in text and "refs/pull" not in text and "head_ref" not in text
    run = next(s["run"] for _, s in _steps(wf) if "-m bot optimize" in s.get("run", ""))
    assert '--request "$RUNNER_TEMP/optbot-request.json"' in run and '--engine "$GITHUB_WORKSPACE/engine"' in run


def _tool(name: str) -> str:
    """A linter the [test] extras install as a wheel (pyproject.toml), next to this Python first."""
    import shutil
    import sys

    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    assert found, f"{name} is a test dependency (pyproject.toml [test]): pip install -e '.[test]'"
    return found


def _zizmor() -> str:
    return _tool("zizmor")


def _actionlint(*paths: Path) -> "subprocess.CompletedProcess":
    """actionlint with shellcheck over every `run:` script (pyflakes off: no Python scripts inline),
    the self-hosted runner labels from .github/actionlint.yaml."""
    import subprocess

    return subprocess.run([_tool("actionlint"), "-no-color", "-shellcheck", _tool("shellcheck"), "-pyflakes=",
                           "-config-file", str(ROOT / ".github" / "actionlint.yaml"), *map(str, paths)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_zizmor_finds_nothing_in_the_workflows():
    """zizmor's audits (offline: no GitHub API) over every workflow: no finding. The one ignore is
    optimize.yml's issue_comment trigger, which is the product (its comment says why it is safe)."""
    import subprocess

    p = subprocess.run([_zizmor(), "--offline", "--no-progress", str(ROOT / ".github" / "workflows")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "No findings to report" in p.stdout + p.stderr, p.stdout + p.stderr


def test_actionlint_finds_nothing_in_the_workflows():
    files = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    p = _actionlint(*files)
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout + p.stderr


def test_actionlint_and_its_shellcheck_do_find_what_they_are_run_for(tmp_path):
    """The check above can fail: a workflow with comment text expanded into a script, an unquoted
    variable, and an unknown runner label gets a finding for each."""
    bad = tmp_path / "bad.yml"
    bad.write_text('''on:
  issue_comment:
    types: [created]
jobs:
  j:
    runs-on: [self-hosted, tpu]
    steps:
      - run: echo "${{ github.event.comment.body }}"
      - run: cp $RUNNER_TEMP/a $RUNNER_TEMP/b
''')
    out = _actionlint(bad).stdout
    assert "[expression]" in out and "potentially untrusted" in out, out
    assert "shellcheck reported issue" in out and "SC2086" in out, out
    assert '[runner-label]' in out and '"tpu"' in out, out


def test_every_action_is_pinned_by_commit_sha():
    for f in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        for m in re.finditer(r"uses:\s*(\S+)", f.read_text()):
            ref = m.group(1)
            if ref.startswith("./"):
                continue
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{f.name}: {ref} is not pinned by commit SHA"
