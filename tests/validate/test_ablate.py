"""Leave-one-out ablation of a real 2-commit stack on the diffusers engine (CPU, tiny preset)."""
from __future__ import annotations

import json

import git
import pytest

from tests.validate.conftest import ADV


def _two_commit_stack(target, comment: str, subject: str):
    """(sha of the merged-QKV commit on the base, sha of a comment-only commit on it, the edited file)."""
    from bot.validate.resolve import GIT_ENV, _commit_patch

    sha1, wt = _commit_patch(target.checkout, ADV / "honest_merge_qkv.patch", target.checkout.base_sha)
    repo = git.Repo(wt)
    f = wt / "src/diffusers/models/transformers/transformer_flux2.py"
    f.write_text(f.read_text() + f"\n# optbot test: {comment}\n")
    repo.git.add("-A")
    repo.git.commit("-q", "--no-verify", "-m", subject, env=GIT_ENV)
    return sha1, repo.head.commit.hexsha, f


@pytest.mark.slow
def test_ablation_of_two_commit_stack(flux2_cpu, tmp_path):
    from bot.validate.ablate import _revert_worktree, ablate

    sha1, sha2, f = _two_commit_stack(flux2_cpu, "a comment-only commit (contributes nothing)", "Comment-only commit")
    wt = f.parents[4]
    ab = ablate(flux2_cpu, sha2, rounds=1, iters=2, run_dir=tmp_path)
    text = ab.render()
    assert [r.sha for r in ab.rows] == [sha1, sha2], text
    assert ab.base_ms and ab.stack_ms, text
    assert all(r.without_ms is not None and r.contribution_ms is not None for r in ab.rows), text
    assert "leave-one-out" in text and "measured on cpu" in text and "Comment-only commit" in text
    # the variant without commit 1 was timed, and it really is the stack with commit 1 reverted:
    # the comment of commit 2 is there, the merged projection of commit 1 is not
    assert any(p.name.startswith(sha1[:12]) for p in tmp_path.iterdir()), list(tmp_path.iterdir())
    minus1, _ = _revert_worktree(flux2_cpu, sha2, sha1)  # the same worktree, reused
    repo1 = git.Repo(minus1)
    assert repo1.head.commit.parents[0].hexsha == sha2
    text1 = (minus1 / f.relative_to(wt)).read_text()
    assert "comment-only commit" in text1 and "def optbot_after_load" not in text1
    assert "def optbot_after_load" in f.read_text()


@pytest.mark.slow
def test_an_ablation_stopped_between_rounds_goes_on_from_its_kept_rounds(flux2_cpu, tmp_path):
    """The pause check between rounds stops the ablation after round 1 with that round kept in
    rounds.json; the next call (a resumed attempt) times round 2 only and reports both. Round 1's
    runner processes are not run again: their logs are the first call's."""
    from bot.run.context import Paused
    from bot.validate.ablate import ablate

    sha1, sha2, _ = _two_commit_stack(flux2_cpu, "a second commit, for a stack of two", "Second commit")

    asked = []

    def pause(before):
        asked.append(before)
        raise Paused(before)

    with pytest.raises(Paused):
        ablate(flux2_cpu, sha2, rounds=2, iters=1, run_dir=tmp_path, between_rounds=pause)
    assert asked == ["ablation round 2/2"]
    kept = json.loads((tmp_path / "rounds.json").read_text())
    assert kept["done"] == 1 and kept["mode"] == "eager"
    assert set(kept["variants"]) == {"base", "stack", sha1, sha2}
    assert all(len(v) == 1 for v in kept["medians"].values()), kept
    r0 = {p.parent.name: p.stat().st_mtime_ns for p in tmp_path.glob("*-r0/timing.log")}
    assert len(r0) == 4 and not list(tmp_path.glob("*-r1"))

    said = []
    ab = ablate(flux2_cpu, sha2, rounds=2, iters=1, run_dir=tmp_path, between_rounds=pause, log=said.append)
    assert said[0] == "ablation: 1 round(s) kept from an earlier attempt on " + kept["device_name"]
    assert asked == ["ablation round 2/2"]  # round 2 is the first of this call: no pause check before it
    assert {p.parent.name: p.stat().st_mtime_ns for p in tmp_path.glob("*-r0/timing.log")} == r0
    assert len(list(tmp_path.glob("*-r1/timing.log"))) == 4
    done = json.loads((tmp_path / "rounds.json").read_text())
    assert done["done"] == 2 and all(v[0] == kept["medians"][k][0] and len(v) == 2 for k, v in done["medians"].items())
    assert ab.base_ms == pytest.approx(sum(done["medians"]["base"]) / 2)
    assert all(r.contribution_ms is not None for r in ab.rows), ab.render()


