"""Print an optimize run's steps from its state.json, and how to continue it when it paused: the
tail of the device scripts (benchmarks/gpu_optimize.sh, benchmarks/gpu_template.sh).

    python3 benchmarks/run_steps.py RUN_DIR "bash benchmarks/gpu_optimize.sh"
"""
import json
import sys
from pathlib import Path

run, again = Path(sys.argv[1]), sys.argv[2]
st = json.loads((run / "state.json").read_text())
total = sum(s["seconds"] for s in st["steps"].values())
print(f"run {st['run_id']}: finished={st['finished']} attempts={st['attempts']} step seconds total={total:.0f}")
for name, s in st["steps"].items():
    print(f"  {name:<9} {s['status']:<8} {s['seconds']:8.1f} s  {s['summary'][:140]}")
if not st["finished"]:
    print(f"continue with: {again} {st['workload']} {st['run_id']}")
