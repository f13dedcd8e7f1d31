"""Step 9, deliver: the knowledge PR, the engine PR, the reply on the triggering PR, the report.

Order: knowledge first (so the engine PR can link its store entries and lessons), then the engine
PR, then the reply. Each part is idempotent (bot/deliver/github.py), so re-running the whole
step after a kill in the middle of it gives the same branches and pull requests, never duplicates.
The report (markdown + HTML) is always written to the run directory.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from bot.deliver import report as rpt
from bot.deliver.knowledge import commit_files_to_branch
from bot.deliver.local import LocalForge
from bot.knowledge.location import knowledge_of
from bot.optimize.stages import DeliverResult, PullRequestRef, RunContext, knowledge_branch_name
from bot.run.state import maybe_abort


def github_token() -> str | None:
    return os.environ.get("OPTBOT_GITHUB_TOKEN") or os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")


def make_forge(ctx: RunContext):
    token = github_token()
    if ctx.options.dry_run:
        return LocalForge(ctx.run_dir, "--dry-run: no pushes, no pull requests")
    if not token:
        return LocalForge(ctx.run_dir, "no GitHub token (OPTBOT_GITHUB_TOKEN / GITHUB_TOKEN) is set")
    from bot.deliver.github import GitHubForge
    return GitHubForge(token, ctx.options, ctx.run_id, log=ctx.log)


def marker(run_id: str) -> str:
    return f"<!-- optbot-run: {run_id} -->"


def deliver(ctx: RunContext, forge=None) -> DeliverResult:
    forge = forge or getattr(ctx, "forge", None) or make_forge(ctx)
    res = ctx.results
    co, comb, learn = res["checkout"], res["combine"], res.get("learn", {})
    workload, base = co["workload"], co["base_sha"]
    notes: list[str] = []

    # the chart and the knowledge files -------------------------------------------------------
    chart = rpt.chart_png(res, ctx.run_dir / "latency.png",
                          f"{workload} {co['preset']} per-step latency @ {base[:12]} (run {ctx.run_id})")
    kdir = f"benchmarks/optbot-runs/{workload}-{base[:12]}"
    kfiles: dict[str, bytes] = {}
    knowledge = knowledge_of(ctx.options)
    root = Path(learn.get("knowledge_root") or knowledge.root)  # the learn step's staging copy
    for rel in learn.get("files", []):
        p = root / rel
        if p.is_file():
            kfiles[rel] = p.read_bytes()
    if chart:
        kfiles[f"{kdir}/latency.png"] = chart.read_bytes()
    kbranch = knowledge_branch_name(workload, base)
    krepo = knowledge.repo
    entries = [(e, forge.file_url("knowledge", kbranch, e)) for e in learn.get("entries", [])]
    lessons = [(e, forge.file_url("knowledge", kbranch, e)) for e in learn.get("lessons", [])]
    summary_blocks = rpt.build_blocks(res, ctx.run_id, {"entries": entries, "lessons": lessons},
                                      chart_src="latency.png" if chart else None)
    kfiles[f"{kdir}/report.md"] = rpt.to_markdown(summary_blocks).encode()

    title_k = f"optbot knowledge: {workload} @ {base[:12]} ({len(learn.get('entries', []))} entries, " \
              f"{len(learn.get('lessons', []))} lessons)"
    kbody_blocks = [rpt.H(2, title_k),
                    rpt.P("Store entries: " + (", ".join(f"[{n}]({u})" for n, u in entries) or "none")),
                    rpt.P("Lessons: " + (", ".join(f"[{n}]({u})" for n, u in lessons) or "none")),
                    rpt.P(f"Latency chart and run report: `{kdir}/` (run {ctx.run_id})."
                          + (f" Learning: {learn.get('reason')}" if learn.get("reason") else ""))]
    if chart:
        kbody_blocks.append(rpt.Img("latency", forge.file_url("knowledge", kbranch, f"{kdir}/latency.png")
                                    + ("?raw=true" if forge.name == "github" else "")))
    if krepo is not None:
        date = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(os.path.getmtime(ctx.run_dir / "state.json")))
        ksha = commit_files_to_branch(krepo, kbranch, kfiles, title_k + f"\n\nOptbot-Run: {ctx.run_id}\n", date)
        kpr = forge.publish_knowledge(krepo.working_tree_dir, kbranch, ksha, title_k, rpt.to_markdown(kbody_blocks))
    else:
        out = ctx.run_dir / "knowledge"
        for rel, data in kfiles.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)
        kpr = PullRequestRef("none", note=f"{knowledge.root} ({knowledge.why}) is not a git repository: knowledge "
                                          f"files written to {out}")
        kbranch = ""
    notes.append(f"knowledge: {kpr.action} {kpr.url} {kpr.note}".strip())
    maybe_abort("deliver:knowledge-pr")

    # the engine PR -----------------------------------------------------------------------------
    body_blocks = rpt.build_blocks(res, ctx.run_id, {"entries": entries, "lessons": lessons,
                                                     "knowledge_pr": kpr.url}, chart_src=None)
    body = rpt.to_markdown(body_blocks)
    n = len(comb.get("commits", []))
    title = f"optbot: {n} optimization(s) for {workload} ({co['preset']}) @ {base[:12]}"
    if n == 0:
        epr = PullRequestRef("none", note="no accepted optimization, so no engine pull request "
                                          f"(branch {comb['branch']} equals the base)")
        if forge.name == "local":
            forge.publish_engine(co["repo_path"], comb["branch"], comb["head_sha"], None, title, body)
    else:
        base_ref = ctx.options.ref if ctx.options.ref and not _looks_like_sha(ctx.options.ref) else None
        epr = forge.publish_engine(co["repo_path"], comb["branch"], comb["head_sha"], base_ref, title, body)
    notes.append(f"engine: {epr.action} {epr.url} {epr.note}".strip())
    maybe_abort("deliver:engine-pr")

    # the report in the run directory -----------------------------------------------------------
    report_blocks = rpt.build_blocks(res, ctx.run_id, {"entries": entries, "lessons": lessons,
                                                       "knowledge_pr": kpr.url},
                                     chart_src="latency.png" if chart else None)
    md, html_path = ctx.run_dir / "report.md", ctx.run_dir / "report.html"
    md.write_text(rpt.to_markdown(report_blocks))
    html_path.write_text(rpt.to_html(report_blocks, title))

    # the reply on the triggering PR ------------------------------------------------------------
    reply = forge.reply(reply_text(workload, base, n, epr, kpr, res), marker(ctx.run_id))
    return DeliverResult(forge=forge.name, dry_run=ctx.options.dry_run, engine_branch=comb["branch"],
                         engine_head=comb["head_sha"], engine_pr=epr, knowledge_branch=kbranch, knowledge_pr=kpr,
                         trigger_reply=reply, report_md=str(md), report_html=str(html_path),
                         chart_png=str(chart or ""), notes=notes)


def reply_text(workload: str, base: str, n: int, epr: PullRequestRef, kpr: PullRequestRef, res: dict) -> str:
    lines = [f"**optbot** finished `{workload}` @ `{base[:12]}`: {n} optimization(s) accepted."]
    sv = (res.get("combine") or {}).get("stack_verdict") or {}
    if sv.get("base_eager") and sv.get("cand_eager"):
        b, c = sv["base_eager"], sv["cand_eager"]
        lines.append(f"Per-step latency (eager, median, measured on {c['device']}): {b['median_ms']:.3f} ms -> "
                     f"{c['median_ms']:.3f} ms ({b['median_ms'] / c['median_ms']:.3f}x).")
    elif (res.get("baseline") or {}).get("eager"):
        b = res["baseline"]["eager"]
        lines.append(f"Baseline per-step latency (eager, median of {b['n']}, measured on {b['device']}): "
                     f"{b['median_ms']:.3f} ms.")
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