def test_kept_rounds_of_another_stack_mode_or_gpu_are_not_used(tmp_path, monkeypatch):
    """rounds.json stands only for the same variants at the same shas, in the same mode, on a GPU of
    the same name; anything else starts afresh, and a broken file is no error."""
    from bot.validate import ablate as ab

    variants = {"base": "b" * 40, "stack": "s" * 40, "1" * 40: "v" * 40}
    monkeypatch.setattr(ab, "_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    r = ab._Rounds.load(tmp_path, "graph", variants)
    assert r.done == 0 and r.medians == {k: [] for k in variants}
    r.device_name, r.done = "NVIDIA H100 80GB HBM3", 1
    r.medians = {"base": [204.2], "stack": [196.4], "1" * 40: [199.0]}
    r.notes = {"1" * 40: "graph timing: capture failed"}
    r.save()
    again = ab._Rounds.load(tmp_path, "graph", variants)
    assert (again.done, again.medians, again.notes, again.seed, again.weight_seed) == (
        1, r.medians, r.notes, r.seed, r.weight_seed)
    assert ab._Rounds.load(tmp_path, "eager", variants).done == 0
    assert ab._Rounds.load(tmp_path, "graph", {**variants, "stack": "t" * 40}).done == 0
    monkeypatch.setattr(ab, "_gpu_name", lambda: "NVIDIA H200")
    assert ab._Rounds.load(tmp_path, "graph", variants).done == 0
    (tmp_path / "rounds.json").write_text("{not json")
    assert ab._Rounds.load(tmp_path, "graph", variants).done == 0
    (tmp_path / "rounds.json").write_text(json.dumps({"mode": "graph", "variants": variants, "done": 1}))
    assert ab._Rounds.load(tmp_path, "graph", variants).done == 0  # no seeds: not this code's whole file


def test_an_unknown_mode_is_refused_before_any_work(flux2_cpu, tmp_path):
    from bot.validate.ablate import ablate

    with pytest.raises(ValueError, match="unknown mode 'graphs'"):
        ablate(flux2_cpu, "HEAD", rounds=1, run_dir=tmp_path, mode="graphs")
    assert not list(tmp_path.iterdir())


def test_optbot_ablate_refuses_a_bad_mode_with_exit_2(flux2_cpu, cli_runner):
    """`optbot ablate --mode`: an unknown mode, and a graph mode where no GPU runs the rounds, are refused
    before anything runs, with the option named and no traceback."""
    from bot.cli import cli

    r = cli_runner.invoke(cli, ["ablate", "flux2", "--device", "cpu", "--candidate", "HEAD", "--mode", "graphs"])
    assert r.exit_code == 2 and "Invalid value for --mode: unknown mode 'graphs'" in r.output, r.output
    r = cli_runner.invoke(cli, ["ablate", "flux2", "--device", "cpu", "--candidate", "HEAD", "--mode", "compile+graph"])
    assert r.exit_code == 2, r.output
    assert "Invalid value for --mode: compile+graph captures a CUDA graph: it needs --device cuda (this run is on cpu)" \
        in r.output
    assert "Traceback" not in r.output
