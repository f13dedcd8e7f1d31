#!/usr/bin/env bash
# `optbot analyze` on the H200 at the full preset: profile + graph capture + detectors, per workload.
#
# Usage on the device machine (repo root, with .whl/ carried), one workload per call keeps each
# call well inside 10 minutes:
#   bash benchmarks/gpu_analyze.sh flux2
#   bash benchmarks/gpu_analyze.sh qwen-image
#   bash benchmarks/gpu_analyze.sh                 # both, in one call
# FINGERPRINTS=1 checks every CFG-invariant finding against both passes' values (a host sync per op).
#   FINGERPRINTS=1 bash benchmarks/gpu_analyze.sh wan2.1 sd3.5-large lumina2   # the three new models
# PROFILE_DIR=benchmarks/results/h200-20261129 reuses profile-<workload>-full.json from there
# (measured on the same H200 kind) instead of profiling again; the analysis names its source.
# Writes analyze-<workload>-full.{json,md,txt} under $OUT (default benchmarks/results/<gpu>-<date>/).
set -euo pipefail
OUT="${OUT:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-$(date +%Y%m%d)}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  [ -n "${OPTBOT_WHEELS_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1
mkdir -p "$OPTBOT_HOME/downloads" && cp -n .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi-analyze.txt"

workloads=("$@")
[[ ${#workloads[@]} -eq 0 ]] && workloads=(flux2 qwen-image)
for wl in "${workloads[@]}"; do
  extra=()
  if [[ -n "${PROFILE_DIR:-}" && -f "$PROFILE_DIR/profile-$wl-full.json" ]]; then
    extra=(--profile "$PROFILE_DIR/profile-$wl-full.json")
  fi
  start=$(date +%s)
  [[ -n "${FINGERPRINTS:-}" ]] && extra+=(--fingerprints)
  python3 -m bot analyze "$wl" --preset full --device cuda --top 40 --json "$OUT/analyze-$wl-full.json" "${extra[@]}" \
    > "$OUT/analyze-$wl-full.txt" 2>&1 || { tail -60 "$OUT/analyze-$wl-full.txt"; exit 1; }
  echo "analyze $wl: $(( $(date +%s) - start )) s wall" | tee -a "$OUT/wall-analyze.txt"
  # keep the captured graph next to the analysis (compact JSON; a few MB)
  g=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['meta'].get('graph_file',''))" "$OUT/analyze-$wl-full.json")
  [[ -n "$g" && -f "$g" ]] && gzip -c "$g" > "$OUT/graph-$wl-full.json.gz"
done
python3 - "$OUT" "${workloads[@]}" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for wl in sys.argv[2:]:
    a = json.loads((out / f"analyze-{wl}-full.json").read_text())
    print(f"== {wl}: profile on {a['profile']['device']}, step {a['profile']['total_ms']:.1f} ms, "
          f"graph {a['graph']['ops']} ops, coverage {100 * a['profile']['coverage']:.0f}%, capture {a['meta'].get('capture_s')} s")
    for i, o in enumerate(a["opportunities"][:15], 1):
        print(f"{i:3d} {o['kind']:<22} {o['detail']:<24} {o['location']['module_pattern'][:44]:<44} "
              f"{o['gain_ms']:9.3f} ms {o['gain_pct']:6.2f}%  conf {o['confidence']:.2f}")
PY
