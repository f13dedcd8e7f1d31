#!/usr/bin/env bash
# One self-contained GPU command: everything optbot measures on the H200, in one call.
#
# Usage on the device machine (from the repo root, with .whl/ carried):
#   bash benchmarks/h200.sh profile            # issue 2: full-preset profiles of both workloads
# Writes JSON/markdown/PNG results under $OUT (or benchmarks/results/h200-<date>/ when OUT is unset)
# and prints a short table last.
#
# The machine has torch and triton but no registry access: .whl/ carries gitpython (+gitdb,
# smmap) for the bot, and the diffusers source distribution from which the engine repository is
# materialized (same deterministic commit as on any other machine).
set -euo pipefail
what="${1:-profile}"
OUT="${OUT:-benchmarks/results/h200-$(date +%Y%m%d)}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPTBOT_HOME=/tmp/optbot-home PYTHONUNBUFFERED=1
mkdir -p "$OPTBOT_HOME/downloads" && cp .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.txt"

if [[ "$what" == profile* ]]; then
  for wl in flux2 qwen-image; do
    start=$(date +%s)
    python3 -m bot profile "$wl" --preset full --device cuda --json "$OUT/profile-$wl-full.json" \
      > "$OUT/profile-$wl-full.txt" 2>&1 || { tail -40 "$OUT/profile-$wl-full.txt"; exit 1; }
    echo "$wl: $(( $(date +%s) - start )) s wall" | tee -a "$OUT/wall.txt"
  done
  python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print(f"{'workload':<11} {'step ms':>9} {'pass ms':>9} {'profiled':>9} {'gemm':>7} {'attn':>7} {'norm':>7} {'elem':>7} {'copy':>7} {'launch':>7} {'idle':>7} {'floor':>7}")
for wl in ("flux2", "qwen-image"):
    p = json.loads((out / f"profile-{wl}-full.json").read_text())
    c = p["categories"]
    print(f"{wl:<11} {p['step_ms']:9.1f} {p['per_pass_ms']:9.1f} {p['total_ms']:9.1f} {c['gemm']:7.1f} {c['attention']:7.1f} "
          f"{c['normalization']:7.1f} {c['elementwise']:7.1f} {c['copy']:7.1f} {p['launches']:7d} {p['idle_ms']:7.1f} "
          f"{p['roofline']['compute_floor_ms']:7.1f}")
print("device:", p["env"]["device_name"], "driver", p["env"]["driver"], "torch", p["env"]["torch"], "triton", p["env"]["triton"])
PY
fi
