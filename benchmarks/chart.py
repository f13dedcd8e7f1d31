"""Chart of `optbot bench` results: per-step latency by production mode, upstream vs the optimized
branch (and other engines), with the compute floor and the best upstream torch.compile row marked.

    python benchmarks/chart.py OUT.png bench-flux2.json [bench-qwen-image.json ...]

One panel per bench JSON (one `optbot bench` run each). Every bar is a row of that JSON, labelled
with its median; rows that failed are drawn as an "x" with their error's first words. Nothing is
computed here but the layout.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

COLORS = {"upstream": "#8a8a8a", "candidate": "#2a9d6f"}
OTHER = ["#2a9d6f", "#4a78b5", "#d08c2e", "#8e5ea2"]  # several candidates / engines, in row order
LABELS = {"upstream": "upstream", "candidate": "optbot branch"}


def _modes(rows: list[dict]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        if r["mode"] not in seen and r["mode"] != "-":
            seen.append(r["mode"])
    return seen


def panel(ax, bench: dict) -> None:
    rows = bench["rows"]
    modes = _modes(rows)
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows)]
    width = 0.8 / max(1, len(variants))
    labelled: set[str] = set()
    for vi, v in enumerate(variants):
        for mi, mode in enumerate(modes):
            r = next((x for x in rows if x["variant"] == v and x["mode"] == mode), None)
            if r is None:
                continue
            x = mi + (vi - (len(variants) - 1) / 2) * width
            if r.get("median_ms"):
                ax.bar(x, r["median_ms"], width * 0.95, color=COLORS.get(v, OTHER[vi % len(OTHER)]),
                       label=None if v in labelled else LABELS.get(v, v))
                labelled.add(v)
                ax.text(x, r["median_ms"], f"{r['median_ms']:.0f}", ha="center", va="bottom", fontsize=7)
            elif r.get("error"):
                ax.plot([x], [0], marker="x", color="#c0392b")
                ax.text(x, 10, r["error"].split(":")[0][:18], rotation=90, fontsize=6, ha="center", va="bottom")
    if bench.get("roofline_ms"):
        ax.axhline(bench["roofline_ms"], color="#c0392b", ls="--", lw=1)
        ax.text(len(modes) - 0.5, bench["roofline_ms"], f"compute floor {bench['roofline_ms']:.0f}", fontsize=7,
                ha="right", va="bottom", color="#c0392b")
    if bench.get("roofline_fp8_ms") and bench.get("quant"):  # a --quant run: the FP8 floor is the one that binds
        ax.axhline(bench["roofline_fp8_ms"], color="#c0392b", ls="-.", lw=1)
        ax.text(len(modes) - 0.5, bench["roofline_fp8_ms"], f"compute floor, FP8 linear {bench['roofline_fp8_ms']:.0f}",
                fontsize=7, ha="right", va="bottom", color="#c0392b")
    if bench.get("best_compile_ms"):
        ax.axhline(bench["best_compile_ms"], color="#555", ls=":", lw=1)
        what = "the bar" if bench.get("bar_note") else "best upstream compile"  # bar_note: no compile row ran
        ax.text(-0.5, bench["best_compile_ms"] * 1.12, f"{what} ({bench['best_compile_mode']}) "
                f"{bench['best_compile_ms']:.0f}", fontsize=7, ha="left", va="bottom", color="#555")
    ax.set_xticks(range(len(modes)))
    ax.set_xticklabels([m.replace("+", "\n+") for m in modes], fontsize=7)
    env = bench.get("env", {})
    quant = "".join(f" (candidates at {q.partition('+')[2]})" for q in bench.get("quant") or {})
    ax.set_title(f"{bench['workload']} · {bench['preset']} · {bench['dtype']}{quant} · "
                 f"{env.get('device_name', bench['device'])}", fontsize=9)
    ax.set_ylabel("ms per step (median)")
    ax.set_ylim(0, max((r.get("median_ms") or 0) for r in rows) * 1.3)  # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper right", ncol=2)


def main(out: str, files: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = [json.loads(Path(f).read_text()) for f in files]
    fig, axes = plt.subplots(1, len(benches), figsize=(6.5 * len(benches), 3.6), dpi=110, squeeze=False)
    for ax, b in zip(axes[0], benches):
        panel(ax, b)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print("wrote", out)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
