"""The pull request body and the run report, built once as blocks and rendered to markdown and HTML.

Every number carries the device that measured it (a ``device`` column or a "measured on" note);
CPU timings are labelled cpu and never stand in for GPU results. Long parts go in <details>.
"""
from __future__ import annotations

from pathlib import Path

from bot.deliver.blocks import Code, Details, H, Img, P, Table, fmt_ms as _ms
from bot.deliver.left import what_is_left
from bot.steps.baseline import Measurement, measurements
from bot.validate.verdict import Verdict, vs_base

def _meas_row(label: str, mode: str, m: Measurement | None, base: Measurement | None = None) -> list[str]:
    if not m:
        return [label, mode, "n/a", "n/a", "n/a", "n/a", "n/a", "not measured"]
    spread = f"{_ms(m.min_ms)}–{_ms(m.max_ms)} (sd {_ms(m.stdev_ms)})"
    vs = f"{base.median_ms / m.median_ms:.3f}x" if base and base.median_ms and m is not base else ""
    dev = m.device + (f" ({m.device_name})" if m.device_name else "")
    return [label, mode, _ms(m.median_ms), _ms(m.per_pass_ms), spread, str(m.n), vs or "—", dev]


MODE_LABELS = {"eager": "eager", "graph": "CUDA graph", "compile": "torch.compile",
               "compile+graph": "torch.compile + CUDA graph"}
LAT_HEADER = ["", "mode", "median ms / step", "ms / pass", "spread ms (min–max)", "N", "speedup", "measured on"]


def latency_table(results) -> tuple[list, dict[str, Measurement | None]]:
    """Baseline vs optimized, in every production mode timed. Prefers the validator's interleaved stack numbers;
    falls back to the baseline step job (then 'optimized' is not measured)."""
    comb, base = results.combine, results.baseline
    sv = comb.stack_verdict if comb else None
    m = measurements(sv) if sv else {}
    if m.get("base_eager"):
        rows = []
        for s in sv.speed:  # every production mode the validator timed, in its order
            label = MODE_LABELS.get(s.mode, s.mode)
            rows += [_meas_row("baseline", label, m.get(f"base_{s.mode}")),
                     _meas_row("optimized", label, m.get(f"cand_{s.mode}"), m.get(f"base_{s.base_mode or s.mode}"))]
        note = "Base and optimized timed interleaved by the validator in one runner job."
        if sv.reused_from:  # a one-commit stack: its candidate's timings (bot/steps/combine.same_tree_verdict)
            note += f" Not timed again for the stack: {sv.reused_from}."
        mode_notes = "; ".join(f"{MODE_LABELS.get(s.mode, s.mode)}: {s.note}" for s in sv.speed if s.note)
        if "graph" not in {s.mode for s in sv.speed}:
            mode_notes = "; ".join(filter(None, [mode_notes, "CUDA graph: not measured" + (
                " (CUDA graphs need a CUDA device)" if sv.device == "cpu" else "")]))
        if mode_notes:
            note += " " + mode_notes
        return [Table(LAT_HEADER, rows), P(note)], m
    rows = [_meas_row("baseline", "eager", base.eager if base else None),
            _meas_row("baseline", "CUDA graph", base.graph if base else None)]
    why = (comb.stack_note if comb else "") or "no optimized stack was measured"
    rows.append(["optimized", "eager / CUDA graph", "n/a", "n/a", "n/a", "n/a", "—", f"not measured: {why}"])
    note = "Baseline: the runner's step job on the base worktree" + (f" ({base.graph_note})." if base and base.graph_note
                                                                     else ".")
    return [Table(LAT_HEADER, rows), P(note)], {"base_eager": base.eager if base else None,
                                                "base_graph": base.graph if base else None}


