"""Delivery through the real PyGithub client against the GitHub stand-in on 127.0.0.1.

Each scenario must end with exactly one engine PR and one knowledge PR. These tests replace the
measuring steps with the doubles of tests/fakes.py: what is under test is resume and delivery; the
git operations (worktrees, cherry-picks, pushes to bare repositories) and the HTTP calls are real.
"""
from __future__ import annotations

import json
from pathlib import Path

import git
import pytest

from bot.errors import OptbotError
from bot.run.context import RunOptions
from bot.run.faults import InjectedAbort
from bot.run.orchestrator import run_optimize
from bot.run.state import RunState
from bot.steps import validate
from tests.fakes import fake_steps, fake_verdict, stack_validator


def _opts(env) -> RunOptions:
    return RunOptions(workload="flux2", engine=str(env["engine"].working_tree_dir), preset="tiny", device="cpu",
                   repo="team/engine", knowledge_repo="team/optbot",
                   knowledge_path=str(env["knowledge"].working_tree_dir),
                   trigger_pr=env["trigger_pr"], trigger_comment=env["trigger_comment"], command="optbot optimize flux2")


def _fakes(env) -> dict:
    return {"steps": fake_steps(Path(env["knowledge"].working_tree_dir)), "validate": stack_validator}


def _branch(env) -> str:
    return f"optbot/flux2/{env['engine'].head.commit.hexsha[:12]}"


def _assert_one_each(standin, env):
    eng = standin.pulls("team/engine", _branch(env))
    kno = standin.pulls("team/optbot")
    assert len(eng) == 1, eng
    assert len(kno) == 1, kno
    return eng[0], kno[0]


def test_two_runs_in_a_row_one_pr_each(standin, forge_env):
    env = forge_env
    s1 = run_optimize(_opts(env), **_fakes(env))
    d1 = s1.result("deliver")
    assert d1.forge == "github"
    assert d1.engine_pr.action == "opened" and d1.knowledge_pr.action == "opened"
    s2 = run_optimize(_opts(env), **_fakes(env))
    d2 = s2.result("deliver")
    assert d2.engine_pr.action == "updated" and d2.knowledge_pr.action == "updated"
    pr, kpr = _assert_one_each(standin, env)
    assert pr["state"] == "open" and pr["base"]["ref"] == "main"
    # the pushed branch holds one commit per accepted candidate, with numbers and trailers
    bare = git.Repo(env["engine_bare"])
    log = bare.git.log(f"main..{_branch(env)}", "--format=%B%x00").split("\x00")
    msgs = [m.strip() for m in log if m.strip()]
    assert len(msgs) == 2
    assert "Optbot-Kind: merge-siblings" in msgs[1] and "Optbot-Kind: fuse-elementwise-chain" in msgs[0]
    assert "measured on cpu" in msgs[0] and "speedup (eager median) 1.111x" in msgs[0]
    assert f"Optbot-Run: {s2.run_id}" in msgs[0]
    # the PR body carries latency per device, correctness, environment; the knowledge PR the chart
    assert "measured on" in pr["body"] and "max abs err" in pr["body"] and "<details>" in pr["body"]
    assert "optimized | eager" in pr["body"] and "cpu (fixed number of a test double)" in pr["body"]
    kfiles = git.Repo(env["knowledge_bare"]).git.ls_tree("-r", "--name-only", kpr["head"]["ref"]).split()
    assert any(f.endswith("latency.png") for f in kfiles) and any(f.startswith("lessons/test-") for f in kfiles)
    # reactions: eyes at start, rocket at success (GitHub dedupes; one each)
    assert sorted(r["content"] for r in standin.reactions[env["trigger_comment"]]) == ["eyes", "rocket"]
    # one reply per run, each naming the PR
    replies = [c for c in standin.comments("team/engine", env["trigger_pr"]) if c["user"]["login"] == "optbot"]
    assert len(replies) == 2 and pr["html_url"] in replies[1]["body"]


