"""Leave-one-out ablation of a real 2-commit stack on the diffusers engine (CPU, tiny preset)."""
from __future__ import annotations

import git
import pytest

from tests.validate.conftest import ADV


@pytest.mark.slow
def test_ablation_of_two_commit_stack(flux2_cpu, tmp_path):
    from bot.validate.ablate import _revert_worktree, ablate
    from bot.validate.resolve import GIT_ENV, _commit_patch

    sha1, wt = _commit_patch(flux2_cpu.checkout, ADV / "honest_merge_qkv.patch", flux2_cpu.checkout.base_sha)
    repo = git.Repo(wt)
    f = wt / "src/diffusers/models/transformers/transformer_flux2.py"
    f.write_text(f.read_text() + "\n# optbot test: a comment-only commit (contributes nothing)\n")
    repo.git.add("-A")
    repo.git.commit("-q", "--no-verify", "-m", "Comment-only commit", env=GIT_ENV)
    sha2 = repo.head.commit.hexsha
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