def chart_png(results, path: Path, title: str) -> Path | None:
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

    short = {"eager": "eager", "graph": "graph", "compile": "compile", "compile+graph": "compile+graph"}
    names = {f"{side}_{mode}": f"{who} {lab}" for mode, lab in short.items()
             for side, who in (("base", "baseline"), ("cand", "optimized"))}
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(bars)), 3.2), dpi=110)
    labels = [f"{names[k]}\n({v.device})" for k, v in bars]
    vals = [v.median_ms for _, v in bars]
    err = [[v.median_ms - v.min_ms for _, v in bars], [v.max_ms - v.median_ms for _, v in bars]]
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


def _speedup(v: Verdict | None) -> str:
    """Every timed mode's speedup with its outcome (an eager no-change beside faster graph and compile
    modes is what a one-mode column hid); else the eager timings' ratio."""
    timed = [s for s in (v.speed if v else []) if s.speedup is not None]
    if timed:
        return ", ".join(f"{s.mode} {s.speedup:.3f}x" + vs_base(s.base_mode)
                         + ("" if s.outcome == "faster" else f" ({s.outcome})")
                         for s in timed) + f" ({timed[0].device})"
    m = measurements(v) if v else {}
    b, c = m.get("base_eager"), m.get("cand_eager")
    return f"{b.median_ms / c.median_ms:.3f}x ({c.device})" if b and c and c.median_ms else "n/a"


def _reason(v: Verdict) -> str:
    return (v.reason or "accepted") + (f": {v.summary}" if v.summary else "")


