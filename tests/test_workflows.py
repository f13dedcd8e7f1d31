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
# read from the actions' own repositories: git rev-parse 'v4.6.2^{commit}', 'v4.3.0^{commit}'
UPLOAD = "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02"  # v4.6.2
DOWNLOAD = "actions/download-artifact@d3f86a106a0bac45b974a628896c90dbdf5c8093"  # v4.3.0
GPU_JOBS = ("optimize", "plan", "shard", "aggregate")  # the jobs that run on the GPU runners


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
    for job in GPU_JOBS:
        assert "github.event.comment" not in str(wf["jobs"][job]), job


def test_third_party_actions_are_pinned_by_full_sha_with_their_tag():
    lines = [ln for ln in FILE.read_text().splitlines() if re.match(r"\s*(-\s+)?uses:", ln)]
    assert lines
    for ln in lines:
        assert re.search(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$", ln), ln
        if "actions/checkout@" in ln:
            assert CHECKOUT in ln and ln.endswith("# v4.2.2"), ln
        if "actions/upload-artifact@" in ln:
            assert UPLOAD in ln and ln.endswith("# v4.6.2"), ln
        if "actions/download-artifact@" in ln:
            assert DOWNLOAD in ln and ln.endswith("# v4.3.0"), ln


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
    # comment's answer; optimize's run and its 😕; plan's 😕; aggregate's resume and its 😕. The shard
    # jobs, which run generated code, and the plan's and the merge's steps hold none.
    assert sorted(job for job, _ in holders) == ["aggregate", "aggregate", "comment", "optimize", "optimize", "plan"]
    assert all("-m bot comment" in run or "-m bot optimize" in run for _, run in holders)
    assert not [r for j, r in holders if "shard" in r or j == "shard"]


def test_one_run_per_pull_request_and_workload(wf):
    job = wf["jobs"]["optimize"]
    group = job["concurrency"]["group"]
    assert "github.event.issue.number" in group and "needs.comment.outputs.workload" in group
    assert job["concurrency"]["cancel-in-progress"] is False  # a run is never cancelled by the next comment
    assert job["needs"] == "comment" and "needs.comment.outputs.request" in job["if"]
    # a fanned-out run holds the same group in the jobs that write (plan's run directory, aggregate's delivery)
    for name in ("plan", "aggregate"):
        assert wf["jobs"][name]["concurrency"] == job["concurrency"], name


def test_one_host_or_a_matrix_of_runners_by_the_checked_shard_count(wf):
    """shards=1 (optbot comment's checked number): the one optimize job. More: plan -> a matrix of shard
    jobs, one per shard the plan made -> the aggregate, the results passed as artifacts."""
    jobs = wf["jobs"]
    assert wf["jobs"]["comment"]["outputs"]["shards"] == "${{ steps.answer.outputs.shards }}"
    assert "needs.comment.outputs.shards == '1'" in jobs["optimize"]["if"]
    plan, shard, agg = jobs["plan"], jobs["shard"], jobs["aggregate"]
    assert plan["needs"] == "comment" and "needs.comment.outputs.shards != '1'" in plan["if"]
    assert "needs.comment.outputs.request != ''" in plan["if"]
    assert shard["needs"] == ["comment", "plan"] and agg["needs"] == ["comment", "plan", "shard"]
    assert shard["strategy"] == {"fail-fast": False, "matrix": {"shard": "${{ fromJSON(needs.plan.outputs.matrix) }}"}}
    assert plan["outputs"]["matrix"] == "${{ steps.plan.outputs.matrix }}"
    # the aggregate runs after a failed shard too (merge names what is missing, the comment gets 😕)
    assert agg["if"] == "always() && needs.plan.result == 'success'"
    run = "\n".join(s.get("run", "") for s in plan["steps"])
    assert '--stop-after generate' in run and 'test "$rc" -eq 75' in run
    assert '-m bot shard plan "$run_id" --shards "$SHARDS"' in run and '--github-output "$GITHUB_OUTPUT"' in run
    assert next(s for s in plan["steps"] if s.get("id") == "plan")["env"]["SHARDS"] == "${{ needs.comment.outputs.shards }}"
    sv = next(s for s in shard["steps"] if "shard validate" in s.get("run", ""))
    assert '--shard "$SHARD/$SHARDS"' in sv["run"] and sv["env"] == {"SHARD": "${{ matrix.shard }}",
                                                                      "SHARDS": "${{ needs.plan.outputs.shards }}"}
    ups = {j: [s["with"]["name"] for s in jobs[j]["steps"] if s.get("uses", "").startswith(UPLOAD)] for j in jobs}
    assert ups["plan"] == ["optbot-plan"] and ups["shard"] == ["optbot-shard-${{ matrix.shard }}"]
    downs = {j: [s["with"] for s in jobs[j]["steps"] if s.get("uses", "").startswith(DOWNLOAD)] for j in jobs}
    assert [d["name"] for d in downs["shard"]] == ["optbot-plan"] and downs["aggregate"][0]["pattern"] == "optbot-*"
    merge = next(s["run"] for s in agg["steps"] if "shard merge" in s.get("run", ""))
    assert '"$RUNNER_TEMP/optbot-artifacts/optbot-plan"' in merge and '"$RUNNER_TEMP"/optbot-artifacts/optbot-shard-*' in merge
    resume = next(s for s in agg["steps"] if "--resume" in s.get("run", ""))
    assert resume["run"] == 'python -m bot optimize "$WORKLOAD" --resume "$RUN_ID"'
    assert resume["env"]["RUN_ID"] == "${{ needs.plan.outputs.run_id }}"


def test_time_limits_and_runners(wf):
    for name, job in wf["jobs"].items():
        assert isinstance(job.get("timeout-minutes"), int), name
    opt = wf["jobs"]["optimize"]
    assert all(wf["jobs"][j]["runs-on"] == ["self-hosted", "gpu"] for j in GPU_JOBS)
    # the comment command's "a run is going" window covers the whole job, and the whole fan-out
    assert opt["timeout-minutes"] * 60 <= RUN_WINDOW_S
    assert sum(wf["jobs"][j]["timeout-minutes"] for j in ("plan", "shard", "aggregate")) * 60 <= RUN_WINDOW_S


def test_optbot_from_its_own_default_branch_the_engine_at_the_recorded_sha(wf):
    for name, job in wf["jobs"].items():
        checkouts = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
        mine = [s for s in checkouts if s["with"].get("path") == "optbot"]
        assert len(mine) == 1, name
        assert mine[0]["with"]["repository"] == "${{ vars.OPTBOT_REPOSITORY }}" and "ref" not in mine[0]["with"]
        assert all(s["with"].get("persist-credentials") is False for s in checkouts), name
    for job in GPU_JOBS:
        engine = [s for s in wf["jobs"][job]["steps"] if (s.get("with") or {}).get("path") == "engine"]
        assert len(engine) == 1, job
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


# ------------------------------------------------------------------------------------------------
# the scheduled workflow (.github/workflows/scheduled.yml): nightly store check, weekly optimize

SCHEDULED = ROOT / ".github" / "workflows" / "scheduled.yml"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
SCHEDULED_GPU_JOBS = ("store-check", "optimize")


@pytest.fixture(scope="module")
def sched() -> dict:
    return yaml.safe_load(SCHEDULED.read_text())


def _crons(sched) -> list[str]:
    return [c["cron"] for c in sched.get("on", sched.get(True))["schedule"]]


def _cron_ok(expr: str) -> bool:
    """Five fields (minute hour day-of-month month day-of-week), each *, a number in range, or a
    list/range/step of them: what GitHub's schedule accepts (POSIX cron)."""
    fields = expr.split()
    if len(fields) != 5:
        return False
    limits = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 6)]
    for f, (lo, hi) in zip(fields, limits):
        for part in f.split(","):
            base, _, step = part.partition("/")
            if step and not (step.isdigit() and int(step) > 0):
                return False
            if base == "*":
                continue
            bounds = base.split("-")
            if not all(b.isdigit() and lo <= int(b) <= hi for b in bounds) or len(bounds) > 2:
                return False
    return True


