"""Target.job: every runner job of a target is assembled in one place, with the same defaults."""
from __future__ import annotations

import git

from bot.engine import EngineCheckout
from bot.paths import REPO_ROOT
from bot.target import Target
from bot.workload import load_workload
from runner.job import Job


def _target(tmp_path) -> Target:
    wl = load_workload("flux2")
    co = EngineCheckout("diffusers", tmp_path / "repo", "a" * 40, "HEAD", "src")
    return Target(wl, "diffusers", "diffusers.M", co, "tiny", "cpu", "float32")


def test_a_job_carries_the_target_and_the_engine_in_the_worktree(tmp_path):
    t = _target(tmp_path)
    wt = tmp_path / "wt"
    (wt / "src").mkdir(parents=True)
    job = t.job("profile", wt, tmp_path / "out", engine_sha="b" * 40, iters=3)
    assert (job.kind, job.preset, job.device, job.dtype, job.model_class) == ("profile", "tiny", "cpu", "float32", "diffusers.M")
    assert job.workload == t.workload.to_json()
    assert job.engine_root == str((wt / "src").resolve()) and job.engine_sha == "b" * 40
    assert job.shapes == [{"resolution": [256, 256], "text_tokens": 32, "batch": 1}]  # the preset's shape
    assert (job.seeds, job.weight_seed, job.warmup, job.iters) == ([0], 0, 2, 3)
    assert job.out_dir == str(tmp_path / "out") and job.params == {} and job.save_outputs
    job.to_file(tmp_path / "job.json")
    back = Job.from_file(tmp_path / "job.json")  # a job the runner accepts, its shapes JSON already
    assert (back.kind, back.shapes, back.engine_root) == (job.kind, job.shapes, job.engine_root)


def test_the_sha_defaults_to_the_worktrees_head(tmp_path):
    wt = tmp_path / "wt"
    (wt / "src").mkdir(parents=True)
    (wt / "src" / "m.py").write_text("x = 1\n")
    repo = git.Repo.init(wt)
    repo.git.add("-A")
    repo.git.commit("-qm", "c", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                      "GIT_COMMITTER_EMAIL": "t@t"})
    assert _target(tmp_path).job("step", wt, tmp_path / "out").engine_sha == repo.head.commit.hexsha


def test_shapes_seeds_and_device_can_be_given(tmp_path):
    t = _target(tmp_path)
    extra = t.workload.preset("tiny").extra_shapes
    job = t.job("compare", None, tmp_path, shapes=extra, seeds=(7, 8), weight_seed=5, device="cuda:1",
                params={"pairs": []})
    assert job.shapes == [s.to_json() for s in extra] and job.seeds == [7, 8] and job.weight_seed == 5
    assert job.device == "cuda:1" and job.params == {"pairs": []}
    # no worktree: a process that imports no engine
    assert (job.engine_root, job.engine_sha, job.model_class) == (str(REPO_ROOT), "", "")
