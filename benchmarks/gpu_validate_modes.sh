#!/usr/bin/env bash
# The validator in every production mode on the H200 (issue 20), one candidate per call:
#   bash benchmarks/gpu_validate_modes.sh NAME PATCH [WORKLOAD] [validate options...]
# e.g. bash benchmarks/gpu_validate_modes.sh views tests/validate/adversarial/gpu_views_under_compile.patch
# Full preset, bf16, default modes (eager, graph, compile, compile+graph). Writes
# validate-NAME.json and .txt (verdict, every mode's row, wall time) under $OUT (default
# benchmarks/results/<gpu>-<date>/).
set -uo pipefail
name=$1; patch=$2; wl=${3:-flux2}; shift 3 2>/dev/null || shift $#
OUT="${OUT:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-$(date +%Y%m%d)}"
mkdir -p "$OUT"
[ -n "${OPTBOT_WHEELS_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" OPTBOT_RUNS_DIR="${OPTBOT_RUNS_DIR:-/tmp/optbot-runs}" PYTHONUNBUFFERED=1
mkdir -p "$OPTBOT_HOME/downloads" && cp -n .whl/*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null
start=$(date +%s)
python3 -m bot validate "$wl" --preset full --device cuda --candidate "$patch" "$@" \
  --json "$OUT/validate-$name.json" > "$OUT/validate-$name.txt" 2>&1
rc=$?
echo "validate $wl $name: exit $rc, $(( $(date +%s) - start )) s wall" | tee -a "$OUT/validate-$name.txt"
grep -v '^·' "$OUT/validate-$name.txt" | tail -n 30
