"""Step 7, combine: the accepted candidates cherry-picked onto the base, one commit each, on the
branch ``optbot/<workload>/<base-sha12>`` (bot/steps/stack_branch.py); the stack validated again as
a whole, then ablated (leave-one-out), unless an earlier run measured the leave-one-out of exactly
this stack.

Members that each passed alone can break the stack together (Qwen-Image on an H100, 2026-12-07: six
members each within rel L2 0.0201 of the base in every mode; together 0.0132 in eager and 0.104
under CUDA graphs, over the 0.05 bound). When the stack fails on correctness or crashes, combine
builds it again member by member, the most valuable first, each addition checked for correctness
in every production mode without timing (`StackCheck`), leaves out each member whose addition
fails, and validates the stack of the members kept as usual. A check an earlier run recorded for
the same stack is taken instead of made (bot/knowledge/known.known_stack_check); the stack that is
delivered is always validated fresh.

The branch is stable across runs (a later run updates the same branch and pull request): its
commits keep the candidates' authors and dates, so the same candidates give the same shas.
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field, replace

import git

from bot.generate.candidate import Candidate
from bot.knowledge import recall
from bot.run.context import RunContext
from bot.run.resume import bundle_candidates, load_checkpoint, save_checkpoint
from bot.steps.stack_branch import StackCommit, build_stack
from bot.steps.validate import tuned_variants, verdict_of
from bot.target import run_label
from bot.validate.ablate import Ablation, AblationRow, ablation_mode
from bot.validate.verdict import Verdict


@dataclass
class StackCheck:
    """One stack of accepted candidates checked whole for correctness (on CUDA in every production
    mode) and engagement, without timing: how combine finds the members that break a stack."""
    candidate_ids: list[str]
    added: str  # the candidate whose addition this check decided; "" for the whole first stack
    head_sha: str
    stack_sha256: str
    status: str  # the validator's: accepted | rejected | held
    reason: str | None
    summary: str
    known_from: str = ""  # the run whose recorded check of the same stack stands for this one

    @property
    def passed(self) -> bool:
        return self.status == "accepted"


# A stack verdict that members interacting can explain, each having passed alone: combine looks for
# the members that break it. ("slower"/"no-change" are the stack's measured worth: it is refused.)
BREAKS = ("correctness", "crashed")


@dataclass
class Result:
    status: str
    branch: str
    base_sha: str
    head_sha: str
    commits: list[StackCommit] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    stack_verdict: Verdict | None = None
    stack_note: str = ""
    ablation: Ablation | None = None  # the leave-one-out: measured in this run, or known (ablation_known_from)
    ablation_note: str = ""
    stack_sha256: str = ""  # sha256 of `git diff base head`: what the stack changes, whatever its commits
    ablation_known_from: str = ""  # run id whose recorded leave-one-out of the same stack was reused
    checks: list[StackCheck] = field(default_factory=list)  # stacks checked to find the members that break it

    def summary(self) -> str:
        return f"{self.branch}: {len(self.commits)} commit(s); {self.stack_note}; {self.ablation_note}"

    @property
    def refused(self) -> bool:
        """The stack was re-validated as a whole and not accepted: each commit passed alone, together
        they are no measured gain, so deliver opens no engine PR (Qwen-Image, H200, 2026-12-03: one
        commit accepted alone at 1.016x, its re-validation 1.012x inside a 1.62% noise band)."""
        return bool(self.commits) and self.stack_verdict is not None and not self.stack_verdict.accepted

    @property
    def delivered(self) -> int:
        """How many optimizations the engine pull request delivers."""
        return 0 if self.refused else len(self.commits)

    def candidate_of(self, sha: str) -> str:
        return next((c.candidate_id for c in self.commits if c.sha == sha), sha[:12])


def branch_name(workload: str, base_sha: str) -> str:
    return f"optbot/{workload}/{base_sha[:12]}"


def run(ctx: RunContext) -> Result:
    t = ctx.target
    cands = ctx.results.generate.by_id() if ctx.results.generate else {}
    verdicts = ctx.results.validate.verdicts if ctx.results.validate else {}
    accepted = [cands[cid] for cid, v in verdicts.items() if v.accepted and cid in cands]
    accepted, superseded = _prefer_tuned(accepted)
    branch = branch_name(run_label(t.workload.name, t.dtype), t.checkout.base_sha)
    commits, dropped, head = build_stack(ctx, branch, accepted, verdicts)
    res = Result("done", branch, t.checkout.base_sha, head, commits, superseded + dropped)
    if not commits:
        res.stack_note = "no accepted optimization: the branch equals the base"
        res.ablation_note = "nothing to ablate"
        return res
    # the stack joins the bundle: a resume on another machine finds the branch
    bundle_candidates(t.checkout.repo, ctx.run_dir, ctx.run_id, [c.commit_sha for c in cands.values()] + [head])
    res.stack_verdict = sv = _stack_verdict(ctx, head, commits, cands, verdicts)
    res.stack_note = (f"stack re-validated: {sv.status} ({sv.reason or 'accepted'}: {sv.summary})"
                      if not sv.reused_from else f"stack: {sv.status}, {sv.reused_from}")
    idle = idle_in_stack(sv, accepted, commits)
    if idle and len(idle) < len(commits):
        # each of these was engaged alone; in the stack another commit took its code path away, so it
        # changes nothing there: rebuild without it and validate that stack (once)
        first = res.stack_note
        keep = [c for c in accepted if c.id not in idle]
        commits, dropped2, head = build_stack(ctx, branch, keep, verdicts)
        res.commits, res.head_sha = commits, head
        res.dropped += [f"{cid}: its declared kernels do not run in the stack ({sv.engagement.reason}): dropped, "
                        "the rest re-validated" for cid in idle] + dropped2
        bundle_candidates(t.checkout.repo, ctx.run_dir, ctx.run_id, [c.commit_sha for c in cands.values()] + [head])
        res.stack_verdict = sv = _stack_verdict(ctx, head)
        res.stack_note = (f"the first stack was {first.removeprefix('stack re-validated: ')}; without "
                          f"{', '.join(idle)}: stack re-validated: {sv.status} ({sv.reason or 'accepted'}: {sv.summary})")
    if breaks(sv) and len(res.commits) > 1:
        head = _repair(ctx, res, branch, accepted, cands, verdicts)
    res.stack_sha256 = stack_diff_sha256(t.checkout.repo, res.base_sha, head)
    res.ablation, res.ablation_note, res.ablation_known_from = _ablate(ctx, res, cands)
    return res


def _stack_verdict(ctx: RunContext, head: str, commits: list[StackCommit] = (),
                   cands: dict[str, Candidate] | None = None, verdicts: dict[str, Verdict] | None = None) -> Verdict:
    """The stack at `head` validated as a whole (a resumed run finds the verdict it took before the stop).
    A stack of one commit whose tree is its candidate's is that candidate's code: its verdict stands
    (one SGLang validation in four modes is ~330 GPU-s). A stack an earlier run's check found broken
    (the same diff, members and keys) is not validated again: it is never delivered."""
    v = load_checkpoint(ctx.run_dir, "stack", head)
    if v is None:
        v = same_tree_verdict(ctx.target.checkout.repo, head, commits, cands or {}, verdicts or {})
    if v is None and len(commits) > 1:
        v = _known_broken(ctx, head, commits, cands or {})
    if v is None:
        ctx.check_pause("validating the stack")
        v = verdict_of(ctx, head, "stack", ctx.target.device)
        save_checkpoint(ctx.run_dir, "stack", head, v)
    return v


def breaks(v: Verdict | None) -> bool:
    """The stack failed in a way its members may cause together (BREAKS)."""
    return v is not None and not v.accepted and v.reason in BREAKS


def value(v: Verdict | None) -> float:
    """What a member is worth for the order it is stacked again in: the geometric mean of its
    speedups over the production modes it was timed in (each is a mode production uses); 1.0 where
    none was timed (on CPU: the candidates' order)."""
    xs = [s.speedup for s in (v.speed if v else []) if s.speedup]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 1.0


def _known_broken(ctx: RunContext, head: str, commits: list[StackCommit], cands: dict[str, Candidate]) -> Verdict | None:
    """The rejection an earlier run's check recorded for exactly this stack, as the stack's verdict."""
    t = ctx.target
    sha = stack_diff_sha256(t.checkout.repo, t.checkout.base_sha, head)
    rec = recall.stack_check(ctx.run_key(), [c.candidate_id for c in commits], cands, sha)
    if rec is None or rec.status == "accepted" or rec.reason not in BREAKS:
        return None
    why = (f"the same stack (diff sha256 {sha[:12]}) was checked by run {rec.run_id} on {rec.hardware} "
           f"(torch {rec.torch}, triton {rec.triton}): {rec.status}, not validated again (--revalidate does)")
    return Verdict(status=rec.status, reason=rec.reason, summary=rec.summary or "", workload=t.workload.name,
                   preset=t.preset, device=t.device, dtype=t.dtype, base_sha=t.checkout.base_sha, candidate_sha=head,
                   candidate="stack", notes=[why], reused_from=why)


def _check(ctx: RunContext, commits: list[StackCommit], head: str, cands: dict[str, Candidate],
           added: str) -> StackCheck:
    """The stack at `head` checked for correctness and engagement, no timing (a check an earlier run
    recorded for the same stack stands for it; a resumed run finds the one it made before the stop)."""
    t = ctx.target
    ids = [c.candidate_id for c in commits]
    sha = stack_diff_sha256(t.checkout.repo, t.checkout.base_sha, head)
    rec = recall.stack_check(ctx.run_key(), ids, cands, sha)
    if rec is not None:
        return StackCheck(ids, added, head, sha, rec.status or "rejected", rec.reason, rec.summary or "",
                          known_from=rec.run_id or "?")
    name = f"stack-check-{head[:12]}"
    v = load_checkpoint(ctx.run_dir, name, head)
    if v is None:
        ctx.check_pause(f"checking the stack with {added}")
        v = verdict_of(ctx, head, name, t.device, speed=False)
        save_checkpoint(ctx.run_dir, name, head, v)
    return StackCheck(ids, added, head, sha, v.status, v.reason, v.summary)


def _repair(ctx: RunContext, res: Result, branch: str, accepted: list[Candidate], cands: dict[str, Candidate],
            verdicts: dict[str, Verdict]) -> str:
    """The stack broke whole though each member passed alone: stack the members again one at a time,
    the most valuable first (`value`), each addition checked (`_check`); a member whose addition
    fails is left out, with the check's reason. Then the stack of the members kept is validated as
    usual. Greedy: N-1 checks for N members, whichever members break it and with whom. Updates
    `res`; returns the new head."""
    sv, first = res.stack_verdict, res.stack_note
    res.checks.append(StackCheck([c.candidate_id for c in res.commits], "", res.head_sha,
                                 stack_diff_sha256(ctx.target.checkout.repo, res.base_sha, res.head_sha),
                                 sv.status, sv.reason, sv.summary, known_from=_run_of(sv.reused_from)))
    in_stack = {c.candidate_id for c in res.commits}
    members = sorted((c for c in accepted if c.id in in_stack), key=lambda c: -value(verdicts.get(c.id)))
    ctx.log(f"the stack of {len(members)} broke whole ({sv.reason}), each member having passed alone: stacking them "
            f"again one at a time, the most valuable first ({', '.join(c.id for c in members)}), "
            f"{len(members) - 1} correctness checks without timing")
    kept = [members[0].id]
    whole = res.checks[-1]
    for i, c in enumerate(members[1:], 1):
        trial = [a for a in accepted if a.id in kept or a.id == c.id]
        commits, not_applied, head = build_stack(ctx, branch, trial, verdicts)
        if c.id not in {sc.candidate_id for sc in commits}:
            res.dropped += [d for d in not_applied if d.startswith(f"{c.id}:")]
            continue
        # every member so far kept: this is the stack that broke, already validated whole
        again = head == whole.head_sha
        chk = (replace(whole, added=c.id, known_from=whole.known_from or ctx.run_id) if again
               else _check(ctx, commits, head, cands, c.id))
        res.checks.append(chk)
        known = (", the whole stack's verdict" if again else
                 f", known from run {chk.known_from}" if chk.known_from else "")
        ctx.log(f"stack check {i} of {len(members) - 1}: {' + '.join(kept)} + {c.id}: {chk.status}"
                f"{f' ({chk.reason})' if chk.reason else ''}{known}")
        if chk.passed:
            kept.append(c.id)
        else:
            res.dropped.append(f"{c.id}: each passed alone, but the stack with it failed ({chk.reason}{known}: "
                               f"{chk.summary[:300]}): left out")
    commits, not_applied, head = build_stack(ctx, branch, [a for a in accepted if a.id in kept], verdicts)
    res.commits, res.head_sha = commits, head
    res.dropped += not_applied
    bundle_candidates(ctx.target.checkout.repo, ctx.run_dir, ctx.run_id, [c.commit_sha for c in cands.values()] + [head])
    res.stack_verdict = sv = _stack_verdict(ctx, head, commits, cands, verdicts)
    res.stack_note = (f"the stack of {len(members)} was {first.removeprefix('stack re-validated: ')}; stacked again "
                      f"one member at a time ({len(members) - 1} correctness checks), {len(kept)} kept: stack "
                      f"re-validated: {sv.status} ({sv.reason or 'accepted'}: {sv.summary})"
                      if not sv.reused_from else
                      f"the stack of {len(members)} was {first.removeprefix('stack re-validated: ')}; stacked again "
                      f"one member at a time, {len(kept)} kept: stack: {sv.status}, {sv.reused_from}")
    return head


def _run_of(reused_from: str) -> str:
    m = re.search(r"by run (\S+)", reused_from or "")
    return m.group(1) if m else ("?" if reused_from else "")


def same_tree_verdict(repo: git.Repo, head: str, commits: list[StackCommit], cands: dict[str, Candidate],
                      verdicts: dict[str, Verdict]) -> Verdict | None:
    """The verdict of the stack's one candidate, relabelled for the stack, when the stack's tree is the
    tree that candidate was validated at against the same base; else None (validate the stack)."""
    if len(commits) != 1:
        return None
    cid = commits[0].candidate_id
    cand, cv = cands.get(cid), verdicts.get(cid)
    if cand is None or cv is None or not cv.accepted:
        return None
    if repo.commit(head).tree.hexsha != repo.commit(cand.commit_sha).tree.hexsha:
        return None
    why = (f"the stack's one commit has candidate {cid}'s tree ({cand.commit_sha[:12]}), whose verdict "
           + (f"({cv.reused_from}) " if cv.reused_from else "(this run) ") + "stands for it: not validated again")
    return replace(cv, candidate_sha=head, candidate=head, notes=[*cv.notes, why], reused_from=why)


def idle_in_stack(v: Verdict, accepted: list[Candidate], commits: list[StackCommit]) -> list[str]:
    """The stack's candidates whose declared kernels its engagement check found idle (declared added,
    never run; declared removed, still running), when that is why the stack was rejected. Each was
    engaged when validated alone, so in the stack another commit takes its code path away (on the CPU,
    2026-12-04: qwen-image-absorb-bias ran the MLP module by module, past the FP8 GELU entry's patch
    of FeedForward.forward)."""
    e = v.engagement
    if v.accepted or e is None or e.ok or not (e.missing or e.still_present):
        return []
    in_stack = {c.candidate_id for c in commits}
    return [c.id for c in accepted if c.id in in_stack
            and (set(c.adds_kernels) & set(e.missing) or set(c.removes_kernels) & set(e.still_present))]


def stack_diff_sha256(repo: git.Repo, base: str, head: str) -> str:
    """The stack's identity for what is known about it: the bytes of its full diff against the base, so
    the same changes reached through other commits (a tuned variant adopted by its entry) match."""
    return hashlib.sha256(repo.git.diff(base, head, "--no-color", "--no-ext-diff", "--full-index").encode()).hexdigest()


def _prefer_tuned(accepted: list[Candidate]) -> tuple[list[Candidate], list[str]]:
    """A variant-search commit is its entry's patch with a tuned config: it and the plain replay add
    the same kernel file, so they cannot both land. When both are accepted the tuned one stays (its
    config won the microbenchmark) and the replay is dropped with that reason, instead of failing
    to cherry-pick later."""
    variant_of = tuned_variants(accepted)
    return ([c for c in accepted if c.id not in variant_of],
            [f"{cid}: superseded by {v.id} (the same entry with its tuned config)" for cid, v in variant_of.items()])


def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _ablate(ctx: RunContext, res: Result, cands: dict[str, Candidate]) -> tuple[Ablation | None, str, str]:
    """(the stack's leave-one-out, a note on it, the run it is known from)."""
    t = ctx.target
    if not ctx.on_cuda:
        # An ablation is a speed attribution. On CPU the Triton kernels run in the interpreter,
        # whose time says nothing about the kernels (DESIGN decision 7: speed needs a GPU).
        return None, ("ablation needs a GPU: on cpu the Triton kernels run in the interpreter, whose timings say "
                      "nothing about them (DESIGN decision 7)"), ""
    if ctx.options.ablation_rounds <= 0:
        return None, "ablation not run (--ablation-rounds 0)", ""
    if len(res.commits) < 2:
        return None, "one commit: its contribution is the stack's verdict (nothing to leave out)", ""
    known = recall.stack_ablation(ctx.run_key(), res.commits, cands, res.stack_sha256, ctx.options.ablation_rounds)
    if known is not None:
        rec, members = known
        ab = Ablation(workload=t.workload.name, preset=t.preset, device=rec.get("device") or t.device,
                      mode=rec.get("mode", "eager"), base_sha=res.base_sha, candidate_sha=res.head_sha,
                      base_ms=rec.get("base_ms"), stack_ms=rec.get("stack_ms"), noise_pct=rec.get("noise_pct"),
                      rounds=int(rec.get("rounds") or 0),
                      rows=[AblationRow(members[r["entry"]].sha, members[r["entry"]].subject, r.get("without_ms"),
                                        r.get("contribution_ms"), r.get("contribution_pct")) for r in rec["rows"]])
        return ab, (f"leave-one-out known from run {rec.get('run_id')} ({ab.mode}, {ab.rounds} rounds on {ab.device}; "
                    f"base {_f(ab.base_ms)} ms, stack {_f(ab.stack_ms)} ms): the same stack (diff sha256 "
                    f"{res.stack_sha256[:12]}), base, preset, dtype, hardware, torch and triton, so not measured "
                    f"again (--revalidate measures it)"), rec.get("run_id", "")
    ctx.check_pause("ablating the stack")
    mode, why = ablation_mode(res.stack_verdict)
    ab = ctx.ablate(t, res.head_sha, res.base_sha, run_dir=ctx.run_dir / "ablation", log=ctx.log,
                    rounds=ctx.options.ablation_rounds, members=[cands[c.candidate_id].commit_sha for c in res.commits],
                    mode=mode, between_rounds=ctx.check_pause)
    note = (f"leave-one-out, {ab.mode} ({why}), {ab.rounds} rounds on {ab.device}; base {_f(ab.base_ms)} ms, stack "
            f"{_f(ab.stack_ms)} ms, round-to-round noise {_f(ab.noise_pct, 1)}%")
    notes = [f"{r.sha[:12]}: {r.note}" for r in ab.rows if r.note]
    return ab, note + ("; " + "; ".join(notes) if notes else ""), ""
