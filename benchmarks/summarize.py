"""Summarize a results folder (profile-*.json, bench-*.json) as markdown tables.

    python benchmarks/summarize.py benchmarks/results/h200-20261129 > .../summary.md

Every number printed comes from the JSON files, which the commands in their "command" fields wrote.
"""
from __future__ import annotations

import sys
from pathlib import Path

from profile_places import load  # gzipped or plain (benchmarks/results/README.md)


def main(folder: str) -> None:
    d = Path(folder)
    def results(prefix):
        # large results are stored gzipped (benchmarks/results/README.md)
        found = [*d.glob(f"{prefix}-*.json"), *d.glob(f"{prefix}-*.json.gz")]
        return sorted(f for f in found if ".job." not in f.name and ".result." not in f.name)

    profiles = results("profile")
    if profiles:
        print("## Profiles (one step, eager)\n")
        print("| workload | device | step ms | per pass ms | gemm | attention | norm | elementwise | copy | launches | idle ms | compute floor ms |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for f in profiles:
            p = load(f)
            c = p["categories"]
            idle = p.get("idle_ms")
            print(f"| {p['meta']['workload']} ({p['meta']['preset']}) | {p['env']['device_name']} | {p['total_ms']:.1f} | "
                  f"{p['per_pass_ms']:.1f} | {c['gemm']:.1f} | {c['attention']:.1f} | {c['normalization']:.1f} | "
                  f"{c['elementwise']:.1f} | {c['copy']:.1f} | {p['launches']} | "
                  f"{'-' if idle is None else f'{idle:.1f}'} | {p['roofline']['compute_floor_ms']:.1f} |")
        print()
    for f in results("bench"):
        b = load(f)
        print(f"## Bench: {b['workload']} ({b['preset']}, {b['dtype']}, {b['env'].get('device_name')})\n")
        print("| variant | mode | step ms | min–max | N | per pass ms | vs upstream eager | outputs | notes |")
        print("|---|---|---:|---|---:|---:|---:|---|---|")
        for r in b["rows"]:
            ok = "-" if r["correct"] is None else ("ok" if r["correct"] else "WRONG")
            med = "-" if r["median_ms"] is None else f"{r['median_ms']:.1f}"
            spread = "-" if r["median_ms"] is None else f"{r['min_ms']:.1f}–{r['max_ms']:.1f}"
            pp = "-" if r["per_pass_ms"] is None else f"{r['per_pass_ms']:.1f}"
            sp = "-" if r["speedup"] is None else f"{r['speedup']:.3f}x"
            print(f"| {r['variant']} | {r['mode']} | {med} | {spread} | {r['n'] or '-'} | {pp} | {sp} | {ok} | "
                  f"{(r['error'] or r['correctness'])[:120]} |")
        if b.get("roofline_ms") is not None:
            print(f"| roofline | compute floor | {b['roofline_ms']:.1f} | - | - | {b['roofline_ms'] / b['passes']:.1f} | - | - | "
                  f"{b['roofline_basis']} |")
        print(f"\ncommand: `{b['command']}`\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