@pytest.mark.parametrize("point", ["validate", "deliver:engine-pr"])
def test_killed_and_resumed_one_pr_each(standin, forge_env, monkeypatch, point):
    env = forge_env
    monkeypatch.setenv("OPTBOT_ABORT_AFTER", point)
    with pytest.raises(InjectedAbort):
        run_optimize(_opts(env), **_fakes(env))
    monkeypatch.delenv("OPTBOT_ABORT_AFTER")
    runs = sorted(p.name for p in (env["tmp"] / "runs").iterdir())
    assert len(runs) == 1
    st = RunState.load(runs[0])
    assert not st.finished
    assert st.next_step() == ("combine" if point == "validate" else "deliver")
    if point == "deliver:engine-pr":  # the PRs exist already; a resume must not open a second one
        assert len(standin.pulls("team/engine")) == 2  # the trigger PR + the engine PR
    # a rate limit on the way: retried, not fatal
    standin.fail_next("POST" if point == "validate" else "GET", r"/pulls$", "primary")
    st2 = run_optimize(resume=runs[0], **_fakes(env))
    assert st2.finished and st2.attempts == 2
    pr, _ = _assert_one_each(standin, env)
    assert pr["state"] == "open"
    replies = [c for c in standin.comments("team/engine", env["trigger_pr"]) if c["user"]["login"] == "optbot"]
    assert len(replies) == 1  # the resumed run edits its own reply (marker), never posts a second
    assert standin.failures == []  # the rate-limited request happened, and was retried


def test_pr_closed_by_a_person_is_not_reopened(standin, forge_env):
    env = forge_env
    run_optimize(_opts(env), **_fakes(env))
    pr, _ = _assert_one_each(standin, env)
    standin.close_pr("team/engine", pr["number"])
    s2 = run_optimize(_opts(env), **_fakes(env))
    d = s2.result("deliver")
    assert d.engine_pr.action == "closed-by-person"
    assert "does not reopen" in d.engine_pr.note
    pr2, _ = _assert_one_each(standin, env)
    assert pr2["state"] == "closed"
    reply = [c for c in standin.comments("team/engine", env["trigger_pr"]) if c["user"]["login"] == "optbot"][-1]
    assert "closed by a person" in reply["body"] and "did not reopen" in reply["body"]


def test_secondary_rate_limit_retry_after(standin, forge_env):
    env = forge_env
    standin.fail_next("GET", r"^/repos/team/engine$", "secondary")
    s = run_optimize(_opts(env), **_fakes(env))
    assert s.finished
    _assert_one_each(standin, env)
    assert sum(1 for m, p in standin.requests if p == "/repos/team/engine") >= 2


def test_server_errors_on_the_way_are_retried(standin, forge_env, monkeypatch):
    """502s on opening the engine PR, a 503 on the reply: the run still delivers, once each."""
    env = forge_env
    monkeypatch.setenv("OPTBOT_GITHUB_MAX_WAIT", "0.01")  # the backoff's 1 s, 2 s, capped: no real wait
    standin.fail_status("POST", r"^/repos/team/engine/pulls$", 502, times=2)
    standin.fail_status("POST", r"^/repos/team/engine/issues/\d+/comments$", 503, times=1)
    s = run_optimize(_opts(env), **_fakes(env))
    assert s.finished and s.result("deliver").engine_pr.action == "opened"
    _assert_one_each(standin, env)
    assert [f[3] for f in standin.status_failures] == [0, 0]  # every injected failure was met
    replies = [c for c in standin.comments("team/engine", env["trigger_pr"]) if c["user"]["login"] == "optbot"]
    assert len(replies) == 1


def test_failure_reacts_confused_and_records(standin, forge_env):
    env = forge_env

    def broken(ctx):
        raise OptbotError("generator exploded")

    fakes = _fakes(env)
    fakes["steps"]["generate"] = broken
    with pytest.raises(OptbotError, match="step generate failed: generator exploded .*optimize flux2 --resume"):
        run_optimize(_opts(env), **fakes)
    contents = sorted(r["content"] for r in standin.reactions[env["trigger_comment"]])
    assert contents == ["confused", "eyes"]
    run = next((env["tmp"] / "runs").iterdir()).name
    st = RunState.load(run)
    assert st.steps["generate"].status == "failed" and st.next_step() == "generate"


def test_token_without_repo_is_a_clear_error(forge_env):
    env = forge_env
    o = _opts(env)
    o.repo = None
    with pytest.raises(OptbotError, match="--repo OWNER/NAME"):
        run_optimize(o, **_fakes(env))


