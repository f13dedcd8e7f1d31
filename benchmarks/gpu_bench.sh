#!/usr/bin/env bash
# `optbot bench` on the H200 as one self-contained command (wheels from .whl/, carried):
#   bash benchmarks/gpu_bench.sh WORKLOAD [bench options...]
# e.g. bash benchmarks/gpu_bench.sh flux2 --candidate kernel_store/flux2-norm-modulate/patch.diff --with-engine sglang
# Writes bench-<workload>-<tag>.json/.md/.txt under $RES (default benchmarks/results/<gpu>-<date>/)
# and, when $OUT is set, copies them there.
set -uo pipefail
wl=$1; shift
tag="${TAG:-run}"
RES="${RES:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-$(date +%Y%m%d)}"
mkdir -p "$RES"
[ -n "${OPTBOT_WHEELS_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1
mkdir -p "$OPTBOT_HOME/downloads" && cp -n .whl/*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null
for f in .whl/*.whl.keep; do [[ -f "$f" ]] && cp -n "$f" "$OPTBOT_HOME/downloads/$(basename "${f%.keep}")"; done
start=$(date +%s)
# CLOCKS=1: log SM clock, power and throttle reasons every 200 ms beside the run; benchmarks/clocks.py
# joins the log with each row's timed window (the JSON's rows[].window)
if [ -n "${CLOCKS:-}" ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,nounits -lms 200 > "$RES/clocks-$wl-$tag.csv" 2>&1 &
  smi=$!
fi
# the log goes to $OUT as it is written: a call that runs past the device's limit still brings it back
python3 -m bot bench "$wl" --preset full --device cuda "$@" --json "$RES/bench-$wl-$tag.json" 2>&1 \
  | tee "$RES/bench-$wl-$tag.txt" ${OUT:+"$OUT/bench-$wl-$tag.partial.txt"} > /dev/null
rc=${PIPESTATUS[0]}
[ -n "${OUT:-}" ] && rm -f "$OUT/bench-$wl-$tag.partial.txt"
if [ -n "${CLOCKS:-}" ]; then
  kill "$smi" 2>/dev/null
  python3 benchmarks/clocks.py "$RES/bench-$wl-$tag.json" "$RES/clocks-$wl-$tag.csv" | tee -a "$RES/bench-$wl-$tag.txt"
fi
echo "bench $wl $tag: exit $rc, $(( $(date +%s) - start )) s wall" | tee -a "$RES/bench-$wl-$tag.txt"
[ -n "${OUT:-}" ] && cp "$RES"/bench-"$wl"-"$tag".* "$RES"/clocks-"$wl"-"$tag".* "$OUT/" 2>/dev/null
tail -25 "$RES/bench-$wl-$tag.txt"
exit $rc
