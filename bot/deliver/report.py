"""The pull request body and the run report, built once as blocks and rendered to markdown and HTML.

Every number carries the device that measured it (a ``device`` column or a "measured on" note);
CPU timings are labelled cpu and never stand in for GPU results. Long parts go in <details>.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

# ------------------------------------------------------------------------------------------------
# blocks


@dataclass
class H:
    level: int
    text: str


@dataclass
class P:
    text: str


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Code:
    text: str


@dataclass
class Details:
    summary: str
    blocks: list = field(default_factory=list)


@dataclass
class Img:
    alt: str
    src: str


def to_markdown(blocks: list) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, H):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, P):
            out.append(b.text)
        elif isinstance(b, Table):
            esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in r] for r in b.rows]
            out.append("| " + " | ".join(b.header) + " |\n|" + "---|" * len(b.header) + "\n"
                       + "\n".join("| " + " | ".join(r) + " |" for r in esc))
        elif isinstance(b, Code):
            out.append("```\n" + b.text.rstrip() + "\n```")
        elif isinstance(b, Details):
            out.append(f"<details><summary>{html.escape(b.summary)}</summary>\n\n{to_markdown(b.blocks)}\n\n</details>")
        elif isinstance(b, Img):
            out.append(f"![{b.alt}]({b.src})")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _inline_html(text: str) -> str:
    """Escapes, then renders `code` and [text](url) (the only inline markup our blocks use)."""
    import re
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)
    return s


def to_html(blocks: list, title: str = "optbot report") -> str:
    def render(bs: list) -> str:
        parts = []
        for b in bs:
            if isinstance(b, H):
                parts.append(f"<h{b.level}>{_inline_html(b.text)}</h{b.level}>")
            elif isinstance(b, P):
                parts.append("<p>" + "<br>".join(_inline_html(ln) for ln in b.text.splitlines()) + "</p>")
            elif isinstance(b, Table):
                head = "".join(f"<th>{_inline_html(h)}</th>" for h in b.header)
                rows = "".join("<tr>" + "".join(f"<td>{_inline_html(str(c))}</td>" for c in r) + "</tr>" for r in b.rows)
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            elif isinstance(b, Code):
                parts.append(f"<pre><code>{html.escape(b.text)}</code></pre>")
            elif isinstance(b, Details):
                parts.append(f"<details><summary>{html.escape(b.summary)}</summary>{render(b.blocks)}</details>")
            elif isinstance(b, Img):
                parts.append(f'<img alt="{html.escape(b.alt)}" src="{html.escape(b.src)}" style="max-width:720px">')
        return "\n".join(parts)

    css = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
           "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:3px 8px;text-align:left}"
           "pre{background:#f4f4f4;padding:.6em;overflow-x:auto}code{background:#f4f4f4}")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{css}</style></head><body>\n{render(blocks)}\n</body></html>\n")


# ------------------------------------------------------------------------------------------------
# numbers


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _meas_row(label: str, mode: str, m: dict | None, base: dict | None = None) -> list[str]:
    if not m:
        return [label, mode, "n/a", "n/a", "n/a", "n/a", "n/a", "not measured"]
    spread = f"{_ms(m['min_ms'])}–{_ms(m['max_ms'])} (sd {_ms(m['stdev_ms'])})"
    passes = m.get("passes", 1) or 1
    vs = ""
    if base and base.get("median_ms") and m is not base:
        vs = f"{base['median_ms'] / m['median_ms']:.3f}x"
    dev = m["device"] + (f" ({m['device_name']})" if m.get("device_name") else "")
    return [label, mode, _ms(m["median_ms"]), _ms(m["median_ms"] / passes), spread, str(m["n"]), vs or "—", dev]


LAT_HEADER = ["", "mode", "median ms / step", "ms / pass", "spread ms (min–max)", "N", "speedup", "measured on"]


def latency_table(results: dict) -> tuple[list, dict]:
    """Baseline vs optimized, eager and graph. Prefers the validator's interleaved stack numbers;
    falls back to the baseline step job (then 'optimized' is not measured)."""
    comb = results.get("combine", {})
    sv = comb.get("stack_verdict")
    base = results.get("baseline", {})
    rows: list[list[str]] = []
    data = {}
    if sv and sv.get("base_eager"):
        rows.append(_meas_row("baseline", "eager", sv.get("base_eager")))
        rows.append(_meas_row("optimized", "eager", sv.get("cand_eager"), sv.get("base_eager")))
        rows.append(_meas_row("baseline", "CUDA graph", sv.get("base_graph")))
        rows.append(_meas_row("optimized", "CUDA graph", sv.get("cand_graph"), sv.get("base_graph")))
        data = {k: sv.get(k) for k in ("base_eager", "cand_eager", "base_graph", "cand_graph")}
        note = "Base and optimized timed interleaved by the validator in one runner job."
        if sv.get("graph_note"):
            note += " CUDA graph: " + sv["graph_note"]
    else:
        rows.append(_meas_row("baseline", "eager", base.get("eager")))
        rows.append(_meas_row("baseline", "CUDA graph", base.get("graph")))
        why = comb.get("stack_note") or "no optimized stack was measured"
        rows.append(["optimized", "eager / CUDA graph", "n/a", "n/a", "n/a", "n/a", "—", f"not measured: {why}"])
        data = {"base_eager": base.get("eager"), "base_graph": base.get("graph")}
        note = "Baseline: the runner's step job on the base worktree" + (f" ({base['graph_note']})." if base.get("graph_note") else ".")
    return [Table(LAT_HEADER, rows), P(note)], data


def chart_png(results: dict, path: Path, title: str) -> Path | None:
    """Bar chart of per-step latency, baseline vs optimized, each bar labelled with its device."""
    _, data = latency_table(results)
    bars = [(k, v) for k, v in data.items() if v]
    if not bars:
        return None
    try:
        import matplotlib
    except ImportError:  # a bare GPU box: the report says there is no chart rather than failing
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {"base_eager": "baseline eager", "cand_eager": "optimized eager",
             "base_graph": "baseline graph", "cand_graph": "optimized graph"}
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=110)
    labels = [f"{names[k]}\n({v['device']})" for k, v in bars]
    vals = [v["median_ms"] for _, v in bars]
    err = [[v["median_ms"] - v["min_ms"] for _, v in bars], [v["max_ms"] - v["median_ms"] for _, v in bars]]
    colors = ["#888" if k.startswith("base") else "#2a7" for k, _ in bars]
    ax.bar(labels, vals, yerr=err, color=colors, capsize=4)
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per step (median, min–max)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# the body


def build_blocks(results: dict, run_id: str, links: dict, chart_src: str | None = None) -> list:
    """links: {"entries": [(name, url)], "lessons": [(name, url)], "knowledge_pr": url, "report": path}"""
    co = results.get("checkout", {})
    comb = results.get("combine", {})
    val = results.get("validate", {})
    gen = results.get("generate", {})
    ana = results.get("analyze", {})
    prof = results.get("profile", {})
    base = results.get("baseline", {})
    env = base.get("env") or prof.get("env") or {}
    n_commits = len(comb.get("commits", []))
    blocks: list = [H(2, f"optbot: {co.get('workload', '?')} on {co.get('engine', '?')} @ {co.get('base_sha', '')[:12]}")]
    blocks.append(P(f"{n_commits} optimization(s) on branch `{comb.get('branch', '?')}` "
                    f"(preset {co.get('preset')}, {co.get('dtype')}, shape {co.get('shape')}). "
                    f"Every number below names the device that measured it; CPU timings never stand in for GPU results."))

    blocks.append(H(3, "Per-step latency: baseline vs optimized"))
    lat, _ = latency_table(results)
    blocks += lat
    if chart_src:
        blocks.append(Img("latency chart", chart_src))

    blocks.append(H(3, "Optimizations"))
    cands = {c["id"]: c for c in gen.get("candidates", [])}
    verdicts = {v["candidate_id"]: v for v in val.get("verdicts", [])}
    if comb.get("commits"):
        rows = []
        for c in comb["commits"]:
            cand, v = cands.get(c["candidate_id"], {}), verdicts.get(c["candidate_id"], {})
            sp = ""
            if v.get("base_eager") and v.get("cand_eager"):
                sp = f"{v['base_eager']['median_ms'] / v['cand_eager']['median_ms']:.3f}x ({v['cand_eager']['device']})"
            rows.append([c["sha"][:12], c["subject"], cand.get("kind", ""), cand.get("generator", ""), sp or "n/a"])
        blocks.append(Table(["commit", "what", "kind", "generator", "alone: speedup (device)"], rows))
    else:
        blocks.append(P("No optimization was accepted in this run. " + _why_none(ana, gen, val)))
    if comb.get("dropped"):
        blocks.append(P("Dropped while stacking: " + "; ".join(comb["dropped"])))
    if cands or gen.get("notes"):
        vrows = [[cid, c.get("generator", ""), c.get("kind", ""), c.get("title", ""),
                  verdicts.get(cid, {}).get("status", "not validated"), verdicts.get(cid, {}).get("reason", "")]
                 for cid, c in cands.items()]
        inner = [Table(["candidate", "generator", "kind", "what", "verdict", "reason"], vrows)] if vrows else []
        inner += [P("Generators: " + "; ".join(gen.get("notes", [])))] if gen.get("notes") else []
        blocks.append(Details(f"All candidates and verdicts ({len(cands)})", inner))

    blocks.append(H(3, "Contribution of each optimization (ablation)"))
    if comb.get("ablation"):
        blocks.append(Table(["optimization", "step ms without it", "contribution ms", "contribution %", "measured on"],
                            [[f"{a['candidate_id']}: {a['title']}", _ms(a["without_ms"]), _ms(a["contribution_ms"]),
                              "n/a" if a["contribution_pct"] is None else f"{a['contribution_pct']:.1f}", a["device"]]
                             for a in comb["ablation"]]))
    blocks.append(P(comb.get("ablation_note") or "not run"))

    blocks.append(H(3, "Correctness"))
    corr_rows = []
    for cid, v in [("stack", comb.get("stack_verdict") or {})] + list(verdicts.items()):
        for c in v.get("correctness", []):
            corr_rows.append([cid, str(c.get("output", "")), str(c.get("shape", "")), str(c.get("seed", "")),
                              str(c.get("max_abs", "n/a")), str(c.get("max_rel", "n/a")),
                              "ok" if c.get("ok") else "FAIL", str(c.get("device", v.get("device", "")))])
    if corr_rows:
        blocks.append(Table(["candidate", "output", "shape", "seed", "max abs err", "rel err (rel L2)", "within tolerance",
                             "device"], corr_rows))
    else:
        blocks.append(P("No candidate was compared with the base (" + (val.get("reason") or "validation not run") + ")."))
    if base.get("outputs"):
        rows = [[", ".join(f"{k} {t['shape']} {t['dtype']}" for k, t in o.get("tensors", {}).items()),
                 str(o.get("seed")), ", ".join(t["digest"] for t in o.get("tensors", {}).values())]
                for o in base["outputs"]]
        blocks.append(Details("Baseline outputs (seeds, shapes, digests)",
                              [Table(["outputs", "seed", "digest"], rows)]))

    micro = [(cid, m) for cid, v in verdicts.items() for m in v.get("micro", [])]
    blocks.append(H(3, "Microbenchmarks of new kernels"))
    if micro:
        by_kernel: dict[str, list] = {}
        for cid, m in micro:
            by_kernel.setdefault(m.get("kernel", cid), []).append(m)
        for k, ms in by_kernel.items():
            blocks.append(Details(f"{k} ({len(ms)} shapes)", [Table(
                ["shape", "reference ms", "reference again (A/A) ms", "kernel ms", "speedup", "N", "measured on"],
                [[str(m.get("shape", "")), _ms(m.get("base_ms")), _ms(m.get("aa_ms")), _ms(m.get("cand_ms")),
                  f"{m['speedup']:.2f}x" if m.get("speedup") else "n/a", str(m.get("n", "")), str(m.get("device", ""))]
                 for m in ms])]))
    else:
        blocks.append(P("No new kernel was microbenchmarked in this run."))

    blocks.append(H(3, "Where the time goes (baseline profile)"))
    if prof.get("categories"):
        total = prof.get("total_ms") or 0
        blocks.append(P(f"Profiled on {prof.get('device')} ({env.get('device_name', '')}); unprofiled step median "
                        f"{_ms(total)} ms."))
        blocks.append(Details("Time per category and top kernels", [
            Table(["category", "ms (under the profiler)", "measured on"],
                  [[k, _ms(v), prof.get("device", "")] for k, v in sorted(prof["categories"].items(), key=lambda x: -x[1])]),
            Table(["kernel / op", "category", "module", "calls", "ms (under the profiler)", "measured on"],
                  [[k.get("name", ""), k.get("category", ""), k.get("module", ""), str(k.get("calls", "")), _ms(k.get("ms")),
                    prof.get("device", "")]
                   for k in prof.get("top_kernels", [])])]))
    if ana.get("opportunities"):
        pdev = prof.get("device", "?")
        rows = []
        for o in ana["opportunities"]:
            loc = o.get("location") if isinstance(o.get("location"), dict) else {}
            where = loc.get("module_pattern") or o.get("module") or ""
            src = f"{loc.get('engine_file', '')}:{loc.get('engine_line')}" if loc.get("engine_file") else ""
            gain = o.get("gain_ms", o.get("estimated_gain_ms"))
            rows.append([str(o.get("kind", "")), where, src, _ms(gain) if isinstance(gain, (int, float)) else "n/a",
                         f"{o['gain_pct']:.1f}" if isinstance(o.get("gain_pct"), (int, float)) else "n/a",
                         str(o.get("generator", "")), pdev])
        blocks.append(Details(f"Opportunities found ({len(ana['opportunities'])})", [Table(
            ["kind", "module", "engine file:line", "estimated gain ms", "% of step", "generator",
             "estimated from a profile on"], rows)]))

    blocks.append(H(3, "Knowledge"))
    items = [f"[{n}]({u})" for n, u in links.get("entries", [])] + [f"[{n}]({u})" for n, u in links.get("lessons", [])]
    kpr = links.get("knowledge_pr")
    blocks.append(P(("Store entries and lessons: " + ", ".join(items) if items else "No store entry or lesson was written"
                     + (f" ({results.get('learn', {}).get('reason')})" if results.get("learn", {}).get("reason") else ""))
                    + (f"\nKnowledge PR: {kpr}" if kpr else "")))

    blocks.append(Details("Environment", [Code("\n".join([
        f"device:      {env.get('device_kind', '?')} ({env.get('device_name', '?')})",
        f"driver:      {env.get('driver')}",
        f"cuda:        {env.get('cuda')}",
        f"torch:       {env.get('torch')}",
        f"triton:      {env.get('triton')}",
        f"python:      {env.get('python')}",
        f"platform:    {env.get('platform')}",
        f"engine:      {co.get('engine')} {co.get('repo_path')}",
        f"engine sha:  {co.get('base_sha')}",
        f"branch head: {comb.get('head_sha', '')}",
        f"command:     {results.get('_command', '')}",
        f"run id:      {run_id}",
    ]))]))
    steps = results.get("_steps", [])
    if steps:
        blocks.append(Details("Steps of this run", [Table(["step", "status", "seconds", "summary"],
                                                          [[s["name"], s["status"], f"{s['seconds']:.1f}", s["summary"]]
                                                           for s in steps])]))
    return blocks


def _why_none(ana: dict, gen: dict, val: dict) -> str:
    for step, d in (("analyze", ana), ("generate", gen), ("validate", val)):
        if d.get("status") == "skipped":
            return f"{step}: {d.get('reason')}."
    return val.get("reason", "") + "."