class _Pausing:
    """The real validate step (lanes, checkpoints, pause points) over a validator double whose
    first call uses up the attempt's time: the pause must come at the next safe point."""

    def __init__(self, env, pause_in_first_call: bool):
        self.calls: list[str] = []
        self.pause_in_first_call = pause_in_first_call
        self.steps = fake_steps(Path(env["knowledge"].working_tree_dir))
        self.ctx = None

    def validator(self, t, ref, base, opts):
        import time
        cid = opts.run_dir.name
        self.calls.append(cid)
        if self.pause_in_first_call and len(self.calls) == 1:
            time.sleep(0.3)
            self.ctx.pause_at = time.time()  # the attempt's time is spent while this validation runs
        return fake_verdict(t, ref, cid, 10.0, 9.0)

    def kw(self) -> dict:
        def validate_keeping_ctx(ctx):  # the real step; the double needs the context to spend its time
            self.ctx = ctx
            return validate.run(ctx)

        return {"steps": {**self.steps, "validate": validate_keeping_ctx}, "validate": self.validator}


def test_paused_mid_validate_then_resumed_keeps_what_was_reached(standin, forge_env):
    env = forge_env
    s1 = _Pausing(env, pause_in_first_call=True)
    st = run_optimize(_opts(env), pause_after_s=3600, **s1.kw())
    assert st.paused and not st.finished and s1.calls == ["c1"]  # c1 finished in flight; c2 never started
    assert st.next_step() == "validate" and st.partial["validate"]["seconds"] >= 0.3
    assert (st.run_dir / "validate" / "c1" / "verdict-record.json").is_file()
    s2 = _Pausing(env, pause_in_first_call=False)
    st2 = run_optimize(resume=st.run_id, **s2.kw())
    assert st2.finished and not st2.paused and st2.attempts == 2
    assert s2.calls == ["c2", "stack"]  # c1's verdict came from its checkpoint
    assert st2.steps["validate"].seconds >= 0.3 and st2.partial == {}  # the paused attempt's time counts
    verdicts = st2.result("validate").verdicts
    assert [(cid, type(v).__name__, v.status) for cid, v in verdicts.items()] == [("c1", "Verdict", "accepted"),
                                                                                  ("c2", "Verdict", "accepted")]
    _assert_one_each(standin, env)


def test_paused_before_a_step_and_the_stack_checkpoint(standin, forge_env):
    """A pause is checked before each step; the stack's verdict is checkpointed like a candidate's,
    so a resume after combine's validation does not validate the stack again."""
    env = forge_env
    s1 = _Pausing(env, pause_in_first_call=False)
    st = run_optimize(_opts(env), pause_after_s=0, **s1.kw())
    assert st.paused and st.steps == {} and s1.calls == []
    st2 = run_optimize(resume=st.run_id, **s1.kw())
    assert st2.finished and s1.calls == ["c1", "c2", "stack"]
    head = st2.result("combine").head_sha
    assert json.loads((st2.run_dir / "validate" / "stack" / "verdict-record.json").read_text())["sha"] == head
    assert len(st2.result("combine").stack_sha256) == 64


def test_a_stack_refused_on_revalidation_opens_no_engine_pr(standin, forge_env):
    """Each commit accepted alone, the stack rejected as a whole: no engine PR claims a gain, the reply
    and the report say why, and the branch stays for a person to look at."""
    env = forge_env

    def refusing(t, ref, base, opts):
        v = stack_validator(t, ref, base, opts)
        v.status, v.reason, v.summary = "rejected", "no-change", "faster in no mode: eager 1.012x (noise 1.62%)"
        return v

    s = run_optimize(_opts(env), steps=fake_steps(Path(env["knowledge"].working_tree_dir)), validate=refusing)
    d = s.result("deliver")
    assert d.engine_pr.action == "none" and "rejected when re-validated" in d.engine_pr.note
    assert standin.pulls("team/engine", _branch(env)) == []
    reply = [c for c in standin.comments("team/engine", env["trigger_pr"]) if c["user"]["login"] == "optbot"][-1]
    assert "accepted alone" in reply["body"] and "nothing delivered" in reply["body"]
    md = Path(d.report_md).read_text()
    assert "**Not delivered**" in md and "2 commit(s) on branch" in md