def test_scheduled_triggers_a_nightly_and_a_weekly_cron_and_dispatch(sched):
    on = sched.get("on", sched.get(True))
    assert set(on) == {"schedule", "workflow_dispatch"}
    nightly, weekly = _crons(sched)
    assert all(_cron_ok(c) for c in (nightly, weekly)), (nightly, weekly)
    assert nightly.split()[2:] == ["*", "*", "*"]  # every day
    assert weekly.split()[2:4] == ["*", "*"] and weekly.split()[4].isdigit()  # one day a week
    assert not _cron_ok("61 3 * * *") and not _cron_ok("17 3 * *") and not _cron_ok("17 3 * * 7")
    # github.event.schedule tells the crons apart: each job names exactly its own cron
    jobs = sched["jobs"]
    assert f"github.event.schedule == '{nightly}'" in jobs["store-check"]["if"]
    assert weekly not in jobs["store-check"]["if"]
    steps = {s.get("id"): s for s in jobs["requests"]["steps"]}
    assert f"github.event.schedule == '{weekly}'" in steps["list"]["if"] and nightly not in steps["list"]["if"]
    assert f"github.event.schedule == '{nightly}'" in steps["dashboard"]["if"] and weekly not in steps["dashboard"]["if"]
    assert on["workflow_dispatch"]["inputs"]["job"]["options"] == ["store-check", "optimize"]
    for name in ("store-check", "requests"):  # a dispatch measures the default branch only
        assert "github.event.repository.default_branch" in jobs[name]["if"], name