def build_blocks(results, run_id: str, links: dict, chart_src: str | None = None, command: str = "",
                 steps: list | None = None) -> list:
    """The report of a run from its typed Results (bot/run/state.py). links: {"entries": [(name, url)],
    "lessons": [(name, url)], "knowledge_pr": url}; steps: the run's StepRecords."""
    co, comb, val, gen = results.checkout, results.combine, results.validate, results.generate
    ana, prof, base = results.analyze, results.profile, results.baseline
    env = (base.env if base else {}) or (prof.env if prof else {}) or {}
    commits = comb.commits if comb else []
    blocks: list = [H(2, f"optbot: {co.workload} on {co.engine} @ {co.base_sha[:12]}")]
    sv = comb.stack_verdict if comb else None
    refused = bool(comb and comb.refused)
    blocks.append(P(f"{len(commits)} {'commit(s)' if refused else 'optimization(s)'} on branch `{comb.branch if comb else '?'}` "
                    f"(preset {co.preset}, {co.dtype}, shape {co.shape}). "
                    f"Every number below names the device that measured it; CPU timings never stand in for GPU results."))
    if "+" in co.dtype and co.judged_by:  # a quantized run: what its outputs were held to, and why that bound
        blocks.append(P(f"Quantized ({co.dtype}): the base and every candidate run the recipe, and outputs are judged "
                        f"against the quantized base: {co.judged_by}"))
    if refused:
        blocks.append(P(f"**Not delivered**: each commit was accepted alone, but the stack re-validated as a whole "
                        f"was {sv.status} ({sv.reason}: {sv.summary[:300]})."))

    blocks.append(H(3, "Per-step latency: baseline vs optimized"))
    lat, _ = latency_table(results)
    blocks += lat
    if chart_src:
        blocks.append(Img("latency chart", chart_src))

    blocks.append(H(3, "Optimizations"))
    cands = gen.by_id() if gen else {}
    verdicts = val.verdicts if val else {}
    if commits:
        rows = []
        for c in commits:
            cand = cands.get(c.candidate_id)
            rows.append([c.sha[:12], c.subject, cand.kind if cand else "", cand.generator if cand else "",
                         _speedup(verdicts.get(c.candidate_id))])
        blocks.append(Table(["commit", "what", "kind", "generator", "alone: speedup per mode (device)"], rows))
    else:
        blocks.append(P("No optimization was accepted in this run. " + _why_none(ana, gen, val)))
    if comb and comb.dropped:
        blocks.append(P("Dropped while stacking: " + "; ".join(comb.dropped)))
    if comb and comb.checks:  # the stack broke whole: which stacks were checked to find the members that break it
        blocks.append(Details(f"Stacks checked for correctness, no timing ({len(comb.checks)})", [Table(
            ["stack", "added last", "verdict", "why"],
            [[" + ".join(ch.candidate_ids), ch.added or "(the whole stack)",
              ch.status + (f" ({ch.reason})" if ch.reason else ""),
              (f"known from run {ch.known_from}: " if ch.known_from else "") + ch.summary[:240]]
             for ch in comb.checks])]))
    if cands or (gen and gen.notes):
        superseded = val.superseded if val else {}
        vrows = [[cid, c.generator, c.kind, c.title, verdicts[cid].status if cid in verdicts else "not validated",
                  _reason(verdicts[cid]) if cid in verdicts else
                  (f"its tuned variant {superseded[cid]} was accepted" if cid in superseded else "")]
                 for cid, c in cands.items()]
        inner = [Table(["candidate", "generator", "kind", "what", "verdict", "reason"], vrows)] if vrows else []
        inner += [P("Generators: " + "; ".join(gen.notes))] if gen and gen.notes else []
        blocks.append(Details(f"All candidates and verdicts ({len(cands)})", inner))

    blocks.append(H(3, "Contribution of each optimization (ablation)"))
    ab = comb.ablation if comb else None
    if ab and ab.rows:
        blocks.append(Table(["optimization", "step ms without it", "contribution ms", "contribution %", "measured on"],
                            [[f"{comb.candidate_of(r.sha)}: {r.subject}", _ms(r.without_ms), _ms(r.contribution_ms),
                              "n/a" if r.contribution_pct is None else f"{r.contribution_pct:.1f}", ab.device]
                             for r in ab.rows]))
    blocks.append(P((comb.ablation_note if comb else "") or "not run"))

    blocks.append(H(3, "Correctness"))
    corr_rows = []
    judged = ([("stack", comb.stack_verdict)] if comb and comb.stack_verdict else []) + list(verdicts.items())
    for cid, v in judged:
        for ch in (v.correctness.checks if v.correctness else []):
            shape, _, seed = ch.label.partition(" seed ")
            corr_rows.append([cid, ch.output, shape, seed, str(ch.max_abs if ch.max_abs is not None else "n/a"),
                              str(ch.rel_l2 if ch.rel_l2 is not None else "n/a")
                              + (f" (the quantized base's: {ch.base_rel_l2})" if ch.against else ""),  # vs unquantized
                              "ok" if ch.ok else "FAIL",
                              (v.env or {}).get("device_kind") or v.device])
    if corr_rows:
        blocks.append(Table(["candidate", "output", "shape", "seed", "max abs err", "rel err (rel L2)", "within tolerance",
                             "device"], corr_rows))
    else:
        blocks.append(P("No candidate was compared with the base (" + ((val.reason if val else "") or
                                                                       "validation not run") + ")."))
    if base and base.outputs:
        rows = [[", ".join(f"{k} {t['shape']} {t['dtype']}" for k, t in o.get("tensors", {}).items()),
                 str(o.get("seed")), ", ".join(t["digest"] for t in o.get("tensors", {}).values())]
                for o in base.outputs]
        blocks.append(Details("Baseline outputs (seeds, shapes, digests)",
                              [Table(["outputs", "seed", "digest"], rows)]))

    blocks.append(H(3, "Microbenchmarks of new kernels"))
    by_kernel: dict[str, list] = {}
    for cid, v in verdicts.items():
        for k in (v.correctness.kernels if v.correctness else []):
            micro = k.get("micro")
            if isinstance(micro, str) or (isinstance(micro, dict) and isinstance(micro.get("reference"), dict)
                                          and isinstance(micro.get("kernel"), dict)):
                by_kernel.setdefault(k.get("name") or cid, []).append(micro)
    if by_kernel:
        for k, ms in by_kernel.items():
            blocks.append(Details(f"{k} ({len(ms)} shapes)", [Table(
                ["shape", "reference ms", "reference again (A/A) ms", "kernel ms", "speedup", "N", "measured on"],
                [_micro_row(m) for m in ms])]))
    else:
        blocks.append(P("No new kernel was microbenchmarked in this run."))

    blocks.append(H(3, "Where the time goes (baseline profile)"))
    if prof and prof.categories:
        blocks.append(P(f"Profiled on {prof.device} ({env.get('device_name', '')}); unprofiled step median "
                        f"{_ms(prof.total_ms)} ms."))
        blocks.append(Details("Time per category and top kernels", [
            Table(["category", "ms (under the profiler)", "measured on"],
                  [[k, _ms(v), prof.device] for k, v in sorted(prof.categories.items(), key=lambda x: -x[1])]),
            Table(["kernel / op", "category", "module", "calls", "ms (under the profiler)", "measured on"],
                  [[k.get("name", ""), k.get("category", ""), k.get("module", ""), str(k.get("calls", "")),
                    _ms(k.get("ms")), prof.device] for k in prof.top_kernels])]))
    if ana and ana.opportunities:
        rows = []
        for o in ana.opportunities:
            loc = o.location
            src = f"{loc.engine_file}:{loc.engine_line}" if loc.engine_file else ""
            rows.append([o.kind, loc.module_pattern, src, _ms(o.gain_ms), f"{o.gain_pct:.1f}", o.generator,
                         prof.device if prof else "?"])
        blocks.append(Details(f"Opportunities found ({len(ana.opportunities)})", [Table(
            ["kind", "module", "engine file:line", "estimated gain ms", "% of step", "generator",
             "estimated from a profile on"], rows)]))

    blocks += what_is_left(results)

    blocks.append(H(3, "Knowledge"))
    items = [f"[{n}]({u})" for n, u in links.get("entries", [])] + [f"[{n}]({u})" for n, u in links.get("lessons", [])]
    kpr = links.get("knowledge_pr")
    learn = results.learn
    blocks.append(P(("Store entries and lessons: " + ", ".join(items) if items else "No store entry or lesson was written"
                     + (f" ({learn.reason})" if learn and learn.reason else ""))
                    + (f"\nKnowledge PR: {kpr}" if kpr else "")))

    blocks.append(Details("Environment", [Code("\n".join([
        f"device:      {env.get('device_kind', '?')} ({env.get('device_name', '?')})",
        f"driver:      {env.get('driver')}",
        f"cuda:        {env.get('cuda')}",
        f"torch:       {env.get('torch')}",
        f"triton:      {env.get('triton')}",
        f"python:      {env.get('python')}",
        f"platform:    {env.get('platform')}",
        f"engine:      {co.engine} {co.repo_path}",
        f"engine sha:  {co.base_sha}",
        f"branch head: {comb.head_sha if comb else ''}",
        f"command:     {command}",
        f"run id:      {run_id}",
    ]))]))
    if steps:
        blocks.append(Details("Steps of this run", [Table(["step", "status", "seconds", "summary"],
                                                          [[s.name, s.status, f"{s.seconds:.1f}", s.summary]
                                                           for s in steps])]))
    return blocks


def _micro_row(m: dict | str) -> list[str]:
    """One shape of a kernel's microbenchmark (runner/kinds/kernel_check.py): reference, its A/A
    repeat and the kernel, each a timing of the one timing routine; or why none was taken."""
    if isinstance(m, str):  # e.g. "needs a GPU": said where the device would be
        return ["", "n/a", "n/a", "n/a", "n/a", "", m]
    ref, ker = m["reference"], m["kernel"]
    aa = m.get("reference_aa") if isinstance(m.get("reference_aa"), dict) else {}
    sp = ref["median_ms"] / ker["median_ms"] if ker.get("median_ms") else None
    return [str(m.get("shape", "")), _ms(ref.get("median_ms")), _ms(aa.get("median_ms")), _ms(ker.get("median_ms")),
            f"{sp:.2f}x" if sp else "n/a", str(ker.get("n", "")), str(ker.get("device", "cuda"))]


def _why_none(ana, gen, val) -> str:
    for step, d in (("analyze", ana), ("generate", gen), ("validate", val)):
        if d is not None and d.status == "skipped":
            return f"{step}: {d.reason}."
    return (val.reason if val else "") + "."
