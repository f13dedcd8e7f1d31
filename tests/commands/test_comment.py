"""`optbot comment --event PATH`: recorded-style issue_comment payloads (tests/commands/events/)
answered through the real PyGithub client against the GitHub stand-in on 127.0.0.1.

What is under test: who may trigger (the API's permission, never a name), what is ignored, the
grammar with hostile text kept as data (no process is started, nothing is echoed), the head SHA
taken from the API at comment time, one run per pull request and workload, the reactions, and the
request that `optbot optimize --request` runs to the same reactions' end.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import cli
from bot.errors import OptbotError
from bot.trigger.request import load_request

ROOT = Path(__file__).resolve().parents[2]
EVENTS = Path(__file__).parent / "events"
REPO = "team/engine"


def comment(standin, tmp_path, body: str, number: int = 1, user: str = "maintainer",
            fixture: str = "created_on_pull_request.json") -> tuple[Path, int]:
    """A comment by `user` made in the stand-in, and its event payload as Actions would write it."""
    cid = standin.add_comment(REPO, number, body, user=user)
    ev = json.loads((EVENTS / fixture).read_text())
    ev["issue"]["number"], ev["comment"]["id"], ev["comment"]["body"] = number, cid, body
    ev["comment"]["user"]["login"] = user
    path = tmp_path / f"event-{cid}.json"
    path.write_text(json.dumps(ev))
    return path, cid


def answer(path: Path, tmp_path: Path, *extra: str) -> dict:
    """`optbot comment` in this process; the outcome it wrote, with the request file if any."""
    from click.testing import CliRunner

    out = tmp_path / f"outcome-{path.stem}.json"
    req = tmp_path / f"request-{path.stem}.json"
    res = CliRunner().invoke(cli, ["comment", "--event", str(path), "--request", str(req), "--json", str(out),
                                   *extra], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    d["request_file"] = req if req.exists() else None
    d["printed"] = res.output
    return d


def reactions(standin, cid: int) -> list[str]:
    return sorted(r["content"] for r in standin.reactions.get(cid, []))


def replies(standin, number: int = 1) -> list[str]:
    return [c["body"] for c in standin.comments(REPO, number) if c["user"]["login"] == "optbot"]


# ------------------------------------------------------------------------------------------- accepted

def test_an_accepted_comment_records_the_head_sha_from_the_api(pr, standin, tmp_path):
    out = tmp_path / "gh-output"
    ev, cid = comment(standin, tmp_path, "/optimize flux2 --preset tiny --gpus 2 --budget 1h30m --engine diffusers")
    d = answer(ev, tmp_path, "--github-output", str(out))
    assert d["status"] == "dispatched"
    req = load_request(d["request_file"])
    assert req.head_sha == pr["sha"] and req.repo == REPO and req.pull_request == 1 and req.comment_id == cid
    assert (req.command.workload, req.command.preset, req.command.gpus, req.command.budget_s, req.command.engine) == \
        ("flux2", "tiny", 2, 5400.0, "diffusers")
    assert req.requested_by == "maintainer" and req.permission == "write"
    assert ("GET", f"/repos/{REPO}/pulls/1") in standin.requests  # asked of the API, not of the payload
    assert reactions(standin, cid) == ["eyes"] and replies(standin) == []  # 🚀 or 😕 is the run's to give
    lines = out.read_text().splitlines()
    assert lines[:3] == ["status=dispatched", "workload=flux2", f"sha={pr['sha']}"]
    assert lines[3].startswith("request=") and json.loads(lines[3][len("request="):])["head_sha"] == pr["sha"]
    assert lines[4:] == ["shards=1"]  # one host: the workflow's optimize job, --gpus 2 its local pool
    # a push after the comment changes nothing of what was recorded
    standin.set_head_sha(REPO, 1, "f" * 40)
    assert load_request(d["request_file"]).head_sha == pr["sha"]


def test_shards_fan_the_validation_out_over_runners(pr, standin, tmp_path):
    """`--shards N` reaches the workflow as the checked number only (its matrix comes from the plan)."""
    out = tmp_path / "gh-output"
    ev, _ = comment(standin, tmp_path, "/optimize flux2 --gpus 2 --shards 3")
    d = answer(ev, tmp_path, "--github-output", str(out))
    req = load_request(d["request_file"])
    assert (req.command.gpus, req.command.shards) == (2, 3)
    assert out.read_text().splitlines()[-1] == "shards=3"


@pytest.mark.parametrize("line, shards", [("/optimize flux2", 1), ("/optimize flux2 --shards 1", 1),
                                          ("/optimize flux2 --shards 8 --gpus 8", 8),
                                          ("/optimize qwen-image --budget 2h --shards 2", 2)])
def test_the_grammar_takes_a_shard_count(line, shards):
    from bot.trigger.grammar import parse

    assert parse(line).command.shards == shards


def test_quant_reaches_the_request_and_only_optbots_recipes_pass(pr, standin, tmp_path):
    """`--quant fp8` goes into the request file as a checked name (optimize --request runs at
    DTYPE+fp8); any other value gets the grammar, in optbot's words."""
    from bot.trigger.grammar import parse

    ev, _ = comment(standin, tmp_path, "/optimize flux2 --quant fp8")
    d = answer(ev, tmp_path)
    assert d["status"] == "dispatched" and load_request(d["request_file"]).command.quant == "fp8"
    assert parse("/optimize flux2").command.quant is None
    for bad in ("int4", "FP8", "fp8;rm"):
        p = parse(f"/optimize flux2 --quant {bad}")
        assert p.command is None and p.problem in ("--quant takes one of fp8", "the line holds characters other "
                                                   "than ASCII letters, digits, '.', '_', '-' and spaces")


