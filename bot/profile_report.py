"""Render a profile result: terminal table (rich), markdown, and a PNG plot.

Every rendering names the device that measured the numbers (DESIGN: CPU timings never pass for GPU
results).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from runner.module_pattern import module_pattern as _runner_module_pattern


def module_pattern(path: str) -> str:
    # the runner's rule (runner/module_pattern.py imports nothing, so the bot may import it); a
    # kernel launched outside every module has the empty path, shown as "(top level)"
    return _runner_module_pattern(path) or "(top level)"


def grouped_kernels(profile: dict, top: int = 25) -> list[dict]:
    """Kernels grouped by (name, module pattern): repeated blocks collapse into one row."""
    groups: dict[tuple[str, str], dict] = {}
    for k in profile["kernels"]:
        key = (k["name"], module_pattern(k["module"]))
        g = groups.setdefault(key, dict(name=k["name"], category=k["category"], module=key[1], calls=0, ms=0.0))
        g["calls"] += k["calls"]
        g["ms"] += k["ms"]
    return sorted(groups.values(), key=lambda g: -g["ms"])[:top]


def device_label(p: dict) -> str:
    env = p["env"]
    return f"{env['device_kind']} ({env['device_name']})"


def _short(name: str, n: int = 70) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _lat(p: dict) -> str:
    lat = p["latency"]
    return (f"{lat['median_ms']:.2f} ms median (min {lat['min_ms']:.2f}, max {lat['max_ms']:.2f}, N={lat['n']}) "
            f"per step = {p['passes']} pass(es); {p['per_pass_ms']:.2f} ms per pass")


def print_terminal(p: dict, meta: dict, console: Console | None = None) -> None:
    c = console or Console(width=None if Console().is_terminal else 150)
    c.print(f"[bold]optbot profile[/bold] {meta['workload']} · preset {meta['preset']} · {p['env']['device_kind']} "
            f"· {meta['dtype']} · shape {meta['shape']} · engine {meta['engine']} @ {p['env']['engine_sha'][:12]}")
    c.print(f"measured on: {device_label(p)} · torch {p['env']['torch']} · triton {p['env']['triton']}")
    c.print(f"latency: {_lat(p)}")
    c.print(f"mode: {_mode(p)}")
    for line in compile_lines(p):
        c.print(line)
    idle = "n/a on cpu" if p["idle_ms"] is None else f"{p['idle_ms']:.2f} ms (profiled: {p['profiled_idle_ms']:.2f} ms)"
    if p["device"] == "cpu":
        c.print("note: on cpu the profiled step includes Python and profiler overhead between ops; "
                "categories add up op self-times only")
    c.print(f"step: {p['total_ms']:.2f} ms unprofiled, {p['profiled_span_ms']:.2f} ms under the profiler · {p['launches']} {'kernel launches' if p['device'] == 'cuda' else 'ops'} "
            f"· device idle (unprofiled median minus kernel time: it carries the latency's spread): {idle}")
    t = Table(title=f"time by category ({p['device']})")
    t.add_column("category")
    t.add_column("ms", justify="right")
    t.add_column("% of step", justify="right")
    for cat, ms in sorted(p["categories"].items(), key=lambda kv: -kv[1]):
        if ms:
            t.add_row(cat, f"{ms:.3f}", f"{100 * ms / max(p['total_ms'], 1e-9):.1f}")
    c.print(t)
    t = Table(title=f"top {'kernels' if p['device'] == 'cuda' else 'ops'} by module ({p['device']})")
    for col in ("kernel" if p["device"] == "cuda" else "op", "category", "module", "calls", "ms", "%"):
        t.add_column(col, justify="right" if col in ("calls", "ms", "%") else "left", overflow="fold")
    for g in grouped_kernels(p, 20):
        t.add_row(_short(g["name"], 60), g["category"], g["module"], str(g["calls"]), f"{g['ms']:.3f}",
                  f"{100 * g['ms'] / max(p['total_ms'], 1e-9):.1f}")
    c.print(t)
    r = p["roofline"]
    c.print(f"roofline ({p['device']}, ceilings measured in this run: matmul {r['peak_matmul_tflops']} TFLOP/s "
            f"{p['peaks']['matmul_dtype']}, copy {r['peak_copy_gbps']} GB/s):")
    c.print(f"  linear {r['linear_tflop']:.4g} TFLOP + attention {r['attention_tflop']:.4g} TFLOP -> compute floor "
            f"{r['compute_floor_ms']:.3f} ms{_fp8_floor_note(r)}; GEMM at {_fmt(r['gemm_pct_of_peak'])}% of peak, attention at "
            f"{_fmt(r['attention_pct_of_peak'])}%")
    c.print(f"  memory-bound ops move ~{r['memory_bound_gb']:.4g} GB ({r.get('memory_bound_basis', 'estimated from op shapes')}) "
            f"-> floor {r['memory_bound_floor_ms']:.3f} ms; achieved {_fmt(r['memory_bound_pct_of_peak'])}% of copy bandwidth")


def _fp8_floor_note(r: dict) -> str:
    """A quantized profile's floor has its linear FLOPs at the FP8 ceiling: say so, and at what rate."""
    return f" (linear at {r['gemm_peak_tflops']} TFLOP/s FP8)" if "TFLOP/s FP8" in r.get("compute_floor_basis", "") else ""


def _mode(p: dict) -> str:
    """The production mode the step ran in (a profile from before modes says nothing: eager)."""
    mode = p.get("mode", "eager")
    return mode + (f" ({p['compiled']})" if p.get("compiled") else "")


