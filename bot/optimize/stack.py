"""The optimization branch: accepted candidates cherry-picked onto the base, one commit each.

Branch name: ``optbot/<workload>/<base-sha12>`` in the engine repository (stable across runs, so a
later run updates the same branch and pull request). Each commit keeps the candidate's author and
dates, so the same candidates and numbers always give the same commit shas (a resumed run rebuilds
the identical branch). Its message says what it changes, why, and the numbers that justify it,
followed by git trailers (DESIGN decision 5).
"""
from __future__ import annotations

import re

import git

from bot.engine import EngineCheckout, add_worktree, remove_worktree


def _fmt_ms(m) -> str:
    if m is None:
        return "n/a"
    return f"{m.median_ms:.3f} ms (min {m.min_ms:.3f}, max {m.max_ms:.3f}, N={m.n}, {m.mode}, measured on {m.device}"\
           f"{': ' + m.device_name if m.device_name else ''})"


def commit_message(cand, verdict, run_id: str) -> str:
    subject = cand.title.strip().splitlines()[0][:72] if cand.title else f"optbot: {cand.kind or 'optimization'}"
    body = [subject, ""]
    desc = (cand.description or "").strip()
    # the candidate's own message may repeat its subject and trailers: keep only the prose
    desc_lines = [ln for ln in desc.splitlines() if not re.match(r"^[A-Za-z-]+: ", ln) or not ln.startswith("Optbot-")]
    if desc_lines and desc_lines[0].strip() == subject:
        desc_lines = desc_lines[1:]
    what = "\n".join(desc_lines).strip()
    body += ["What: " + (what or subject), ""]
    why = f"Why: opportunity {cand.opportunity or '(none named)'}"
    if cand.kind:
        why += f" of kind {cand.kind}"
    if cand.estimated_gain_ms is not None:
        why += f", estimated gain {cand.estimated_gain_ms:.3f} ms from the profile"
    body += [why + ".", ""]
    body.append(f"Numbers (validator verdict: {verdict.status}: {verdict.reason}):")
    body.append(f"  base      eager {_fmt_ms(verdict.base_eager)}")
    body.append(f"  candidate eager {_fmt_ms(verdict.cand_eager)}")
    if verdict.base_graph or verdict.cand_graph:
        body.append(f"  base      graph {_fmt_ms(verdict.base_graph)}")
        body.append(f"  candidate graph {_fmt_ms(verdict.cand_graph)}")
    if verdict.speedup:
        body.append(f"  speedup (eager median) {verdict.speedup:.3f}x")
    for c in verdict.correctness[:6]:
        body.append(f"  correctness {c.get('output', '?')} {c.get('shape', '')} seed {c.get('seed', '?')}: "
                    f"max abs {c.get('max_abs', 'n/a')}, rel err {c.get('max_rel', 'n/a')}")
    body.append("")
    trailers = dict(cand.trailers)
    trailers.setdefault("Optbot-Opportunity", cand.opportunity or "none")
    trailers.setdefault("Optbot-Kind", cand.kind or "unknown")
    trailers["Optbot-Run"] = run_id
    trailers["Optbot-Candidate"] = cand.id
    trailers["Optbot-Verdict"] = verdict.status
    body += [f"{k}: {v}" for k, v in trailers.items()]
    return "\n".join(body) + "\n"


def build_stack(checkout: EngineCheckout, branch: str, accepted: list, verdicts: dict, ctx):
    """Cherry-pick the accepted candidates, in order, onto the base in a worktree of their own;
    point ``branch`` at the result. Returns (commits, dropped, head_sha)."""
    from bot.optimize.stages import StackCommit

    base = checkout.base_sha
    wt_path = add_worktree(checkout, f"stack-{base[:12]}-{ctx.run_id[-6:]}")
    wt = git.Repo(wt_path)
    wt.git.checkout("--detach", "--force", base)
    commits, dropped = [], []
    for cand in accepted:
        src = checkout.repo.commit(cand.sha)
        env = {"GIT_AUTHOR_NAME": src.author.name, "GIT_AUTHOR_EMAIL": src.author.email,
               "GIT_AUTHOR_DATE": src.authored_datetime.isoformat(),
               "GIT_COMMITTER_NAME": "optbot", "GIT_COMMITTER_EMAIL": "optbot@localhost",
               "GIT_COMMITTER_DATE": src.committed_datetime.isoformat()}
        try:
            wt.git.cherry_pick("--no-commit", cand.sha, env=env)
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
        msg = commit_message(cand, verdicts[cand.id], ctx.run_id)
        msg_file = ctx.run_dir / "jobs" / f"commit-{cand.id}.txt"
        msg_file.parent.mkdir(parents=True, exist_ok=True)
        msg_file.write_text(msg)
        wt.git.commit("-q", "--no-gpg-sign", "--no-verify", "--cleanup=verbatim", "-F", str(msg_file), env=env)
        commits.append(StackCommit(cand.id, wt.head.commit.hexsha, msg.splitlines()[0]))
    head = wt.head.commit.hexsha
    checkout.repo.git.branch("-f", branch, head)
    remove_worktree(checkout, wt_path)  # the branch holds the result; validators make their own worktrees
    return commits, dropped, head
