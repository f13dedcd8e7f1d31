"""Fixtures of the optimize tests: a GitHub stand-in, a small engine repository with a bare
"GitHub" remote, a knowledge repository with its bare remote, and stages that replace the
measuring steps with fixed numbers (for the forge/resume tests only; see FakeStages)."""
from __future__ import annotations

from pathlib import Path

import git
import pytest

from bot.engine import add_worktree
from bot.optimize.stages import (AnalyzeResult, BaselineResult, CandidateRecord, GenerateResult, LearnResult,
                                 Measurement, ProfileResult, Stages, ValidateResult, VerdictRecord)
from tests.optimize.github_standin import GitHubStandIn

ENGINE_SRC = '''"""A stand-in engine module (the forge tests never import it)."""


def swiglu(x, gate):
    return x * gate


def qkv(x, wq, wk, wv):
    return x @ wq, x @ wk, x @ wv
'''


def _init_repo(path: Path, files: dict[str, str]) -> git.Repo:
    path.mkdir(parents=True)
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "test")
        cw.set_value("user", "email", "test@localhost")
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    repo.git.add("-A")
    repo.git.commit("-qm", "base", env={"GIT_AUTHOR_DATE": "2001-01-01T00:00:00Z",
                                        "GIT_COMMITTER_DATE": "2001-01-01T00:00:00Z"})
    return repo


@pytest.fixture
def standin():
    s = GitHubStandIn().start()
    yield s
    s.stop()


@pytest.fixture
def forge_env(tmp_path, standin, monkeypatch):
    """Engine + knowledge repositories, their bare remotes registered in the stand-in, env set."""
    engine = _init_repo(tmp_path / "engine", {"src/engine_mod.py": ENGINE_SRC})
    engine_bare = tmp_path / "engine.git"
    git.Repo.init(engine_bare, bare=True, initial_branch="main")
    engine.create_remote("origin", str(engine_bare))
    engine.git.push("origin", "main")
    know = _init_repo(tmp_path / "knowledge", {"lessons/README.md": "lessons\n", "kernel_store/README.md": "store\n"})
    know_bare = tmp_path / "knowledge.git"
    git.Repo.init(know_bare, bare=True, initial_branch="main")
    know.create_remote("origin", str(know_bare))
    know.git.push("origin", "main")
    standin.add_repo("team/engine", engine_bare)
    standin.add_repo("team/optbot", know_bare)
    trig = standin.add_pull_for_trigger("team/engine")
    comment = standin.add_comment("team/engine", trig, "/optimize flux2")
    monkeypatch.setenv("OPTBOT_GITHUB_TOKEN", "test-token")
    monkeypatch.setenv("OPTBOT_GITHUB_API_URL", standin.base)
    monkeypatch.setenv("OPTBOT_GITHUB_WRITE_DELAY", "0")
    monkeypatch.setenv("OPTBOT_GITHUB_MAX_WAIT", "3")
    monkeypatch.setenv("OPTBOT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("OPTBOT_ABORT_AFTER", raising=False)
    return {"engine": engine, "engine_bare": engine_bare, "knowledge": know, "knowledge_bare": know_bare,
            "trigger_pr": trig, "trigger_comment": comment, "tmp": tmp_path}


def fake_measure(ms: float) -> Measurement:
    return Measurement(device="cpu", device_name="fixed number of a test double", mode="eager", median_ms=ms,
                       min_ms=ms * 0.98, max_ms=ms * 1.03, stdev_ms=ms * 0.01, n=5)


class FakeStages(Stages):
    """Replaces baseline, profile, analyze, generate, validate and learn with test doubles.

    For the forge and resume tests only: what they test is the orchestration (state, resume), the
    git stack (real cherry-picks of real commits) and delivery (real PyGithub over HTTP to the
    stand-in, real pushes to bare repositories). The numbers here are fixed inputs, labelled
    "fixed number of a test double"; no test treats them as measurements. checkout, combine and
    deliver are the real stages. The end-to-end test (test_e2e.py) uses the real stages throughout.
    """

    def __init__(self, knowledge: Path):
        self.knowledge = Path(knowledge)

    def baseline(self, ctx):
        return BaselineResult("done", fake_measure(10.0), None, "test double", [], {"device_kind": "cpu",
                              "device_name": "test double"}, "")

    def profile(self, ctx):
        return ProfileResult("done", "cpu", 10.0, {"gemm": 6.0, "elementwise": 4.0}, [], 12, "", {})

    def analyze(self, ctx):
        return AnalyzeResult("done", "2 opportunities", [
            {"kind": "merge-siblings", "module": "blocks.*.attn", "estimated_gain_ms": 1.0},
            {"kind": "fuse-elementwise-chain", "module": "blocks.*.ff", "estimated_gain_ms": 0.5}])

    def generate(self, ctx):
        t = self.target(ctx)
        cands = []
        edits = [("c1", "Merge the Q/K/V projections into one GEMM", "merge-siblings",
                  "def qkv(x, wq, wk, wv):\n    return x @ wq, x @ wk, x @ wv\n",
                  "def qkv(x, wq, wk, wv):\n    import torch\n    w = torch.cat([wq, wk, wv], 1)  # [D, 3D]\n"
                  "    return (x @ w).chunk(3, -1)\n"),
                 ("c2", "Fuse the SwiGLU product", "fuse-elementwise-chain",
                  "def swiglu(x, gate):\n    return x * gate\n",
                  "def swiglu(x, gate):\n    return x.mul_(gate)  # in place: one pass\n")]
        for cid, title, kind, old, new in edits:
            wt = add_worktree(t.checkout, f"test-cand-{ctx.run_id}-{cid}")
            f = wt / "src" / "engine_mod.py"
            f.write_text(f.read_text().replace(old, new))
            r = git.Repo(wt)
            r.git.add("-A")
            msg = f"{title}\n\nA test candidate.\n\nOptbot-Opportunity: {kind}@blocks\nOptbot-Kind: {kind}\n"
            r.git.commit("-qm", msg, env={"GIT_AUTHOR_DATE": "2001-01-02T00:00:00Z",
                                          "GIT_COMMITTER_DATE": "2001-01-02T00:00:00Z"})
            cands.append(CandidateRecord(cid, title, r.head.commit.hexsha, str(wt), "test-double", kind,
                                         f"{kind}@blocks", "A test candidate.", {}, 1.0))
        return GenerateResult("done", "2 candidates", cands)

    def validate(self, ctx):
        vs = [VerdictRecord(c["id"], "accepted", "faster, correct (test double)", "cpu", fake_measure(10.0),
                            fake_measure(9.0), correctness=[{"output": "noise_pred", "shape": [1, 16, 4], "seed": s,
                                                             "max_abs": 1e-6, "max_rel": 1e-5, "ok": True}
                                                            for s in (0, 1, 2)])
              for c in ctx.results["generate"]["candidates"]]
        return ValidateResult("done", "2 of 2 accepted", vs)

    def _validator(self):
        return self.verdict_of  # "a validator is installed"

    def verdict_of(self, ctx, ref, cid, device):
        return VerdictRecord(cid, "accepted", "stack test double", "cpu", fake_measure(10.0), fake_measure(8.2))

    def ablate(self, ctx, res):
        return [], "ablation not run (test double)"

    def learn(self, ctx):
        rel = f"lessons/test-{ctx.results['checkout']['base_sha'][:8]}.md"
        (self.knowledge / rel).write_text("---\nkind: pattern\n---\nmerging siblings helped (test)\n")
        return LearnResult("done", "0 entries, 1 lesson", str(self.knowledge), [rel], [], [rel])
