"""The GitHub forge (bot/deliver/github.py) through the real PyGithub client against the stand-in on
127.0.0.1: rate-limit waits, GitHub Enterprise base URLs, and --dry-run with a token set."""
from __future__ import annotations

import pytest
from github import GithubException

from bot.deliver.forge import make_forge
from bot.deliver.github import GitHubForge, rate_limit_wait
from bot.run.context import RunOptions


def test_rate_limit_waits():
    now = 1000.0
    prim = GithubException(403, {"message": "API rate limit exceeded"}, {"x-ratelimit-remaining": "0",
                                                                        "x-ratelimit-reset": "1010"})
    assert rate_limit_wait(prim, 0, now=now) == pytest.approx(11.0)
    sec = GithubException(429, {"message": "secondary"}, {"Retry-After": "7"})
    assert rate_limit_wait(sec, 3, now=now) == 7.0
    plain = GithubException(403, {"message": "Resource not accessible by integration"}, {"X-RateLimit-Remaining": "4000"})
    assert rate_limit_wait(plain, 0, now=now) is None
    assert rate_limit_wait(GithubException(422, {"message": "Validation Failed"}, {}), 0) is None
    assert rate_limit_wait(GithubException(403, {"message": "API rate limit exceeded"}, {}), 2) == 4.0


def test_github_enterprise_base_url(forge_env):
    """The forge talks to an API served under /api/v3, as GitHub Enterprise does."""
    from tests.deliver.github_standin import GitHubStandIn

    ghe = GitHubStandIn(prefix="/api/v3").start()
    try:
        ghe.add_repo("team/engine", forge_env["engine_bare"])
        o = RunOptions(workload="flux2", repo="team/engine", github_api_url=ghe.base)
        f = GitHubForge("t", o, "run-x", log=lambda m: None)
        assert f.repo("team/engine").full_name == "team/engine"
        assert all(p.startswith("/api/v3/") for _, p in ghe.requests)
    finally:
        ghe.stop()


def test_dry_run_with_token_stays_local(forge_env):
    o = RunOptions(workload="flux2", repo="team/engine", dry_run=True)
    assert make_forge(o, "r", forge_env["tmp"]).name == "local"
    o.dry_run = False
    assert make_forge(o, "r", forge_env["tmp"]).name == "github"