def test_no_expression_in_any_run_script_of_any_workflow():
    for f in WORKFLOWS:
        wf = yaml.safe_load(f.read_text())
        for job, step in _steps(wf):
            assert "${{" not in step.get("run", ""), f"{f.name} {job}/{step.get('name')}: expressions go through env:"


def test_scheduled_pins_permissions_secrets_and_checkouts(sched):
    lines = [ln for ln in SCHEDULED.read_text().splitlines() if re.match(r"\s*(-\s+)?uses:", ln)]
    assert lines and all(CHECKOUT in ln and ln.endswith("# v4.2.2") for ln in lines), lines
    assert sched["permissions"] == {} and "write-all" not in SCHEDULED.read_text()
    assert "env" not in sched and all("env" not in job for job in sched["jobs"].values())
    holders = []
    for name, job in sched["jobs"].items():
        assert all(v in ("read", "none") for v in job["permissions"].values()), name
        assert isinstance(job.get("timeout-minutes"), int), name
        checkouts = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
        assert all(s["with"].get("persist-credentials") is False for s in checkouts), name
        mine = [s for s in checkouts if s["with"].get("path") == "optbot"]
        assert len(mine) == 1 and mine[0]["with"]["repository"] == "${{ vars.OPTBOT_REPOSITORY }}", name
        assert "ref" not in mine[0]["with"], name
        for s in checkouts:  # the engine: this repository, at the ref the event runs on (the default branch)
            if s["with"].get("path") == "engine":
                assert "repository" not in s["with"] and "ref" not in s["with"], name
        for s in job["steps"]:
            assert "secrets." not in str(s.get("with", {})), (name, s.get("name"))
            if "secrets." in str(s.get("env", {})):
                holders.append((name, s["run"]))
    # the dashboard's read-back; the store check, its unticking, lessons from review; the optimize run
    assert [n for n, _ in holders] == ["requests", "store-check", "store-check", "store-check", "optimize"]
    commands = ["-m bot dashboard requests", "-m bot store check", '-m bot dashboard "done"', "-m bot lessons review",
                "-m bot optimize"]
    assert all(c in run for c, (_, run) in zip(commands, holders)), holders


def test_scheduled_gpu_jobs_runners_and_concurrency(sched):
    jobs = sched["jobs"]
    for name in SCHEDULED_GPU_JOBS:
        job = jobs[name]
        assert job["runs-on"] == ["self-hosted", "gpu"], name
        assert job["concurrency"]["cancel-in-progress"] is False and "github.repository" in job["concurrency"]["group"]
    assert jobs["requests"]["runs-on"] == "ubuntu-latest"
    assert "matrix.workload" in jobs["optimize"]["concurrency"]["group"]
    assert jobs["optimize"]["timeout-minutes"] * 60 <= RUN_WINDOW_S
    assert jobs["optimize"]["needs"] == "requests" and jobs["store-check"]["needs"] == "requests"
    assert "!cancelled()" in jobs["store-check"]["if"]  # a failed dashboard read does not skip the check
    assert "'[]'" in jobs["optimize"]["if"]  # no ticked re-run: no empty matrix
    assert jobs["optimize"]["strategy"]["matrix"]["workload"] == "${{ fromJSON(needs.requests.outputs.workloads) }}"
    assert jobs["requests"]["outputs"]["workloads"] == \
        "${{ steps.list.outputs.workloads || steps.dashboard.outputs.rerun }}"
    listing = next(s for s in jobs["requests"]["steps"] if s.get("id") == "list")
    assert '-m bot workloads --github-output "$GITHUB_OUTPUT"' in listing["run"]
    board = next(s for s in jobs["requests"]["steps"] if s.get("id") == "dashboard")
    assert '-m bot dashboard requests --github-output "$GITHUB_OUTPUT"' in board["run"]
    untick = next(s for s in jobs["store-check"]["steps"] if "dashboard" in s.get("run", ""))
    assert untick["env"]["REVALIDATED"] == "${{ needs.requests.outputs.revalidate_ids }}"
    check = next(s["run"] for s in jobs["store-check"]["steps"] if "store check" in s.get("run", ""))
    assert "--propose" in check and "--device cuda" in check and '--engine "$engine"' in check


