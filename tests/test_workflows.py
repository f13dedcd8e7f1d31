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


def _zizmor() -> str:
    import shutil
    import sys

    exe = Path(sys.executable).parent / "zizmor"
    found = str(exe) if exe.exists() else shutil.which("zizmor")
    assert found, "zizmor is a test dependency (pyproject.toml [test]): pip install -e '.[test]'"
    return found


def test_zizmor_finds_nothing_in_the_workflows():
    """zizmor's audits (offline: no GitHub API) over every workflow: no finding. The one ignore is
    optimize.yml's issue_comment trigger, which is the product (its comment says why it is safe)."""
    import subprocess

    p = subprocess.run([_zizmor(), "--offline", "--no-progress", str(ROOT / ".github" / "workflows")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "No findings to report" in p.stdout + p.stderr, p.stdout + p.stderr


def test_every_action_is_pinned_by_commit_sha():
    for f in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        for m in re.finditer(r"uses:\s*(\S+)", f.read_text()):
            ref = m.group(1)
            if ref.startswith("./"):
                continue
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{f.name}: {ref} is not pinned by commit SHA"
