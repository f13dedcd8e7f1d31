"""The git side every generator shares (bot/generate/commits.py): commits as the bot with hooks off,
snapshots, everything since the base squashed into one candidate commit whose message the one writer
made and the one parser reads back."""
from __future__ import annotations

import pytest

from tests.repos import init_repo
from bot.generate.candidate import commit_message, make_trailers
from bot.generate.commits import CommitError, changed_since, commit_all, commit_candidate, snapshot
from bot.trailers import parse_trailers


@pytest.fixture
def repo(tmp_path):
    wt = tmp_path / "engine"
    r = init_repo(wt, {"src/mod.py": "def f(x):\n    return x * 2\n"})
    # a hook that would run in the bot's process if hooks were on (--no-verify does not skip post-commit)
    hook = wt / ".git" / "hooks" / "post-commit"
    hook.write_text(f"#!/bin/sh\ntouch {tmp_path / 'hook-ran'}\n")
    hook.chmod(0o755)
    return r


def test_snapshots_squash_into_one_candidate_commit(repo, tmp_path):
    wt, base = repo.working_dir, repo.head.commit.hexsha
    snap0 = snapshot(wt, "snapshot 0")  # nothing changed: still a commit
    assert repo.commit(snap0).tree == repo.commit(base).tree and not changed_since(wt, base)
    (tmp_path / "engine" / "src" / "mod.py").write_text("def f(x):\n    return x + x\n")
    (tmp_path / "engine" / "src" / "k.py").write_text("K = 1\n")
    snap1 = snapshot(wt, "snapshot 1")
    assert changed_since(wt, base, snap1)
    trailers = make_trailers("opp-1", "fuse-elementwise-chain", ["k"], [], generator="agent/fuse", run_id="r1")
    trailers["Optbot-Entry"] = "a\nOptbot-Kind: forged"  # a value cannot end the trailer block early
    sha = commit_candidate(wt, base, "f: add instead of multiply", "Why.", trailers)
    c = repo.commit(sha)
    assert [p.hexsha for p in c.parents] == [base] and c.tree == repo.commit(snap1).tree
    assert c.author.name == c.committer.name == "optbot" and c.author.email == "optbot@localhost"
    assert c.message == commit_message("f: add instead of multiply", "Why.", trailers)
    read = parse_trailers(c.message)
    assert read["Optbot-Entry"] == "a Optbot-Kind: forged" and read["Optbot-Kind"] == "fuse-elementwise-chain"
    assert read["Optbot-Generator"] == "agent/fuse" and read["Optbot-Run"] == "r1"
    assert not (tmp_path / "hook-ran").exists()


def test_commit_all_and_its_failures(repo, tmp_path):
    wt = repo.working_dir
    assert commit_all(wt, "nothing to commit")[0] == ""
    (tmp_path / "engine" / "src" / "mod.py").write_text("def f(x):\n    return 2 * x\n")
    sha, err = commit_all(wt, commit_message("t", "", make_trailers("", "absorb-bias", [], [])))
    assert sha == repo.head.commit.hexsha and err == ""
    amended, _ = commit_all(wt, "t2\n", amend=True)
    assert repo.commit(amended).parents == repo.commit(sha).parents and repo.commit(amended).summary == "t2"
    with pytest.raises(CommitError, match="reset"):
        commit_candidate(wt, "0" * 40, "t", "", {})
    with pytest.raises(ValueError, match="bad trailer key"):
        commit_message("t", "", {"Optbot Kind": "x"})
    assert not (tmp_path / "hook-ran").exists()
