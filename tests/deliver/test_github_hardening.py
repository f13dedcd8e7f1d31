"""The GitHub forge tried as an attacker (or a bad network day) would, through the real PyGithub
client against the stand-in on 127.0.0.1 (issue 15): a reply marker in someone else's comment,
server errors (5xx), and an API URL where nothing listens."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from bot.deliver.github import GitHubForge
from bot.deliver.pull_request import marker
from bot.errors import OptbotError
from bot.run.context import RunOptions
from tests.conftest import ROOT

REPO = "team/engine"


def _forge(env, run_id: str = "run-1", **kw) -> tuple[GitHubForge, list[float]]:
    """A forge on the triggering PR; its waits are recorded, not slept."""
    waits: list[float] = []
    o = RunOptions(workload="flux2", repo=REPO, trigger_pr=env["trigger_pr"], **kw)
    return GitHubForge("test-token", o, run_id, log=lambda m: None, sleep=waits.append), waits


def _marked(standin, env, run_id: str = "run-1") -> list[dict]:
    return [c for c in standin.comments(REPO, env["trigger_pr"]) if marker(run_id) in c["body"]]


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: a connection is refused
    return port


# ------------------------------------------------------------------------------------------------
# 1. the reply marker is ours only in the bot's own comments

def test_a_marker_in_someone_elses_comment_is_left_alone(standin, forge_env):
    env = forge_env
    bait = f"looks done to me\n\n{marker('run-1')}\n"
    mallory = standin.add_comment(REPO, env["trigger_pr"], bait, user="mallory")
    f, _ = _forge(env)
    first = f.reply("optbot finished", marker("run-1"))
    assert first.action == "opened"
    assert standin.issues_comments[mallory]["body"] == bait  # not overwritten
    ours = [c for c in _marked(standin, env) if c["user"]["login"] == "optbot"]
    assert len(ours) == 1 and ours[0]["body"].startswith("optbot finished")

    again = f.reply("optbot finished, second time", marker("run-1"))
    assert again.action == "updated" and again.url == first.url
    f2, _ = _forge(env)  # a resumed run: a new forge finds its own reply again
    assert f2.reply("optbot finished, third time", marker("run-1")).action == "updated"
    ours = [c for c in _marked(standin, env) if c["user"]["login"] == "optbot"]
    assert len(ours) == 1 and ours[0]["body"].startswith("optbot finished, third time")
    assert standin.issues_comments[mallory]["body"] == bait
    assert [p for _, p in standin.requests].count("/user") == 2  # once per forge: cached


def test_a_token_that_cannot_read_its_user_posts_and_never_edits(standin, forge_env, monkeypatch):
    """An installation token (GitHub Actions' GITHUB_TOKEN) gets 403 on GET /user: the bot cannot tell
    its comments from others', so it posts; $OPTBOT_GITHUB_LOGIN names the bot and editing is back."""
    env = forge_env
    standin.auth_login = None
    bait = f"bait\n\n{marker('run-1')}\n"
    mallory = standin.add_comment(REPO, env["trigger_pr"], bait, user="mallory")
    f, _ = _forge(env)
    assert [f.reply("one", marker("run-1")).action, f.reply("two", marker("run-1")).action] == ["opened", "opened"]
    assert standin.issues_comments[mallory]["body"] == bait
    monkeypatch.setenv("OPTBOT_GITHUB_LOGIN", "optbot")
    f2, _ = _forge(env)
    assert f2.reply("three", marker("run-1")).action == "updated"
    assert standin.issues_comments[mallory]["body"] == bait
    assert len([c for c in _marked(standin, env) if c["user"]["login"] == "optbot"]) == 2


# ------------------------------------------------------------------------------------------------
# 2. server errors are retried like rate limits, then end in one clear error

@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_server_error_is_retried_with_backoff(standin, forge_env, status):
    env = forge_env
    standin.fail_status("POST", r"^/repos/team/engine/issues/\d+/comments$", status, times=2)
    f, waits = _forge(env)
    assert f.reply("optbot finished", marker("run-1")).action == "opened"
    assert waits == [1.0, 2.0] and f.retries == waits
    assert len(_marked(standin, env)) == 1
    assert standin.status_failures[0][3] == 0  # both injected failures were met


def test_a_server_error_that_persists_is_one_clear_error(standin, forge_env):
    env = forge_env
    standin.fail_status("GET", r"^/repos/team/engine$", 502, times=None)
    f, waits = _forge(env)
    with pytest.raises(OptbotError) as ei:
        f.reply("optbot finished", marker("run-1"))
    assert str(ei.value) == "GitHub: get repo team/engine failed: 502 Bad Gateway (after 6 attempts)"
    assert [p for _, p in standin.requests].count("/repos/team/engine") == 6
    assert waits == [1.0, 2.0, 3.0, 3.0, 3.0]  # 2^n s, capped by $OPTBOT_GITHUB_MAX_WAIT (3 in forge_env)


def test_other_errors_are_not_retried(standin, forge_env):
    env = forge_env
    standin.fail_status("GET", r"^/repos/team/engine$", 501, times=None)
    f, waits = _forge(env)
    with pytest.raises(OptbotError, match=r"^GitHub: get repo team/engine failed: 501 Not Implemented$"):
        f.repo(REPO)
    assert waits == [] and [p for _, p in standin.requests].count("/repos/team/engine") == 1


# ------------------------------------------------------------------------------------------------
# 3. nothing listening at the API URL

def test_a_refused_connection_is_one_clear_error():
    url = f"http://127.0.0.1:{_closed_port()}/api/v3"
    f = GitHubForge("test-token", RunOptions(workload="flux2", repo=REPO, trigger_pr=1, github_api_url=url),
                    "run-1", log=lambda m: None, sleep=lambda s: None)
    for call in (lambda: f.repo(REPO), lambda: f.reply("hi", marker("run-1"))):
        with pytest.raises(OptbotError) as ei:
            call()
        msg = str(ei.value)
        assert msg == f"GitHub: get repo {REPO} failed: connection refused by {url} " \
                      f"(--github-api-url / $OPTBOT_GITHUB_API_URL)"
        assert ei.value.__cause__ is None and ei.value.__suppress_context__  # no chained traceback


def test_a_refused_connection_on_the_cli_is_one_line(tmp_path):
    """`optbot optimize` reacts 👀 first: a refused connection there is the courtesy's one-line notice
    (the run goes on; here it pauses at once, exit 75), never a traceback."""
    url = f"http://127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_TOKEN", "GH_TOKEN")}
    env.update(OPTBOT_GITHUB_TOKEN="test-token", OPTBOT_GITHUB_API_URL=url, OPTBOT_RUNS_DIR=str(tmp_path / "runs"),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    p = subprocess.run([sys.executable, "-m", "bot", "optimize", "flux2", "--pause-after", "0s", "--repo", REPO,
                        "--trigger-pr", "1", "--trigger-comment", "2"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert p.returncode == 75, p.stderr
    assert "Traceback" not in p.stderr
    said = " ".join(p.stderr.split())  # rich wraps long lines
    assert f"could not react eyes: GitHub: get repo {REPO} failed: connection refused by {url} " in said