def test_a_stack_that_breaks_whole_is_stacked_again_and_the_breaking_member_left_out(standin, forge_env):
    """Three candidates accepted alone; c1 and c3 together fail on correctness (the validator double
    decides from the stack's real tree, as a correctness failure would). combine stacks them again
    the most valuable first (c2 1.25x, c3 1.18x, c1 1.11x), checks c2+c3 for correctness only, knows
    c2+c3+c1 is the stack that broke, leaves c1 out with the reason, validates c2+c3 whole with
    timing, and the engine PR delivers those two."""
    import git

    from bot.engine import add_worktree
    from bot.generate.candidate import Candidate
    from bot.steps import generate

    env = forge_env
    steps = fake_steps(Path(env["knowledge"].working_tree_dir))
    ms = {"c1": 9.0, "c2": 8.0, "c3": 8.5}

    def three(ctx):
        t = ctx.target
        res = generate.Result("done", "3 candidates")
        for cid in ms:
            wt = add_worktree(t.checkout, f"test-cand-{ctx.run_id}-{cid}")
            (wt / "src" / f"opt_{cid}.py").write_text(f"# {cid}\n")
            r = git.Repo(wt)
            r.git.add("-A")
            msg = f"Optimization {cid}\n\nA test candidate.\n\nOptbot-Kind: test\n"
            r.git.commit("-qm", msg, env={"GIT_AUTHOR_DATE": "2001-01-02T00:00:00Z",
                                          "GIT_COMMITTER_DATE": "2001-01-02T00:00:00Z"})
            res.candidates.append(Candidate(id=cid, opportunity_id="o", kind="test", generator="test-double",
                                            worktree=str(wt), commit_sha=r.head.commit.hexsha,
                                            base_sha=t.checkout.base_sha, title=f"Optimization {cid}",
                                            description=msg, trailers={"Optbot-Kind": "test"}))
        return res

    def alone(ctx):
        return validate.Result("done", "3 of 3 accepted", {
            c.id: fake_verdict(ctx.target, c.commit_sha, c.id, 10.0, ms[c.id]) for c in ctx.results.generate.candidates})

    seen = []

    def breaks_with_c1_and_c3(t, ref, base, opts):
        files = {b.path for b in t.checkout.repo.commit(ref).tree.traverse()}
        both = {"src/opt_c1.py", "src/opt_c3.py"} <= files
        seen.append((sorted(f for f in files if "opt_" in f), opts.run_dir.name.split("-")[0:2]))
        v = stack_validator(t, ref, base, opts)
        if both:
            v.status, v.reason, v.summary = "rejected", "correctness", "1 of 6 output checks fail: rel L2 0.104 > 0.05"
        return v

    kill = [True]

    def killed_before_the_last_validation(t, ref, base, opts):
        if len(seen) == 2 and kill and kill.pop():  # the machine goes away after the check, before the kept stack
            raise RuntimeError("device lost (test double)")
        return breaks_with_c1_and_c3(t, ref, base, opts)

    kw = dict(steps={**steps, "generate": three, "validate": alone}, validate=killed_before_the_last_validation)
    with pytest.raises(Exception, match="device lost"):
        run_optimize(_opts(env), **kw)
    (run_id,) = [d.name for d in (env["tmp"] / "runs").iterdir()]
    s = run_optimize(resume=run_id, **kw)  # the whole stack's verdict and the check come from their checkpoints
    assert len(seen) == 3
    comb = s.result("combine")
    assert [c.candidate_id for c in comb.commits] == ["c2", "c3"]  # stacked in the candidates' order
    assert comb.stack_verdict.accepted
    assert [(c.added, c.status, bool(c.known_from)) for c in comb.checks] == [
        ("", "rejected", False), ("c3", "accepted", False), ("c1", "rejected", True)]
    assert comb.checks[1].candidate_ids == ["c2", "c3"] and comb.checks[2].head_sha == comb.checks[0].head_sha
    (left,) = [d for d in comb.dropped if d.startswith("c1:")]
    assert "left out" in left and "correctness" in left and "whole stack" in left
    # the whole stack validated, c2+c3 checked, the stack of the two kept validated; the stack that
    # broke was not checked again (on CPU every validation is correctness-only: DESIGN decision 7)
    opt = ["src/opt_c1.py", "src/opt_c2.py", "src/opt_c3.py"]
    assert seen == [(opt, ["stack"]), (opt[1:], ["stack", "check"]), (opt[1:], ["stack"])]
    assert "stacked again one member at a time" in comb.stack_note and "2 kept" in comb.stack_note
    pr = standin.pulls("team/engine", _branch(env))
    assert len(pr) == 1
    md = Path(s.result("deliver").report_md).read_text()
    assert "c1: each passed alone, but the stack with it failed" in md
    assert "Stacks checked for correctness, no timing (3)" in md and "| c2 + c3 | c3 | accepted |" in md
