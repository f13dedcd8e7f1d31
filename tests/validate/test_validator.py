"""bot/validate/validator.py: the validator's own rules (the checks end to end: test_adversarial.py)."""
from __future__ import annotations

import subprocess
import sys

from bot.paths import REPO_ROOT


def test_bot_side_never_imports_torch():
    mods = ["bot.validate", *(f"bot.validate.{m}" for m in ("validator", "context", "resolve", "correctness",
                                                             "engagement", "speed", "verdict", "ablate")),
            "bot.commands.validate", "bot.commands.ablate"]
    code = f"import sys, {', '.join(mods)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_fresh_seeds_are_random_and_never_zero():
    from bot.validate import fresh_seeds

    a, b = fresh_seeds(3), fresh_seeds(3)
    assert len(set(a)) == 3 and 0 not in a and a != b


def test_tamper_scan_flags_reaching_for_the_runner(tmp_path):
    import git

    from bot.validate.validator import tamper_lines

    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    repo = git.Repo.init(tmp_path)
    (tmp_path / "m.py").write_text("x = 1\n")
    repo.git.add("-A")
    repo.git.commit("-qm", "base", env=env)
    base = repo.head.commit.hexsha
    (tmp_path / "m.py").write_text("x = 1\ndef optbot_after_load(self): pass\nimport runner.timing as t\n")
    repo.git.commit("-qam", "cand", env=env)
    hits = tamper_lines(repo, base, repo.head.commit.hexsha)
    assert hits == ["m.py: import runner.timing as t"]


def test_a_job_that_does_not_finish_is_a_crashed_or_timeout_verdict(tmp_path):
    from pathlib import Path

    from bot.jobs import JobOutcome
    from bot.validate.resolve import Revision
    from bot.validate.validator import _crash_verdict
    from tests.validate.conftest import scratch_context

    ctx = scratch_context(tmp_path)
    rev = Revision("x.patch", "c" * 40, "b" * 40, Path("."), [], {"Optbot-Kind": ["k"]})
    oom = JobOutcome("failed", {"ok": False, "error": {"message": "CUDA out of memory. Tried to allocate 2 GiB",
                                                        "traceback": "Traceback ...\nOutOfMemoryError"}},
                     returncode=1, log_path="/r/candidate.log", log_tail="log")
    v = _crash_verdict(ctx, rev, oom, "candidate step")
    assert (v.status, v.reason) == ("rejected", "crashed")
    assert v.summary == "candidate step ran out of memory: CUDA out of memory. Tried to allocate 2 GiB"
    assert v.crash["log_tail"].endswith("OutOfMemoryError") and v.crash["log"] == "/r/candidate.log"
    assert (v.candidate, v.candidate_sha, v.trailers) == ("x.patch", "c" * 40, {"Optbot-Kind": ["k"]})
    assert not v.health  # the health probe runs after a fault on CUDA only
    hang = _crash_verdict(ctx, rev, JobOutcome("timeout", seconds=30.4, log_tail="..."), "candidate step")
    assert (hang.reason, hang.summary) == ("timeout", "candidate step timeout after 30 s")
