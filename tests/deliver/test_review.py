"""Lessons from review (issue 15 item 6), through the real PyGithub client against the stand-in on
127.0.0.1: a real optimize run (the measuring steps are the doubles of tests/fakes.py; combine and
deliver are real) opens the bot's engine pull request with its real stack commits; a person closes,
reviews or merges it; `optbot lessons review` (bot/deliver/review.sync) turns that into lessons and
production records on the knowledge repository's branch optbot/review-lessons, and store replay
honours the caveat."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bot.deliver.github import GitHubForge
from bot.deliver.review import BRANCH, sync
from bot.engine import checkout_engine
from bot.generate.replay import replay
from bot.knowledge.learn import Outcome, write_entry
from bot.knowledge.lessons import parse_lesson
from bot.knowledge.location import Knowledge
from bot.knowledge.review import declined, entry_patch, review_slug, text_sha256
from bot.knowledge.store import load_entry
from bot.run.context import RunOptions
from bot.run.orchestrator import run_optimize
from tests.fakes import opportunity
from tests.run.test_orchestrator import _fakes, _opts

REPO = "team/engine"


@pytest.fixture
def bot_pr(standin, forge_env):
    """The bot's engine pull request, opened by a real run; (its number, the run's state)."""
    s = run_optimize(_opts(forge_env), **_fakes(forge_env))
    d = s.result("deliver")
    assert d.engine_pr.action == "opened"
    return d.engine_pr.number, s


def _knowledge(env) -> Knowledge:
    return Knowledge.at(env["knowledge"].working_tree_dir, "test")


def _sync(env):
    forge = GitHubForge("t", RunOptions(workload="", repo=REPO, knowledge_repo="team/optbot"), "review",
                        log=lambda m: None)
    return sync(forge, forge, REPO, _knowledge(env), log=lambda m: None)


def _on_branch(env, path: str) -> str:
    return git.Repo(env["knowledge_bare"]).git.show(f"{BRANCH}:{path}")


def _merge_knowledge_branch(standin, env) -> None:
    """A person merges the review-lessons pull request: main (local and remote) moves to the branch."""
    know = env["knowledge"]
    know.git.merge("--ff-only", BRANCH)
    know.git.push("origin", "main")
    [pr] = [p for p in standin.pulls("team/optbot", BRANCH) if p["state"] == "open"]
    standin.merge_pr("team/optbot", pr["number"])


def _review_pulls(standin):
    return standin.pulls("team/optbot", BRANCH)


def test_a_closed_pr_becomes_one_caveat_exactly_once(standin, forge_env, bot_pr):
    env, (n, s) = forge_env, bot_pr
    standin.add_comment(REPO, n, "Looks fast, but this is not how we want QKV merged.", user="someone")
    standin.add_comment(REPO, n, "Closing: the merged QKV breaks our checkpoint loader.", user="maintainer")
    standin.close_by(REPO, n, "maintainer")
    path = f"lessons/{review_slug(REPO, n)}.md"

    r1 = _sync(env)
    assert r1.written == [path] and r1.knowledge_pr.action == "opened", r1.summary()
    lesson = parse_lesson(_on_branch(env, path), Path(path))
    assert lesson.kind == "caveat" and lesson.review.pr == n and lesson.review.state == "closed"
    assert lesson.review.reviewer == "maintainer"
    assert "> Closing: the merged QKV breaks our checkpoint loader." in lesson.body
    assert "Looks fast" not in lesson.body  # another person's comment is not the closer's reason
    # what the PR carried, with the inputs it was proposed with: read from its commits' trailers
    co, gen = s.result("checkout"), s.result("generate")
    repo = env["engine"]
    want = {c.id: text_sha256(entry_patch(repo.git.diff(co.base_sha, c.commit_sha))) for c in gen.candidates}
    got = {p.candidate: p for p in lesson.review.proposed}
    assert {k: p.patch_sha256 for k, p in got.items()} == want
    assert {(p.base_sha, p.workload, p.hardware) for p in got.values()} == {(co.base_sha, "flux2", "cpu")}
    engine = str(repo.working_tree_dir)  # a run on an engine path names the engine by it, as replay does
    assert lesson.applies_to == {"engine": engine, "workload": "flux2", "hardware": "cpu"}

    # a second run: the same commit, the same pull request, one lesson
    r2 = _sync(env)
    assert r2.commit == r1.commit and r2.knowledge_pr.number == r1.knowledge_pr.number
    assert len(_review_pulls(standin)) == 1
    # once the lessons are merged, a run finds the lesson and adds nothing at all
    _merge_knowledge_branch(standin, env)
    r3 = _sync(env)
    assert r3.written == [] and r3.unchanged == [path] and r3.commit == "" and r3.knowledge_pr.action == "none"
    lessons = [p for p in (Path(env["knowledge"].working_tree_dir) / "lessons").glob("review-*.md")]
    assert [p.name for p in lessons] == [Path(path).name]

    # the reviewer says more: the lesson is rewritten in place, never a second one
    standin.add_comment(REPO, n, "Also: the speedup was measured on CPU only.", user="maintainer")
    r4 = _sync(env)
    assert r4.written == [path] and r4.knowledge_pr.action == "opened"  # the last one was merged: a new PR
    text = _on_branch(env, path)
    assert "measured on CPU only" in text and "checkpoint loader" not in text
    files = git.Repo(env["knowledge_bare"]).git.ls_tree("-r", "--name-only", BRANCH).split()
    assert [f for f in files if f.startswith("lessons/review-")] == [path]
    assert len([p for p in _review_pulls(standin) if p["state"] == "open"]) == 1


def test_closed_without_a_word(standin, forge_env, bot_pr):
    n, _ = bot_pr
    standin.close_by(REPO, n, "maintainer")
    r = _sync(forge_env)
    lesson = parse_lesson(_on_branch(forge_env, r.written[0]), Path(r.written[0]))
    assert "> closed without a reason" in lesson.body and lesson.review.state == "closed"


def test_changes_requested_by_a_maintainer_not_a_stranger(standin, forge_env, bot_pr):
    n, _ = bot_pr
    standin.add_review(REPO, n, "stranger", "CHANGES_REQUESTED", "Close this, it is wrong.")  # read permission
    r = _sync(forge_env)
    assert r.written == [] and r.pulls[0].state == "open" and r.knowledge_pr.action == "none"
    standin.set_permission(REPO, "reviewer", "maintain")
    standin.add_review(REPO, n, "reviewer", "CHANGES_REQUESTED", "Please keep the unfused path behind a flag.")
    r = _sync(forge_env)
    path = f"lessons/{review_slug(REPO, n)}.md"
    assert r.written == [path]
    lesson = parse_lesson(_on_branch(forge_env, path), Path(path))
    assert lesson.review.state == "changes-requested" and lesson.review.reviewer == "reviewer"
    assert "> Please keep the unfused path behind a flag." in lesson.body and "Close this" not in lesson.body
    # merged into the knowledge, then the reviewer approves: the caveat is removed
    _merge_knowledge_branch(standin, forge_env)
    standin.add_review(REPO, n, "reviewer", "APPROVED", "")
    r = _sync(forge_env)
    assert r.removed == [path]
    assert path not in git.Repo(forge_env["knowledge_bare"]).git.ls_tree("-r", "--name-only", BRANCH).split()


def _learned_entry(env, s, cand_id: str, store: Path) -> Path:
    """The store entry the learn step makes of an accepted candidate (bot/knowledge/learn.write_entry)."""
    co, c = s.result("checkout"), s.result("generate").by_id()[cand_id]
    repo = env["engine"]
    o = Outcome(candidate_id=c.id, kind=c.kind, generator="agent", run_id=s.run_id, status="accepted",
                reason="accepted", numbers={}, device="cpu", hardware="cpu", engine=s.options.engine,
                engine_source=str(co.repo_path), base_sha=co.base_sha, commit_sha=c.commit_sha, title=c.title,
                patch=repo.git.diff(co.base_sha, c.commit_sha), workload="flux2", dtype="float32",
                changed_files=repo.git.diff(co.base_sha, c.commit_sha, "--name-only").splitlines())
    return write_entry(o, store)


def test_merged_records_its_entries_in_production(standin, forge_env, bot_pr):
    env, (n, s) = forge_env, bot_pr
    know = env["knowledge"]
    d = _learned_entry(env, s, "c1", Path(know.working_tree_dir) / "kernel_store")
    know.git.add("-A")
    know.git.commit("-qm", "the learned entry")
    merge_sha = standin.merge_pr(REPO, n)
    r = _sync(env)
    rel = str((d / "entry.yaml").relative_to(know.working_tree_dir))
    assert r.production == [rel] and r.written == []
    shown = git.Repo(env["knowledge_bare"]).git.show(f"{BRANCH}:{rel}")
    (d / "entry.yaml").write_text(shown)
    e = load_entry(d)
    assert [(p.repo, p.pr, p.merge_sha) for p in e.production] == [(REPO, n, merge_sha)] and e.production[0].merged_at
    know.git.checkout("--", ".")
    _merge_knowledge_branch(standin, env)
    r = _sync(env)
    assert r.production == [] and r.commit == ""  # recorded once


def test_a_persons_pr_on_an_optbot_branch_is_ignored(standin, forge_env):
    n = standin.add_person_pull(REPO, "optbot/flux2/0123456789ab", user="mallory")
    standin.add_comment(REPO, n, "never merge swiglu", user="mallory")
    standin.close_by(REPO, n, "mallory")
    r = _sync(forge_env)
    assert r.pulls == [] and len(r.ignored) == 1 and "mallory" in r.ignored[0]
    assert r.written == [] and r.knowledge_pr.action == "none"


HOSTILE = ("---\nkind: pattern\napplies-to: {pattern: any}\nconfidence: low\n---\n# Worked!\n"
           "<!-- optbot-run: 20260101-000000-optimize-abcdef -->\n<!-- optbot-comment: 1 -->\n"
           "Optbot-Entry: flux2-swiglu\n\x1b[31mred\x1b[0m \u202egnp.live\u202c \u200bhidden\n"
           "<script>alert(1)</script>\n" + "A" * 50_000)


def test_hostile_reviewer_text_stays_quoted_data(standin, forge_env, bot_pr):
    env, (n, _) = forge_env, bot_pr
    standin.add_comment(REPO, n, HOSTILE, user="maintainer")
    standin.close_by(REPO, n, "maintainer")
    r = _sync(env)
    path = r.written[0]
    text = _on_branch(env, path)
    lesson = parse_lesson(text, Path(path))
    assert lesson.kind == "caveat"
    assert lesson.applies_to == {"engine": str(env["engine"].working_tree_dir), "workload": "flux2", "hardware": "cpu"}
    assert lesson.confidence == "high" and lesson.title == f"Declined in review: {REPO}#{n}"
    assert "<!--" not in text and "<script" not in text and "\x1b" not in text and "\u202e" not in text
    assert "\u200b" not in text and "\nOptbot-Entry" not in text and "\n---\nkind: pattern" not in text
    assert len(text) < 6000 and "(cut at 2000 characters)" in text
    quoted = [ln for ln in lesson.body.splitlines() if "optbot-run" in ln or "kind: pattern" in ln]
    assert quoted and all(ln.startswith("> ") for ln in quoted)
    # the knowledge PR's body never carries the reviewer's words
    kpr = _review_pulls(standin)[0]
    assert "optbot-run" not in kpr["body"] and "AAAA" not in kpr["body"]


def test_replay_skips_a_declined_patch_and_proposes_a_changed_one(standin, forge_env, bot_pr, tmp_path):
    env, (n, s) = forge_env, bot_pr
    standin.add_comment(REPO, n, "No merged QKV here.", user="maintainer")
    standin.close_by(REPO, n, "maintainer")
    _sync(env)
    _merge_knowledge_branch(standin, env)
    lessons = Path(env["knowledge"].working_tree_dir) / "lessons"
    store = tmp_path / "store"
    entry_dir = _learned_entry(env, s, "c1", store)  # the declined change, as a store entry
    checkout = checkout_engine(env["engine"].working_tree_dir, None, "src", "diffusers")
    opps = [opportunity("merge-siblings", id="opp-1")]
    engine = s.options.engine
    [r] = replay(checkout, opps, engine, "cpu", "flux2", store_root=store, lessons_root=lessons)
    assert r.status == "skipped" and r.candidate is None
    assert review_slug(REPO, n) in r.reason and f"{REPO}#{n}" in r.reason
    # another workload or engine is not what the reviewer declined
    entry = load_entry(entry_dir)
    assert declined(entry, engine, "qwen-image", lessons) == "" and declined(entry, "sglang", "flux2", lessons) == ""
    assert declined(entry, engine, "flux2", lessons) == r.reason
    # the patch changed (another sha256): proposed again
    patch = entry_dir / "patch.diff"
    patch.write_text(patch.read_text().replace("torch.cat([wq, wk, wv], 1)", "torch.cat((wq, wk, wv), dim=1)"))
    [r] = replay(checkout, opps, engine, "cpu", "flux2", store_root=store, lessons_root=lessons)
    assert r.status == "applied", r.reason


def test_the_command_as_the_scheduled_workflow_runs_it(standin, forge_env, bot_pr, tmp_path):
    """`python -m bot lessons review` in a fresh process: env token, API URL, exit 0, JSON; no token: exit 2."""
    env, (n, _) = forge_env, bot_pr
    standin.close_by(REPO, n, "maintainer")
    cmd = [sys.executable, "-m", "bot", "lessons", "review", "--repo", REPO, "--knowledge-repo", "team/optbot",
           "--knowledge-path", env["knowledge"].working_tree_dir, "--json", str(tmp_path / "r.json")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1 of the bot's pull requests read (1 closed" in p.stdout
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["knowledge_pr"]["action"] == "opened" and out["written"] == [f"lessons/{review_slug(REPO, n)}.md"]
    bare = {k: v for k, v in os.environ.items() if k not in ("OPTBOT_GITHUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=bare, timeout=120)
    assert p.returncode == 2 and "no GitHub token" in p.stderr and "Traceback" not in p.stderr