def test_the_workloads_step_lists_what_optbot_ships(tmp_path):
    """The command of the matrix step, run: a JSON list of every workloads/*.yaml optbot ships."""
    import json
    import subprocess
    import sys

    out = tmp_path / "github_output"
    p = subprocess.run([sys.executable, "-m", "bot", "workloads", "--github-output", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (line,) = out.read_text().splitlines()
    key, _, value = line.partition("=")
    assert key == "workloads" and json.loads(value) == sorted(f.stem for f in (ROOT / "workloads").glob("*.yaml"))


@pytest.mark.parametrize("engine_var, expected", [("", "{ws}/engine"), ("sglang", "sglang={ws}/engine")])
def test_the_scripts_name_the_engine_checkout(sched, tmp_path, engine_var, expected):
    """The store-check and optimize scripts run by bash, with a `python` on PATH that records its
    argv: --engine is the checkout, as NAME=PATH when the repository names its engine."""
    import json
    import os
    import subprocess
    import sys

    shim = tmp_path / "bin" / "python"
    shim.parent.mkdir()
    shim.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    shim.chmod(0o755)
    ws = str(tmp_path / "ws")
    env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "GITHUB_WORKSPACE": ws,
           "OPTBOT_ENGINE": engine_var, "WORKLOAD": "flux2"}
    for job in SCHEDULED_GPU_JOBS:
        run = next(s["run"] for s in sched["jobs"][job]["steps"] if "-m bot" in s.get("run", ""))
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", run], env=env, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        argv = json.loads(p.stdout)
        assert argv[argv.index("--engine") + 1] == expected.format(ws=ws), (job, argv)


def test_the_untick_script_passes_each_id_as_one_argument(sched, tmp_path):
    """The re-validate ids reach `optbot dashboard done` as arguments, one --revalidated each; even
    a value that is not what `dashboard requests` writes (it writes checked store ids) stays words."""
    import json
    import os
    import subprocess
    import sys

    shim = tmp_path / "bin" / "python"
    shim.parent.mkdir()
    shim.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    shim.chmod(0o755)
    run = next(s["run"] for s in sched["jobs"]["store-check"]["steps"] if "dashboard" in s.get("run", ""))
    for ids, expected in [("flux2-swiglu qwen-image-absorb-bias", ["flux2-swiglu", "qwen-image-absorb-bias"]),
                          ("a;touch pwned $(id) `id`", ["a;touch", "pwned", "$(id)", "`id`"])]:
        env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "REVALIDATED": ids}
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", run], env=env, capture_output=True, text=True,
                           timeout=30, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        argv = json.loads(p.stdout)
        assert argv[:4] == ["-m", "bot", "dashboard", "done"]
        assert argv[4:] == [x for i in expected for x in ("--revalidated", i)], argv
        assert not (tmp_path / "pwned").exists()


def test_a_step_output_is_one_line(tmp_path):
    """Every command's --github-output goes through one writer, which refuses a value that would
    start an output of its own (a newline) instead of writing it."""
    from bot.commands.common import write_github_output
    from bot.errors import OptbotError

    out = tmp_path / "github_output"
    write_github_output(out, {"workloads": '["flux2"]', "shards": 2})
    for bad in ({"workload": "flux2\nrequest={}"}, {"sha": "a\rb"}, {"bad name": "x"}):
        with pytest.raises(OptbotError, match="not one NAME=VALUE line"):
            write_github_output(out, bad)
    assert out.read_text() == 'workloads=["flux2"]\nshards=2\n'