@pytest.mark.parametrize("role", ["admin", "maintain", "write"])
def test_write_maintain_and_admin_may_trigger(pr, standin, tmp_path, role):
    standin.set_permission(REPO, "maintainer", role)
    ev, _ = comment(standin, tmp_path, "/optimize qwen-image")
    assert answer(ev, tmp_path)["status"] == "dispatched"
    assert ("GET", f"/repos/{REPO}/collaborators/maintainer/permission") in standin.requests


def test_text_after_the_first_line_is_not_read(pr, standin, tmp_path):
    body = "/optimize flux2\n--gpus 8 $(touch /tmp/optbot-pwned) `id`\n" + "x" * 65536
    ev, _ = comment(standin, tmp_path, body)
    d = answer(ev, tmp_path)
    assert d["status"] == "dispatched" and load_request(d["request_file"]).command.gpus == 1
    assert "touch" not in d["request_file"].read_text() and "x" * 100 not in d["request_file"].read_text()


# ------------------------------------------------------------------------------------------- ignored

@pytest.mark.parametrize("fixture, body", [
    ("edited.json", "/optimize flux2"), ("deleted.json", "/optimize flux2"),
    ("created_by_bot.json", "/optimize flux2"),
    ("created_on_pull_request.json", "LGTM, thanks"),
    ("created_on_pull_request.json", "could someone /optimize flux2?"),
    ("created_on_pull_request.json", "\n/optimize flux2"),
    ("created_on_pull_request.json", "／optimize flux2"),  # fullwidth solidus
    ("created_on_pull_request.json", "/\u043eptimize flux2"),  # Cyrillic o
    ("created_on_pull_request.json", "\u200b/optimize flux2"),  # zero-width space first
    ("created_on_pull_request.json", "/OPTIMIZE flux2"),
    ("created_on_pull_request.json", ""),
])
def test_ignored_events_post_nothing_and_need_no_token(standin, tmp_path, monkeypatch, fixture, body):
    for k in ("OPTBOT_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    ev = json.loads((EVENTS / fixture).read_text())
    ev["comment"]["body"] = body
    p = tmp_path / "event.json"
    p.write_text(json.dumps(ev))
    d = answer(p, tmp_path)
    assert d["status"] == "ignored" and d["request_file"] is None
    assert standin.requests == []


# ------------------------------------------------------------------------------------------- refused

@pytest.mark.parametrize("role", ["triage", "read", "none", None])
def test_others_are_told_who_can_trigger_and_nothing_runs(pr, standin, tmp_path, role):
    standin.set_permission(REPO, "passer-by", role)
    ev, cid = comment(standin, tmp_path, "/optimize flux2", user="passer-by")
    d = answer(ev, tmp_path)
    assert d["status"] == "unauthorized" and d["request_file"] is None
    (reply,) = replies(standin)
    assert "write, maintain or admin permission" in reply and f"<!-- optbot-comment: {cid} -->" in reply
    assert reactions(standin, cid) == ["confused"]  # no 👀: optbot did not take it on
    assert ("GET", f"/repos/{REPO}/pulls/1") not in standin.requests


def test_a_spoofed_bot_name_is_just_a_login(pr, standin, tmp_path, monkeypatch):
    """`optbot[bot]` as a User, author_association OWNER, and GITHUB_ACTOR naming a maintainer: the
    API says read, so nothing runs."""
    monkeypatch.setenv("GITHUB_ACTOR", "maintainer")
    ev, cid = comment(standin, tmp_path, "/optimize flux2", user="optbot[bot]", fixture="spoofed_bot_name.json")
    d = answer(ev, tmp_path)
    assert d["status"] == "unauthorized"
    assert ("GET", f"/repos/{REPO}/collaborators/optbot%5Bbot%5D/permission") in standin.requests
    assert reactions(standin, cid) == ["confused"]


def test_an_issue_is_told_that_optimize_works_on_pull_requests(pr, standin, tmp_path):
    issue = standin.add_issue(REPO)
    ev, cid = comment(standin, tmp_path, "/optimize flux2", number=issue, fixture="created_on_issue.json")
    d = answer(ev, tmp_path)
    assert d["status"] == "not-a-pull-request" and d["request_file"] is None
    (reply,) = [c["body"] for c in standin.comments(REPO, issue) if c["user"]["login"] == "optbot"]
    assert "works on pull requests" in reply
    assert reactions(standin, cid) == ["confused"]


HOSTILE = [
    "/optimize flux2; touch /tmp/optbot-pwned", "/optimize $(touch /tmp/optbot-pwned)", "/optimize `id`",
    "/optimize flux2 --gpus $(nproc)", "/optimize flux2 && curl http://evil.example", "/optimize flux2|sh",
    "/optimize flux2 > /etc/passwd", "/optimize flux2 --budget '30m'", "/optimize flux2 \"--gpus\" 2",
    "/optimize\u00a0flux2", "/optimize flux2\u2028--gpus 8", "/optimize flux2\x1b[2J", "/optimize flux2\x00",
    "/optimize flux2 --gpus \u0663", "/optimize flux2 --gpus 1_0", "/optimize flux2 --gpus 0x2",
    "/optimize fl\u0445x2", "/optimize " + "a" * 65536,
    "/optimize ../workloads/flux2.yaml", "/optimize /etc/passwd", "/optimize flux2 --engine ../../evil",
    "/optimize flux2 --engine https://evil.example/engine.git", "/optimize flux2 --engine sglang=/tmp/x",
    "/optimize nosuchworkload", "/optimize", "/optimize --preset tiny flux2", "/optimizeflux2",
    "/optimize-all", "/optimize flux2 --preset=tiny", "/optimize flux2 --preset huge",
    "/optimize flux2 --gpus 0", "/optimize flux2 --gpus 9", "/optimize flux2 --gpus 2 --gpus 3",
    "/optimize flux2 --budget 99h", "/optimize flux2 --budget 0m", "/optimize flux2 --budget $5",
    "/optimize flux2 --gpus", "/optimize flux2 --resume x", "/optimize flux2 please",
    "/optimize qwen-image --engine nosuch",
    "/optimize flux2 --shards 0", "/optimize flux2 --shards 9", "/optimize flux2 --shards 2 --shards 3",
    "/optimize flux2 --shards", "/optimize flux2 --shards two", "/optimize flux2 --shards 02",
    "/optimize flux2 --shards ٢", "/optimize flux2 --shards=2",
]


ECHO = ("two", "٢", "touch", "$(", "`id`", "nproc", "evil", "passwd", "\u00a0", "\u2028", "\x1b", "\x00", "\u0663", "aaaa",
        "nosuch", "please", "huge", "resume", "1_0", "0x2", "fl\u0445x2")


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_the_grammar_refuses_hostile_text_in_its_own_words(body):
    from bot.trigger.grammar import help_text, is_command, parse

    p = parse(body)
    assert is_command(body) and p.command is None and p.problem
    reply = help_text(p.problem)
    assert "/optimize <workload> [--preset tiny|full]" in reply and "`flux2`: engines `diffusers`, `sglang`" in reply
    assert not [f for f in ECHO if f in reply]


def test_anything_else_starting_with_optimize_gets_the_grammar_and_starts_no_process(pr, standin, tmp_path,
                                                                                    monkeypatch):
    """Through the API, every hostile comment gets the help as a reply and 😕: no process is
    started, nothing is requested, and the reply is optbot's own words (the comment is never
    echoed, so no markdown, mention or link of it is posted again)."""
    def no_process(*a, **kw):
        raise AssertionError(f"a process was started: {a[:1]}")

    for mod, name in [(subprocess, "Popen"), (os, "system"), (os, "popen"), (os, "posix_spawn"),
                      (os, "posix_spawnp"), (os, "fork"), (os, "execv"), (os, "execvp")]:
        monkeypatch.setattr(mod, name, no_process)
    for body in HOSTILE:
        ev, cid = comment(standin, tmp_path, body)
        d = answer(ev, tmp_path)
        assert d["status"] == "help" and d["request_file"] is None, body
        (reply,) = [r for r in replies(standin) if f"<!-- optbot-comment: {cid} -->" in r]
        assert "/optimize <workload>" in reply and not [f for f in ECHO if f in reply], body
        assert reactions(standin, cid) == ["confused"], body
    assert len(replies(standin)) == len(HOSTILE)


# ------------------------------------------------------------------------------------------- one run at a time

def test_a_second_optimize_while_one_runs_is_told_so(pr, standin, tmp_path):
    first, c1 = comment(standin, tmp_path, "/optimize flux2")
    assert answer(first, tmp_path)["status"] == "dispatched"
    second, c2 = comment(standin, tmp_path, "/optimize flux2 --gpus 2")
    d = answer(second, tmp_path)
    assert d["status"] == "already-running" and d["request_file"] is None
    (reply,) = replies(standin)
    assert "already optimizing `flux2`" in reply and f"#issuecomment-{c1}" in reply
    assert reactions(standin, c2) == ["confused", "eyes"]  # taken on, then refused: no run going for c2
    # another workload on the same pull request runs beside it, and so does the same workload in FP8
    # or on another engine (other branches); naming the default engine is the same run
    other, _ = comment(standin, tmp_path, "/optimize qwen-image")
    assert answer(other, tmp_path)["status"] == "dispatched"
    assert answer(comment(standin, tmp_path, "/optimize flux2 --quant fp8")[0], tmp_path)["status"] == "dispatched"
    assert answer(comment(standin, tmp_path, "/optimize flux2 --engine sglang")[0], tmp_path)["status"] == "dispatched"
    assert answer(comment(standin, tmp_path, "/optimize flux2 --engine diffusers")[0], tmp_path)["status"] == "already-running"
    assert answer(comment(standin, tmp_path, "/optimize flux2 --quant fp8 --gpus 2")[0], tmp_path)["status"] == "already-running"
    # someone else's 👀 is no run; the bot's own 🚀 ends the first one
    standin.add_reaction(c1, "rocket", user="passer-by")
    assert answer(comment(standin, tmp_path, "/optimize flux2")[0], tmp_path)["status"] == "already-running"
    standin.add_reaction(c1, "rocket")
    third, c3 = comment(standin, tmp_path, "/optimize flux2")
    assert answer(third, tmp_path)["status"] == "dispatched"
    # a run whose job was killed leaves a 👀 with no end: after the job's time limit it blocks nothing
    standin.issues_comments[c3]["created_at"] = "2001-01-01T00:00:00Z"
    assert answer(comment(standin, tmp_path, "/optimize flux2")[0], tmp_path)["status"] == "dispatched"


def test_a_refusal_answered_twice_is_one_reply(pr, standin, tmp_path):
    """A re-run of the workflow for the same event edits optbot's reply instead of adding one."""
    ev, _ = comment(standin, tmp_path, "/optimize flux2 --gpus 99")
    answer(ev, tmp_path)
    answer(ev, tmp_path)
    assert len(replies(standin)) == 1


# ------------------------------------------------------------------------------------------- the run

def test_the_request_runs_to_the_same_comments_rocket(pr, standin, tmp_path, monkeypatch):
    """comment -> push -> `optbot optimize flux2 --request R --engine PATH`, the measuring steps
    replaced by tests/fakes.py: the run is of the SHA recorded at comment time, not of the push, it reacts 🚀 on the comment, and the
    next /optimize flux2 is not told that a run is going."""
    from click.testing import CliRunner

    import bot.run.orchestrator as orch
    from tests.fakes import fake_steps, stack_validator

    ev, cid = comment(standin, tmp_path, "/optimize flux2 --preset tiny")
    d = answer(ev, tmp_path)
    # a push to the pull request after the comment: its head moves, the run measures the recorded SHA
    eng = pr["engine"]
    (Path(eng.working_tree_dir) / "pushed-later.txt").write_text("after the comment")
    eng.index.add(["pushed-later.txt"])
    pushed = eng.index.commit("pushed after the /optimize comment").hexsha
    standin.set_head_sha(REPO, 1, pushed)
    real = orch.run_optimize
    seen = {}

    def run_with_doubles(options, **kw):
        seen["options"] = options
        return real(options, steps=fake_steps(Path(pr["knowledge"].working_tree_dir)), validate=stack_validator, **kw)

    monkeypatch.setattr(orch, "run_optimize", run_with_doubles)
    res = CliRunner().invoke(cli, ["optimize", "flux2", "--request", str(d["request_file"]), "--device", "cpu",
                                   "--engine", str(pr["engine"].working_tree_dir), "--knowledge-repo", "team/optbot",
                                   "--knowledge-path", str(pr["knowledge"].working_tree_dir)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    o = seen["options"]
    assert (o.ref, o.engine, o.preset, o.repo, o.trigger_pr, o.trigger_comment) == \
        (pr["sha"], f"diffusers={pr['engine'].working_tree_dir}", "tiny", REPO, 1, cid)
    assert standin.pulls(REPO, f"optbot/flux2/{pr['sha'][:12]}") and not standin.pulls(REPO, f"optbot/flux2/{pushed[:12]}")
    assert reactions(standin, cid) == ["eyes", "rocket"]
    assert answer(comment(standin, tmp_path, "/optimize flux2")[0], tmp_path)["status"] == "dispatched"


def test_a_failed_run_gets_confused(pr, standin, tmp_path):
    ev, cid = comment(standin, tmp_path, "/optimize flux2")
    answer(ev, tmp_path)
    answer(ev, tmp_path, "--run-failed")
    assert reactions(standin, cid) == ["confused", "eyes"]
    assert answer(comment(standin, tmp_path, "/optimize flux2")[0], tmp_path)["status"] == "dispatched"


@pytest.mark.parametrize("change, says", [
    (lambda r: r.update(head_sha="HEAD"), "head_sha"),
    (lambda r: r["command"].update(workload="../x"), "unknown workload"),
    (lambda r: r["command"].update(gpus="8; rm -rf /"), "--gpus"),
    (lambda r: r["command"].update(shards=64), "--shards"),
    (lambda r: r["command"].update(shards=True), "--shards"),
    (lambda r: r["command"].update(engine="https://evil.example/e.git"), "--engine"),
    (lambda r: r["command"].update(budget_s=10 ** 9), "--budget"),
    (lambda r: r.update(version=2), "version"),
    (lambda r: r.update(shell="rm -rf /"), "unknown keys"),
    (lambda r: r.pop("head_sha"), "not an optbot request"),
])
def test_a_request_file_is_checked_again_when_read(pr, standin, tmp_path, change, says):
    ev, _ = comment(standin, tmp_path, "/optimize flux2")
    path = answer(ev, tmp_path)["request_file"]
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(OptbotError, match=says):
        load_request(path)


def test_optimize_with_a_request_takes_no_option_the_request_decides(pr, standin, tmp_path):
    ev, _ = comment(standin, tmp_path, "/optimize flux2")
    req = str(answer(ev, tmp_path)["request_file"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, says in [(["qwen-image", "--request", req], "workload 'flux2', not 'qwen-image'"),
                       (["flux2", "--request", req, "--ref", "main"], "--ref"),
                       (["flux2", "--request", req, "--gpus", "4"], "--gpus"),
                       (["flux2", "--request", req, "--engine", "sglang=/tmp"], "--engine"),
                       (["flux2", "--request", req, "--quant", "fp8"], "--quant")]:
        p = subprocess.run([sys.executable, "-m", "bot", "optimize", *args], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=120)
        assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


# ------------------------------------------------------------------------------------------- the command line

def test_the_command_line_end_to_end(pr, standin, tmp_path):
    """`python -m bot comment` as the workflow runs it: exit 0 and the outputs; a damaged payload is
    one line and exit 2."""
    ev, _ = comment(standin, tmp_path, "/optimize flux2")
    out = tmp_path / "gh-output"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "bot", "comment", "--event", str(ev), "--github-output", str(out)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "optbot comment: dispatched: flux2 at" in p.stdout and "status=dispatched" in out.read_text()
    bad = tmp_path / "bad.json"
    for text, says in [("{not json", "not JSON"), (json.dumps({"action": "created"}), "key 'repository.full_name'"),
                       (json.dumps({**json.loads(ev.read_text()), "repository": {"full_name": "../../x"}}),
                        "not an OWNER/NAME")]:
        bad.write_text(text)
        p = subprocess.run([sys.executable, "-m", "bot", "comment", "--event", str(bad)], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=120)
        assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
