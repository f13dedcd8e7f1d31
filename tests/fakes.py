"""Test doubles for the measuring steps of `optbot optimize`, built from the real result types.

For the orchestration, resume and delivery tests only: what they test is the run machinery (state,
resume, pause), the git stack (real cherry-picks of real commits) and delivery (real PyGithub over
HTTP to the stand-in, real pushes to bare repositories). The numbers here are fixed inputs,
labelled "fixed number of a test double"; no test treats them as measurements. checkout, combine
and deliver are the real steps; the end-to-end test (tests/commands/test_optimize.py) runs every
real step.
"""
from __future__ import annotations

from pathlib import Path

import git

from bot.analyze.opportunity import Estimate, Location, Opportunity
from bot.engine import add_worktree
from bot.generate.candidate import Candidate
from bot.knowledge.lessons import write_lesson
from bot.steps import analyze, baseline, generate, learn, profile, validate
from bot.steps.baseline import Measurement
from bot.validate.verdict import Correctness, OutputCheck, Speed, Verdict

DOUBLE = "fixed number of a test double"


def fake_measure(ms: float) -> Measurement:
    return Measurement(device="cpu", device_name=DOUBLE, mode="eager", median_ms=ms, min_ms=ms * 0.98,
                       max_ms=ms * 1.03, stdev_ms=ms * 0.01, n=5)


def fake_verdict(t, ref: str, cid: str, base_ms: float, cand_ms: float, summary: str = "test double") -> Verdict:
    """An accepted Verdict as the validator would return it for `ref`, with fixed numbers."""
    sha = t.checkout.repo.commit(ref).hexsha
    checks = [OutputCheck(label=f"16x16/txt4/b1 seed {s}", output="noise_pred", ok=True, reason="within tolerance",
                          max_abs=1e-6, rel_l2=1e-5) for s in (1, 2, 3)]
    return Verdict(status="accepted", reason=None, summary=summary, workload=t.workload.name, preset=t.preset,
                   device=t.device, dtype=t.dtype, base_sha=t.checkout.base_sha, candidate_sha=sha, candidate=cid,
                   correctness=Correctness(ok=True, seeds=[1, 2, 3], shapes=["16x16/txt4/b1"], rule="test double",
                                           checks=checks),
                   speed=[Speed(mode="eager", device="cpu", base_ms=[base_ms, base_ms], candidate_ms=[cand_ms, cand_ms],
                                speedup=round(base_ms / cand_ms, 4), noise_pct=2.0, outcome="faster", n=5)],
                   env={"device_kind": "cpu", "device_name": DOUBLE})


def stack_validator(t, ref, base, opts):
    """The validator double for the stack (combine): the stack is accepted, 10.0 -> 8.2 ms."""
    return fake_verdict(t, ref, opts.run_dir.name, 10.0, 8.2, "stack test double")


def opportunity(kind: str, module: str = "blocks.*", gain: float = 1.0, id: str = "") -> Opportunity:
    """An Opportunity as analyze makes it, with fixed numbers."""
    return Opportunity(id=id or f"{kind}@blocks", kind=kind, detail="", summary=f"{kind} in {module}",
                       location=Location(module, [module.replace("*", "0")], "src/engine_mod.py", 1, 2),
                       ops=[], op_ids=[], gain_ms=gain, gain_pct=10 * gain, confidence=0.5, confidence_reason="test",
                       generator="agent", estimate=Estimate(gain, 10 * gain, "test double", "cpu", 10.0))


EDITS = [("c1", "Merge the Q/K/V projections into one GEMM", "merge-siblings",
          "def qkv(x, wq, wk, wv):\n    return x @ wq, x @ wk, x @ wv\n",
          "def qkv(x, wq, wk, wv):\n    import torch\n    w = torch.cat([wq, wk, wv], 1)  # [D, 3D]\n"
          "    return (x @ w).chunk(3, -1)\n"),
         ("c2", "Fuse the SwiGLU product", "fuse-elementwise-chain",
          "def swiglu(x, gate):\n    return x * gate\n",
          "def swiglu(x, gate):\n    return x.mul_(gate)  # in place: one pass\n")]


def fake_steps(knowledge: Path) -> dict:
    """baseline, profile, analyze, generate, validate and learn replaced; `knowledge` is where the
    learn double writes its lesson (a real lesson file that parses)."""

    def fake_baseline(ctx):
        return baseline.Result("done", fake_measure(10.0), None, "test double", [],
                               {"device_kind": "cpu", "device_name": DOUBLE}, "")

    def fake_profile(ctx):
        return profile.Result("done", "cpu", 10.0, {"gemm": 6.0, "elementwise": 4.0}, [], 12, "", {})

    def fake_analyze(ctx):
        return analyze.Result("done", "2 opportunities", [opportunity("merge-siblings", "blocks.*.attn", 1.0),
                                                          opportunity("fuse-elementwise-chain", "blocks.*.ff", 0.5)])

    def fake_generate(ctx):
        t = ctx.target
        res = generate.Result("done", "2 candidates")
        for cid, title, kind, old, new in EDITS:
            wt = add_worktree(t.checkout, f"test-cand-{ctx.run_id}-{cid}")
            f = wt / "src" / "engine_mod.py"
            f.write_text(f.read_text().replace(old, new))
            r = git.Repo(wt)
            r.git.add("-A")
            msg = f"{title}\n\nA test candidate.\n\nOptbot-Opportunity: {kind}@blocks\nOptbot-Kind: {kind}\n"
            r.git.commit("-qm", msg, env={"GIT_AUTHOR_DATE": "2001-01-02T00:00:00Z",
                                          "GIT_COMMITTER_DATE": "2001-01-02T00:00:00Z"})
            res.candidates.append(Candidate(id=cid, opportunity_id=f"{kind}@blocks", kind=kind, generator="test-double",
                                            worktree=str(wt), commit_sha=r.head.commit.hexsha,
                                            base_sha=t.checkout.base_sha, title=title, description=msg,
                                            trailers={"Optbot-Opportunity": f"{kind}@blocks", "Optbot-Kind": kind},
                                            estimated_gain_ms=1.0))
        return res

    def fake_validate(ctx):
        return validate.Result("done", "2 of 2 accepted", {
            c.id: fake_verdict(ctx.target, c.commit_sha, c.id, 10.0, 9.0, "faster, correct (test double)")
            for c in ctx.results.generate.candidates})

    def fake_learn(ctx):
        f = write_lesson(Path(knowledge) / "lessons", f"test-{ctx.results.checkout.base_sha[:8]}", "pattern",
                         {"pattern": "merge-siblings"}, [ctx.run_id], "low", "Merging siblings helped (test double).")
        rel = str(f.relative_to(knowledge))
        return learn.Result("done", "0 entries, 1 lesson", str(knowledge), [rel], [], [rel])

    return {"baseline": fake_baseline, "profile": fake_profile, "analyze": fake_analyze, "generate": fake_generate,
            "validate": fake_validate, "learn": fake_learn}
