"""Leave-one-out ablation of a real 2-commit stack on the diffusers engine (CPU, tiny preset)."""
from __future__ import annotations

import git
import pytest

from tests.validate.conftest import ADV


@pytest.mark.slow
def test_ablation_of_two_commit_stack(flux2_cpu, tmp_path):
    from bot.validate.ablate import ablate
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
    # the revert really removed commit 1 in its variant: that worktree has no merged projection
    minus1 = [p for p in (tmp_path).iterdir() if p.name.startswith(sha1[:12])]
    assert minus1, list(tmp_path.iterdir())
