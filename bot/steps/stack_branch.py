"""The stack's branch, for combine (bot/steps/combine.py): the accepted candidates cherry-picked in
order onto the base in a worktree of their own, one commit each, that keeps the candidate's author
and dates (the same candidates give the same shas: a resumed run rebuilds the identical branch),
with a message that says what it changes, why, the numbers that justify it, and git trailers (DESIGN
decision 5) among them the inputs it was proposed with, which a review caveat records."""
from __future__ import annotations

import re
from dataclasses import dataclass

import git

from bot.engine import add_worktree, remove_worktree
from bot.generate.candidate import Candidate
from bot.knowledge import recall
from bot.knowledge.lessons import Proposal
from bot.knowledge.records import patch_file_sha256
from bot.knowledge.review import entry_patch, proposal_trailers, text_sha256
from bot.run.context import RunContext
from bot.steps.baseline import Measurement, measurements
from bot.validate.verdict import Speed, Verdict


@dataclass
class StackCommit:
    candidate_id: str
    sha: str
    subject: str


def _fmt_ms(m: Measurement | None) -> str:
    if m is None:
        return "n/a"
    return f"{m.median_ms:.3f} ms (min {m.min_ms:.3f}, max {m.max_ms:.3f}, N={m.n}, {m.mode}, measured on {m.device}"\
           f"{': ' + m.device_name if m.device_name else ''})"


def proposal(ctx: RunContext, cand: Candidate) -> Proposal:
    """The inputs `cand` is proposed with, for its commit's trailers: what a review caveat records
    when a person declines the pull request (bot/knowledge/review.py). The patch's sha256 is the
    one known.patch_sha256 gives for the store entry it replays, or will give for the entry the
    learn step makes of it (the candidate's diff against the base)."""
    t = ctx.target
    base = t.checkout.base_sha
    eid = recall.entry_id_of(cand.trailers)
    store = ctx.knowledge().kernel_store
    if cand.generator == "replay" and eid and (store / eid / "patch.diff").is_file():
        sha = patch_file_sha256(store / eid / "patch.diff")
    else:
        sha = text_sha256(entry_patch(t.checkout.repo.git.diff(base, cand.commit_sha)))
    return Proposal(candidate=cand.id, entry=eid, kind=cand.kind, patch_sha256=sha, base_sha=base,
                    workload=t.workload.name, engine=t.engine_name or t.workload.default_engine,
                    hardware=ctx.hardware())


def commit_message(cand: Candidate, verdict: Verdict, run_id: str, inputs: Proposal | None = None) -> str:
    subject = cand.title.strip().splitlines()[0][:72] if cand.title else f"optbot: {cand.kind or 'optimization'}"
    body = [subject, ""]
    desc = (cand.description or "").strip()
    # the candidate's own message may repeat its subject and trailers: keep only the prose
    desc_lines = [ln for ln in desc.splitlines() if not re.match(r"^[A-Za-z-]+: ", ln) or not ln.startswith("Optbot-")]
    if desc_lines and desc_lines[0].strip() == subject:
        desc_lines = desc_lines[1:]
    what = "\n".join(desc_lines).strip()
    body += ["What: " + (what or subject), ""]
    why = f"Why: opportunity {cand.opportunity_id or '(none named)'}"
    if cand.kind:
        why += f" of kind {cand.kind}"
    if cand.estimated_gain_ms is not None:
        why += f", estimated gain {cand.estimated_gain_ms:.3f} ms from the profile"
    body += [why + ".", ""]
    m = measurements(verdict)
    body.append(f"Numbers (validator verdict: {verdict.status}: {verdict.reason or 'accepted'}: {verdict.summary}):")
    for s in verdict.speed or [Speed(mode="eager", device=verdict.device)]:  # every production mode timed
        b, c = m.get(f"base_{s.base_mode or s.mode}"), m.get(f"cand_{s.mode}")
        body.append(f"  base      {s.base_mode or s.mode} {_fmt_ms(b)}")
        body.append(f"  candidate {s.mode} {_fmt_ms(c)}" + (f"  ({s.outcome}: {s.note[:160]})" if s.note else ""))
        if b and c and c.median_ms:
            body.append(f"  speedup ({s.mode} median) {b.median_ms / c.median_ms:.3f}x")
    for c in (verdict.correctness.checks if verdict.correctness else [])[:6]:
        shape, _, seed = c.label.partition(" seed ")
        body.append(f"  correctness {c.output} {shape} seed {seed or '?'}: max abs {c.max_abs if c.max_abs is not None else 'n/a'}, "
                    f"rel err {c.rel_l2 if c.rel_l2 is not None else 'n/a'}")
    body.append("")
    trailers = dict(cand.trailers)
    trailers.setdefault("Optbot-Opportunity", cand.opportunity_id or "none")
    trailers.setdefault("Optbot-Kind", cand.kind or "unknown")
    trailers["Optbot-Run"] = run_id
    trailers["Optbot-Candidate"] = cand.id
    trailers["Optbot-Verdict"] = verdict.status
    if inputs is not None:
        trailers.update(proposal_trailers(inputs))
    body += [f"{k}: {v}" for k, v in trailers.items()]
    return "\n".join(body) + "\n"


def build_stack(ctx: RunContext, branch: str, accepted: list[Candidate],
                verdicts: dict[str, Verdict]) -> tuple[list[StackCommit], list[str], str]:
    """Cherry-pick the accepted candidates, in order, onto the base in a worktree of their own;
    point ``branch`` at the result. Returns (commits, dropped, head_sha)."""
    checkout = ctx.target.checkout
    base = checkout.base_sha
    wt_path = add_worktree(checkout, f"stack-{base[:12]}-{ctx.run_id[-6:]}")
    wt = git.Repo(wt_path)
    wt.git.checkout("--detach", "--force", base)
    commits, dropped = [], []
    for cand in accepted:
        src = checkout.repo.commit(cand.commit_sha)
        env = {"GIT_AUTHOR_NAME": src.author.name, "GIT_AUTHOR_EMAIL": src.author.email,
               "GIT_AUTHOR_DATE": src.authored_datetime.isoformat(),
               "GIT_COMMITTER_NAME": "optbot", "GIT_COMMITTER_EMAIL": "optbot@localhost",
               "GIT_COMMITTER_DATE": src.committed_datetime.isoformat()}
        try:
            wt.git.cherry_pick("--no-commit", cand.commit_sha, env=env)
        except git.GitCommandError as e:
            wt.git.reset("--hard", "HEAD")
            try:
                wt.git.cherry_pick("--quit")
            except git.GitCommandError:
                pass
            dropped.append(f"{cand.id}: does not apply on top of the earlier commits ({e.stderr.strip()[:200]})")
            continue
        if not wt.is_dirty(index=True, working_tree=False):
            dropped.append(f"{cand.id}: empty on top of the earlier commits")
            continue
        msg = commit_message(cand, verdicts[cand.id], ctx.run_id, proposal(ctx, cand))
        msg_file = ctx.jobs_dir() / f"commit-{cand.id}.txt"
        msg_file.write_text(msg)
        wt.git.commit("-q", "--no-gpg-sign", "--no-verify", "--cleanup=verbatim", "-F", str(msg_file), env=env)
        commits.append(StackCommit(cand.id, wt.head.commit.hexsha, msg.splitlines()[0]))
    head = wt.head.commit.hexsha
    checkout.repo.git.branch("-f", branch, head)
    remove_worktree(checkout, wt_path)  # the branch holds the result; validators make their own worktrees
    return commits, dropped, head
