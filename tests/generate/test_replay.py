"""Store replay on real git worktrees of the diffusers engine: commits with trailers, stacking,
and a conflict that is recorded, not raised."""
from __future__ import annotations

import subprocess

import git
import pytest

from bot.engine import add_worktree
from bot.generate.candidate import TRAILER_KEYS
from bot.generate.replay import apply_entry, match, replay
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry, load_store
from bot.trailers import parse_trailers, trailer_values
from tests.fakes import opportunity

OPPS = [opportunity(kind, id=oid) for oid, kind in (("opp-3", "fuse-elementwise-chain"), ("opp-1", "attention-waste"),
                                                    ("opp-2", "attention-waste"), ("opp-9", "launch-bound"),
                                                    ("opp-4", "absorb-bias"), ("opp-5", "hoist-constant"))]
QWEN_SEEDS = ("qwen-image-drop-all-ones-mask", "qwen-image-cfg-modulation-cache", "qwen-image-absorb-bias",
              "qwen-image-qkv-norm-rope-epilogue", "qwen-image-hoist-host-copies")


def test_match_by_kind_engine_hardware_workload():
    pairs = {(e.id, o) for e, o in match(load_store(SHIPPED_STORE), OPPS, "diffusers", "h200", "flux2")}
    assert pairs == {("flux2-swiglu", "opp-3"), ("flux2-qk-rmsnorm-rope", "opp-1"),
                     ("flux2-qkv-norm-rope-epilogue", "opp-1")}
    # by engine: the SGLang entry matches SGLang's FLUX.2 on the GPU it targets, nothing else
    assert {(e.id, o) for e, o in match(load_store(SHIPPED_STORE), OPPS, "sglang", "h200", "flux2")} == {
        ("sglang-flux2-cudnn-attention", "opp-1")}
    assert match(load_store(SHIPPED_STORE), OPPS, "sglang", "cpu", "flux2") == []
    assert match(load_store(SHIPPED_STORE), OPPS, "sglang", "h200", "qwen-image") == []
    assert {(e.id, o) for e, o in match(load_store(SHIPPED_STORE), OPPS, "diffusers", "h200", "qwen-image")} == {
        ("qwen-image-drop-all-ones-mask", "opp-1"), ("qwen-image-qkv-norm-rope-epilogue", "opp-1"),
        ("qwen-image-absorb-bias", "opp-4"), ("qwen-image-hoist-host-copies", "opp-5")}


def test_replay_commits_candidates_with_trailers(diffusers_engine):
    results = replay(diffusers_engine, OPPS, "diffusers", "h200", workload="flux2", store_root=SHIPPED_STORE)
    assert [r.status for r in results] == ["applied"] * 3, [r.reason for r in results]
    for r in results:
        c = r.candidate
        repo = git.Repo(c.worktree)
        head = repo.head.commit
        assert head.hexsha == c.commit_sha and head.parents[0].hexsha == diffusers_engine.base_sha
        trailers = parse_trailers(head.message)
        assert list(trailers) == list(TRAILER_KEYS)
        assert trailers["Optbot-Entry"] == r.entry_id == c.entry_id
        assert trailers["Optbot-Opportunity"] == c.opportunity_id
        assert trailer_values(trailers["Optbot-Adds-Kernels"]) == list(get_entry(r.entry_id, SHIPPED_STORE).adds_kernels)
        assert not repo.is_dirty(untracked_files=True)
        assert any(p.startswith("src/diffusers/models/optbot_kernels/") for p in head.stats.files)


@pytest.mark.parametrize("group", [("flux2-qk-rmsnorm-rope", "flux2-swiglu", "flux2-norm-modulate", "flux2-merge-qkv"),
                                   ("flux2-qkv-norm-rope-epilogue", "flux2-swiglu", "flux2-norm-modulate"),
                                   QWEN_SEEDS])
def test_seed_patches_stack(diffusers_engine, group):
    """The seed entries of one workload apply on top of each other (edits at distinct anchors)."""
    onto = None
    for eid in group:
        r = apply_entry(diffusers_engine, get_entry(eid, SHIPPED_STORE), f"opp-{eid}", name=f"test-stack-{eid}", onto=onto)
        assert r.status == "applied", r.reason
        onto = r.candidate.commit_sha
    log = git.Repo(r.worktree).git.log("--format=%s", f"{diffusers_engine.base_sha}..{onto}").splitlines()
    assert len(log) == len(group)


def test_qwen_seed_patches_stack_in_any_order(diffusers_engine):
    """The Qwen-Image entries edit transformer_qwenimage.py at distinct anchors: every entry first,
    last and next to every other (the rotations of the list and of its reverse) applies, and every
    order ends at the same tree. (All 24 permutations of the first four entries took 90 s on 2 cores and
    found nothing more.)"""
    trees = set()
    orders = [QWEN_SEEDS[i:] + QWEN_SEEDS[:i] for i in range(len(QWEN_SEEDS))]
    orders += [tuple(reversed(o)) for o in orders]
    for n, order in enumerate(orders):
        onto = None
        for eid in order:
            r = apply_entry(diffusers_engine, get_entry(eid, SHIPPED_STORE), f"opp-{eid}", name=f"test-qwen-order{n}-{eid}", onto=onto)
            assert r.status == "applied", (order, r.reason)
            onto = r.candidate.commit_sha
        trees.add(git.Repo(r.worktree).head.commit.tree.hexsha)
    assert len(trees) == 1


@pytest.mark.parametrize("first", ["flux2-merge-qkv", "flux2-qk-rmsnorm-rope"])
def test_epilogue_entry_conflicts_with_what_it_supersedes(diffusers_engine, first):
    """flux2-qkv-norm-rope-epilogue rewrites the code these entries change (its entry.yaml says so):
    stacked on either, replay records a conflict on transformer_flux2.py instead of a broken commit."""
    r = apply_entry(diffusers_engine, get_entry(first, SHIPPED_STORE), "opp-a", name=f"test-supersede-{first}")
    assert r.status == "applied", r.reason
    c = apply_entry(diffusers_engine, get_entry("flux2-qkv-norm-rope-epilogue", SHIPPED_STORE), "opp-b",
                    name=f"test-supersede-{first}-epilogue", onto=r.candidate.commit_sha)
    assert c.status == "conflict", c.reason
    assert "src/diffusers/models/transformers/transformer_flux2.py" in c.conflicts


def test_conflict_is_recorded_not_fatal(diffusers_engine):
    # A base where someone else already rewrote Flux2SwiGLU.forward differently.
    wt = add_worktree(diffusers_engine, "test-conflict-base")
    f = wt / "src/diffusers/models/transformers/transformer_flux2.py"
    text = f.read_text()
    old = "        x = self.gate_fn(x[..., :half]) * x[..., half:]\n"
    assert old in text
    f.write_text(text.replace(old, "        x = torch.nn.functional.silu(x[..., :half]) * x[..., half:]  # changed upstream\n"))
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "upstream change"], cwd=wt, check=True)
    onto = git.Repo(wt).head.commit.hexsha
    r = apply_entry(diffusers_engine, get_entry("flux2-swiglu", SHIPPED_STORE), "opp-3", name="test-conflict", onto=onto)
    assert r.status == "conflict" and r.candidate is None
    assert "src/diffusers/models/transformers/transformer_flux2.py" in r.conflicts
    assert "does not apply" in r.reason
    repo = git.Repo(r.worktree)
    assert repo.head.commit.hexsha == onto and not repo.is_dirty(untracked_files=True)  # left clean
    assert r.to_json()["status"] == "conflict"
