"""Step 9, deliver: the knowledge PR, the engine PR, the dashboard, the reply on the triggering PR, the report.

Order: knowledge first (so the engine PR can link its store entries and lessons), then the engine
PR, then the workload's section of the dashboard (bot/deliver/dashboard.py; a failure there is a
note, never the delivery's loss), then the reply. Each part is idempotent (bot/deliver/github.py), so re-running the whole step
after a kill in the middle of it gives the same branches and pull requests, never duplicates.
The report (markdown + HTML) is always written to the run directory.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from bot.deliver import report as rpt
from bot.deliver.blocks import H, Img, P, to_html, to_markdown
from bot.deliver.pull_request import PullRequestRef, marker
from bot.deliver.knowledge import commit_files_to_branch
from bot.errors import OptbotError
from bot.run.context import RunContext
from bot.run.faults import maybe_abort
from bot.target import run_label


@dataclass
class Result:
    forge: str  # local | github
    dry_run: bool
    engine_branch: str
    engine_head: str
    engine_pr: PullRequestRef
    knowledge_branch: str
    knowledge_pr: PullRequestRef
    trigger_reply: PullRequestRef
    report_md: str
    report_html: str
    chart_png: str
    notes: list[str] = field(default_factory=list)
    dashboard: PullRequestRef = field(default_factory=lambda: PullRequestRef("none"))

    def summary(self) -> str:
        return (f"{self.forge} forge: engine PR {self.engine_pr.action}, knowledge PR {self.knowledge_pr.action}, "
                f"dashboard {self.dashboard.action}")


def knowledge_branch_name(workload: str, base_sha: str) -> str:
    return f"optbot/knowledge/{workload}/{base_sha[:12]}"


def run(ctx: RunContext) -> Result:
    forge = ctx.forge
    res = ctx.results
    co, comb, learn = res.checkout, res.combine, res.learn
    workload, base = run_label(co.workload, co.dtype), co.base_sha
    notes: list[str] = []
    steps = ctx.steps_done

    # the chart and the knowledge files -------------------------------------------------------
    chart = rpt.chart_png(res, ctx.run_dir / "latency.png",
                          f"{workload} {co.preset} per-step latency @ {base[:12]} (run {ctx.run_id})")
    kdir = f"benchmarks/optbot-runs/{workload}-{base[:12]}"
    kfiles: dict[str, bytes] = {}
    knowledge = ctx.knowledge()
    root = Path(learn.knowledge_root) if learn and learn.knowledge_root else knowledge.root  # learn's staging copy
    for rel in (learn.files if learn else []):
        p = root / rel
        if p.is_file():
            kfiles[rel] = p.read_bytes()
    if chart:
        kfiles[f"{kdir}/latency.png"] = chart.read_bytes()
    kbranch = knowledge_branch_name(workload, base)
    krepo = knowledge.repo
    entries = [(e, forge.file_url("knowledge", kbranch, e)) for e in (learn.entries if learn else [])]
    lessons = [(e, forge.file_url("knowledge", kbranch, e)) for e in (learn.lessons if learn else [])]
    summary_blocks = rpt.build_blocks(res, ctx.run_id, {"entries": entries, "lessons": lessons},
                                      chart_src="latency.png" if chart else None, command=ctx.options.command,
                                      steps=steps)
    kfiles[f"{kdir}/report.md"] = to_markdown(summary_blocks).encode()

    title_k = f"optbot knowledge: {workload} @ {base[:12]} ({len(entries)} entries, {len(lessons)} lessons)"
    kbody_blocks = [H(2, title_k),
                    P("Store entries: " + (", ".join(f"[{n}]({u})" for n, u in entries) or "none")),
                    P("Lessons: " + (", ".join(f"[{n}]({u})" for n, u in lessons) or "none")),
                    P(f"Latency chart and run report: `{kdir}/` (run {ctx.run_id})."
                          + (f" Learning: {learn.reason}" if learn and learn.reason else ""))]
    if chart:
        kbody_blocks.append(Img("latency", forge.file_url("knowledge", kbranch, f"{kdir}/latency.png")
                                    + ("?raw=true" if forge.name == "github" else "")))
    if krepo is not None:
        date = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(os.path.getmtime(ctx.run_dir / "state.json")))
        ksha = commit_files_to_branch(krepo, kbranch, kfiles, title_k + f"\n\nOptbot-Run: {ctx.run_id}\n", date)
        kpr = forge.publish_knowledge(krepo.working_tree_dir, kbranch, ksha, title_k, to_markdown(kbody_blocks))
    else:
        out = ctx.run_dir / "knowledge"
        for rel, data in kfiles.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)
        kpr = PullRequestRef("none", note=f"{knowledge.root} ({knowledge.why}) is not a git repository: "
                                          f"knowledge files written to {out}")
        kbranch = ""
    notes.append(f"knowledge: {kpr.action} {kpr.url} {kpr.note}".strip())
    maybe_abort("deliver:knowledge-pr")

    # the engine PR -----------------------------------------------------------------------------
    links = {"entries": entries, "lessons": lessons, "knowledge_pr": kpr.url}
    body = to_markdown(rpt.build_blocks(res, ctx.run_id, links, chart_src=None, command=ctx.options.command,
                                            steps=steps))
    n = comb.delivered
    title = f"optbot: {n} optimization(s) for {workload} ({co.preset}) @ {base[:12]}"
    if n == 0:
        epr = PullRequestRef("none", note=no_pr_note(comb))
        if forge.name == "local":
            forge.publish_engine(co.repo_path, comb.branch, comb.head_sha, None, title, body)
    else:
        base_ref = ctx.options.ref if ctx.options.ref and not _looks_like_sha(ctx.options.ref) else None
        epr = forge.publish_engine(co.repo_path, comb.branch, comb.head_sha, base_ref, title, body)
    notes.append(f"engine: {epr.action} {epr.url} {epr.note}".strip())
    maybe_abort("deliver:engine-pr")

    # the report in the run directory -----------------------------------------------------------
    report_blocks = rpt.build_blocks(res, ctx.run_id, links, chart_src="latency.png" if chart else None,
                                     command=ctx.options.command, steps=steps)
    md, html_path = ctx.run_dir / "report.md", ctx.run_dir / "report.html"
    md.write_text(to_markdown(report_blocks))
    html_path.write_text(to_html(report_blocks, title))

    dash = update_dashboard(ctx, epr)
    notes.append(f"dashboard: {dash.action} {dash.url} {dash.note}".strip())

    # the reply on the triggering PR ------------------------------------------------------------
    text = reply_text(res, n, epr, kpr) + (f"\nDashboard: {dash.url}." if dash.action in ("opened", "updated") else "")
    reply = forge.reply(text, marker(ctx.run_id))
    return Result(forge=forge.name, dry_run=ctx.options.dry_run, engine_branch=comb.branch,
                  engine_head=comb.head_sha, engine_pr=epr, knowledge_branch=kbranch, knowledge_pr=kpr,
                  trigger_reply=reply, report_md=str(md), report_html=str(html_path), chart_png=str(chart or ""),
                  notes=notes, dashboard=dash)


def no_pr_note(comb) -> str:
    if comb.refused:
        sv = comb.stack_verdict
        return (f"no engine pull request: the stack of {len(comb.commits)} commit(s), each accepted alone, was "
                f"{sv.status} when re-validated as a whole ({sv.reason or sv.status}: {sv.summary[:200]}); "
                f"branch {comb.branch} is kept at {comb.head_sha[:12]} for a person to look at")
    return f"no accepted optimization, so no engine pull request (branch {comb.branch} equals the base)"


def update_dashboard(ctx: RunContext, epr: PullRequestRef) -> PullRequestRef:
    """This workload's section of the forge's dashboard. Whatever goes wrong here (GitHub down, a
    store entry that does not parse) is the returned ref's note: the PRs above are delivered."""
    from bot.deliver import dashboard
    from bot.knowledge.store import load_store

    try:
        section = dashboard.section_of_run(ctx.results, ctx.run_id, epr, load_store(ctx.knowledge().kernel_store))
        return dashboard.update(ctx.forge, section)
    except Exception as e:  # noqa: BLE001 - named in the note; the run's delivery must stand
        why = str(e) if isinstance(e, OptbotError) else f"{type(e).__name__}: {e}"
        return PullRequestRef("failed", note=f"not updated: {why}"[:400])


