"""Join an `optbot bench` JSON with an nvidia-smi clock/power log taken beside it.

    python3 benchmarks/clocks.py bench.json clocks.csv

The log is what benchmarks/gpu_bench.sh writes with CLOCKS=1 (`nvidia-smi --query-gpu=timestamp,
clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,nounits
-lms 200`). For every bench row that was timed, the samples inside its timed window give the median
SM clock and power, the peak temperature and the throttle-reason masks seen: whether a mode's slower
kernels are the clock (a power- or thermal-capped GPU) or the kernels themselves.
"""
from __future__ import annotations

import csv
import json
import statistics
import sys
from datetime import datetime


def read_log(path: str) -> list[tuple[float, float, float, float, str]]:
    """(unix time, SM MHz, power W, temperature C, throttle mask) per sample; unparsable lines skipped."""
    rows = []
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if len(rec) < 6 or rec[0].strip() == "timestamp":
                continue
            try:
                # nvidia-smi's local time, "2026/12/04 19:40:01.123"; the machine's clock is UTC
                t = datetime.strptime(rec[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((t, float(rec[1]), float(rec[3]), float(rec[4]), rec[5].strip()))
            except ValueError:
                continue
    return rows


def main(bench_json: str, log: str) -> int:
    bench = json.load(open(bench_json))
    samples = read_log(log)
    if not samples:
        print(f"{log}: no clock samples (was nvidia-smi there?)")
        return 1
    print(f"GPU clocks during each timed window ({len(samples)} samples of {log}):")
    print(f"{'variant':24} {'mode':18} {'ms/step':>8} {'n':>4} {'SM MHz':>7} {'W':>6} {'max C':>6}  throttle masks")
    for r in bench["rows"]:
        w = r.get("window")
        if not w or r.get("median_ms") is None:
            continue
        inside = [s for s in samples if w[0] <= s[0] <= w[1]]
        if not inside:
            print(f"{r['variant']:24} {r['mode']:18} {r['median_ms']:8.2f} {0:4d}  (no samples in its window)")
            continue
        masks = ",".join(sorted({s[4] for s in inside}))
        print(f"{r['variant']:24} {r['mode']:18} {r['median_ms']:8.2f} {len(inside):4d} "
              f"{statistics.median(s[1] for s in inside):7.0f} {statistics.median(s[2] for s in inside):6.1f} "
              f"{max(s[3] for s in inside):6.0f}  {masks}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
