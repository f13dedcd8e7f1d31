"""Render an analysis: terminal table (rich) and markdown. Every rendering names the device that
measured the profile the estimates come from."""
from __future__ import annotations


def _loc(o: dict) -> str:
    loc = o["location"]
    s = loc["module_pattern"]
    if loc["instances"] > 1:
        s += f" (x{loc['instances']})"
    if loc["engine_file"]:
        s += f"\n{loc['engine_file']}:{loc['engine_line']}"
    site = loc.get("call_site")
    if site and site != f"{loc['engine_file']}:{loc['engine_line']}":
        s += f"\ncalled at {site}"
    return s


def header(a: dict) -> list[str]:
    m = a["meta"]
    return [
        f"optbot analyze {m.get('workload', '?')} · preset {m.get('preset', '?')} · engine {m.get('engine', '?')} @ "
        f"{str(m.get('engine_sha', ''))[:12]} · shape {m.get('shape', '?')}",
        f"profile measured on: {a['profile']['device']} · step {a['profile']['total_ms']:.3f} ms "
        f"({a['profile']['passes']} pass(es)) · source {a['profile']['source']}",
        f"graph captured on: {a['graph']['device']} · {a['graph']['ops']} aten ops · {a['graph']['passes']} pass(es) · "
        f"profile time placed on graph ops: {100 * a['profile']['coverage']:.1f}%",
        *([f"note: profiled op times summed to more than the unprofiled step; scaled by "
           f"{a['profile']['time_scale']:.3f} so estimates are shares of the step"]
          if a["profile"].get("time_scale", 1.0) < 1.0 else []),
        f"{len(a['opportunities'])} opportunities · ops they touch take {a['claimed_ms']:.3f} ms "
        f"({a['claimed_pct']:.1f}% of the step; each op counted once)",
    ]


def print_terminal(a: dict, top: int = 25, console=None) -> None:
    try:  # rich may be missing on a bare GPU box: plain text then
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _print_plain(a, top)
        return
    c = console or Console(width=None if Console().is_terminal else 160)
    for line in header(a):
        c.print(line, highlight=False)
    t = Table(title=f"opportunities, ranked by estimated gain ({a['profile']['device']})")
    for col in ("#", "kind", "location", "what", "gain ms", "% step", "conf", "generator"):
        t.add_column(col, justify="right" if col in ("#", "gain ms", "% step", "conf") else "left", overflow="fold")
    for i, o in enumerate(a["opportunities"][:top], 1):
        t.add_row(str(i), f"{o['kind']}\n{o['detail']}", _loc(o), o["summary"], f"{o['gain_ms']:.4f}",
                  f"{o['gain_pct']:.2f}", f"{o['confidence']:.2f}", _generator(o))
    c.print(t)
    if len(a["opportunities"]) > top:
        c.print(f"... {len(a['opportunities']) - top} more in the JSON/markdown report")


def _print_plain(a: dict, top: int) -> None:
    for line in header(a):
        print(line)
    print(f"{'#':>3} {'kind':<22} {'detail':<24} {'location':<46} {'gain ms':>10} {'% step':>7} {'conf':>5} generator")
    for i, o in enumerate(a["opportunities"][:top], 1):
        print(f"{i:>3} {o['kind']:<22} {o['detail']:<24} {o['location']['module_pattern'][:46]:<46} "
              f"{o['gain_ms']:>10.4f} {o['gain_pct']:>7.2f} {o['confidence']:>5.2f} {_generator(o)}")


def _generator(o: dict) -> str:
    return f"none: stand-in ({o['stand_in'].split(':')[0]})" if o.get("stand_in") else o["generator"]


def markdown(a: dict) -> str:
    lines = ["# optbot analyze", ""] + [f"- {h}" for h in header(a)] + [""]
    lines += ["| # | kind | location | what | est. gain ms | % of step | confidence | generator |",
              "|---|---|---|---|---:|---:|---:|---|"]
    for i, o in enumerate(a["opportunities"], 1):
        loc = _loc(o).replace("\n", "<br>")
        lines.append(f"| {i} | {o['kind']} ({o['detail']}) | {loc} | {o['summary']} | {o['gain_ms']:.4f} | "
                     f"{o['gain_pct']:.2f} | {o['confidence']:.2f} | {_generator(o)} |")
    lines += ["", "## Details", ""]
    for i, o in enumerate(a["opportunities"], 1):
        lines += [f"### {i}. {o['kind']} · {o['location']['module_pattern']} · `{o['id']}`", "",
                  f"- {o['summary']}",
                  f"- estimate: {o['estimate']['estimated_ms']:.4f} ms ({o['estimate']['estimated_pct']:.2f}% of the step), "
                  f"measured on {o['estimate']['profile_device']}; basis: {o['estimate']['basis']}",
                  f"- confidence {o['confidence']:.2f}: {o['confidence_reason']}",
                  f"- examples: {', '.join(o['location']['examples']) or '-'}",
                  f"- ops: {'; '.join(o['ops'][:10]) or '-'}"]
        if o.get("stand_in"):
            lines.append(f"- not optimized: its ops run on a stand-in for what production runs ({o['stand_in']}); "
                         "a gain over it would not be a production gain")
        if o.get("quantized_by"):  # analyses written before the field have none
            lines.append(f"- its output is quantized for an FP8 GEMM by {', '.join(f'`{q}`' for q in o['quantized_by'])}: "
                         "under torch.compile a kernel that writes it unquantized keeps inductor from fusing the two")
        lines.append("")
    return "\n".join(lines) + "\n"