def reply_text(res, n: int, epr: PullRequestRef, kpr: PullRequestRef) -> str:
    from bot.steps.baseline import measurements

    co = res.checkout
    lines = [f"**optbot** finished `{co.workload}` @ `{co.base_sha[:12]}`: {n} optimization(s) accepted."]
    sv = res.combine.stack_verdict if res.combine else None
    if res.combine and res.combine.refused:
        lines[0] = (f"**optbot** finished `{co.workload}` @ `{co.base_sha[:12]}`: {len(res.combine.commits)} "
                    f"candidate(s) accepted alone, but their stack was {sv.status} when re-validated "
                    f"({sv.reason}): nothing delivered.")
    m = measurements(sv) if sv else {}
    timed = [(s.mode, m.get(f"base_{s.mode}"), m.get(f"cand_{s.mode}")) for s in (sv.speed if sv else [])]
    timed = [(mode, b, c) for mode, b, c in timed if b and c and c.median_ms]
    if timed:
        lines.append(f"Per-step latency (median, measured on {timed[0][2].device}): " + "; ".join(
            f"{mode} {b.median_ms:.3f} ms -> {c.median_ms:.3f} ms ({b.median_ms / c.median_ms:.3f}x)"
            for mode, b, c in timed) + ".")
    elif res.baseline and res.baseline.eager:
        b = res.baseline.eager
        lines.append(f"Baseline per-step latency (eager, median of {b.n}, measured on {b.device}): "
                     f"{b.median_ms:.3f} ms.")
    if epr.action == "closed-by-person":
        lines.append(f"Engine PR: #{epr.number} was closed by a person; the bot did not reopen it ({epr.url}).")
    elif epr.url:
        lines.append(f"Engine PR: {epr.url} ({epr.action}).")
    else:
        lines.append(f"Engine PR: none ({epr.note}).")
    if kpr.action == "closed-by-person":
        lines.append(f"Knowledge PR: #{kpr.number} was closed by a person; the bot did not reopen it ({kpr.url}).")
    elif kpr.url:
        lines.append(f"Knowledge PR: {kpr.url} ({kpr.action}).")
    return "\n".join(lines)


def _looks_like_sha(ref: str) -> bool:
    return len(ref) >= 7 and all(c in "0123456789abcdef" for c in ref.lower())