def compile_lines(p: dict) -> list[str]:
    """A compiled step's graphs and graph breaks (runner/modes.compile_report): inductor fuses nothing
    across a break, so a step split into many graphs keeps kernels a whole-model compile would fuse."""
    r = p.get("compile_report")
    if not r:
        return []
    breaks = "graph breaks not recorded (TORCH_LOGS without graph_breaks)" if r["breaks"] is None else \
        f"{r['breaks']} graph break(s)"
    lines = [f"compiled: {r['graphs']} graph(s), {breaks}"]
    lines += [f"  break x{b['count']} at {b['at']}: {b['why']}" for b in r["top"]]
    return lines


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x}"


def markdown(p: dict, meta: dict) -> str:
    r = p["roofline"]
    env = p["env"]
    idle = "n/a on cpu" if p["idle_ms"] is None else f"{p['idle_ms']:.3f} ms (under the profiler: {p['profiled_idle_ms']:.3f} ms)"
    lines = [
        f"# optbot profile: {meta['workload']} ({meta['preset']} preset, {env['device_kind']})",
        "",
        f"- measured on: **{device_label(p)}**, dtype {meta['dtype']}, shape {meta['shape']}",
        f"- latency: {_lat(p)}",
        f"- mode: {_mode(p)}",
        *[f"- {ln.strip()}" for ln in compile_lines(p)],
        f"- step: {p['total_ms']:.3f} ms unprofiled, {p['profiled_span_ms']:.3f} ms under the profiler, {p['launches']} {'kernel launches' if p['device'] == 'cuda' else 'ops'}, "
        f"device idle (unprofiled median minus kernel time: it carries the latency's spread): {idle}",
        f"- engine: {meta['engine']} @ `{env['engine_sha']}` (model loaded from `{env['engine_file']}`)",
        f"- command: `{meta['command']}`",
        "",
        "## Time by category",
        "",
        "| category | ms | % of step |",
        "|---|---:|---:|",
    ]
    for cat, ms in sorted(p["categories"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {cat} | {ms:.3f} | {100 * ms / max(p['total_ms'], 1e-9):.1f} |")
    lines += ["", f"## Top {'kernels' if p['device'] == 'cuda' else 'ops'} by module", "",
              "| kernel | category | module | calls | ms |", "|---|---|---|---:|---:|"]
    for g in grouped_kernels(p, 30):
        lines.append(f"| `{_short(g['name'], 90)}` | {g['category']} | `{g['module']}` | {g['calls']} | {g['ms']:.3f} |")
    lines += ["", "## Roofline (ceilings measured in this run)", "",
              f"| figure | value |", "|---|---:|",
              f"| matmul ceiling ({p['peaks']['matmul_dtype']}, {'x'.join(map(str, p['peaks']['matmul_shape']))}) | {r['peak_matmul_tflops']} TFLOP/s |",
              f"| copy ceiling | {r['peak_copy_gbps']} GB/s |",
              f"| linear FLOPs | {r['linear_tflop']:.4g} TFLOP |",
              f"| attention FLOPs | {r['attention_tflop']:.4g} TFLOP |",
              f"| compute floor ({r.get('compute_floor_basis', 'all FLOPs at the matmul ceiling')}) | {r['compute_floor_ms']:.3f} ms |",
              f"| GEMM achieved | {_fmt(r['gemm_tflops_achieved'] and round(r['gemm_tflops_achieved'], 1))} TFLOP/s ({_fmt(r['gemm_pct_of_peak'])}%) |",
              f"| attention achieved | {_fmt(r['attention_tflops_achieved'] and round(r['attention_tflops_achieved'], 1))} TFLOP/s ({_fmt(r['attention_pct_of_peak'])}%) |",
              f"| memory-bound bytes ({r.get('memory_bound_basis', 'estimated from op shapes')}) | {r['memory_bound_gb']:.4g} GB |",
              f"| memory-bound floor | {r['memory_bound_floor_ms']:.3f} ms |",
              f"| memory-bound achieved | {_fmt(r['memory_bound_gbps_achieved'] and round(r['memory_bound_gbps_achieved'], 1))} GB/s ({_fmt(r['memory_bound_pct_of_peak'])}%) |",
              "", "## Environment", "", "```"]
    lines += [f"{k}: {v}" for k, v in env.items()]
    lines += ["```", ""]
    return "\n".join(lines)


def plot_png(p: dict, meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [1, 2]})
    cats = [(c, ms) for c, ms in sorted(p["categories"].items(), key=lambda kv: -kv[1]) if ms > 0]
    ax1.bar([c for c, _ in cats], [ms for _, ms in cats], color="tab:blue")
    ax1.set_ylabel(f"ms ({p['device']})")
    ax1.set_title("time by category")
    ax1.tick_params(axis="x", rotation=45)
    by_mod: dict[str, float] = defaultdict(float)
    for k in p["kernels"]:
        by_mod[module_pattern(k["module"])] += k["ms"]
    top = sorted(by_mod.items(), key=lambda kv: -kv[1])[:15][::-1]
    ax2.barh([m for m, _ in top], [ms for _, ms in top], color="tab:orange")
    ax2.set_xlabel(f"ms ({p['device']})")
    ax2.set_title("time by module (repeated blocks merged)")
    ax2.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"{meta['workload']} {meta['preset']} · {device_label(p)} · {meta['dtype']} · "
                 f"{p['latency']['median_ms']:.2f} ms/step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
