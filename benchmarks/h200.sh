#!/usr/bin/env bash
# One self-contained GPU command: what optbot measures on the H200, in one call.
#
#   bash benchmarks/h200.sh profile bench [validate analyze sglang store ...]
#
# Each word is a step below (or a benchmarks/gpu_<word>.sh script). Results go to a staging folder
# ($RES, default benchmarks/results/<gpu>-<date>/) and, when $OUT is set (the device tool), are packed
# into $OUT/results.tar.gz (the tool brings back at most 8 files). A short table is printed last.
#
# The machine has torch and triton but no registry access: .whl/ carries gitpython (+gitdb, smmap)
# for the bot and the diffusers source distribution from which the engine repository is
# materialized (the same deterministic commit as on any other machine).
set -uo pipefail
RES="${RES:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-$(date +%Y%m%d)}"
mkdir -p "$RES"
[ -n "${OPTBOT_WHEELS_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1 RES
mkdir -p "$OPTBOT_HOME/downloads" && cp .whl/*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null
ls .whl/*.whl.keep >/dev/null 2>&1 && cp .whl/*.whl.keep "$OPTBOT_HOME/downloads/"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$RES/nvidia-smi.txt"
cat "$RES/nvidia-smi.txt"
status=0

timed() {  # timed NAME cmd...: run, log to $RES/NAME.txt, record wall time
  local name=$1; shift
  local start=$(date +%s)
  "$@" > "$RES/$name.txt" 2>&1
  local rc=$?
  echo "$name: rc=$rc $(( $(date +%s) - start )) s wall" | tee -a "$RES/wall.txt"
  [ $rc -eq 0 ] || { tail -25 "$RES/$name.txt"; status=1; }
}

for what in "$@"; do
  case "$what" in
    profile)
      for wl in flux2 qwen-image; do
        timed "profile-$wl-full" python3 -m bot profile "$wl" --preset full --device cuda --json "$RES/profile-$wl-full.json"
      done ;;
    bench)
      for wl in flux2 qwen-image; do
        timed "bench-$wl-full" python3 -m bot bench "$wl" --preset full --device cuda ${BENCH_ARGS:-} --json "$RES/bench-$wl-full.json"
      done ;;
    *)
      if [ -f "benchmarks/gpu_$what.sh" ]; then timed "$what" bash "benchmarks/gpu_$what.sh"
      else echo "unknown step $what"; status=1; fi ;;
  esac
done

python3 benchmarks/summarize.py "$RES" | tee "$RES/summary.md"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/results.tar.gz" -C "$(dirname "$RES")" "$(basename "$RES")"
  cp "$RES/summary.md" "$OUT/"
fi
exit $status
