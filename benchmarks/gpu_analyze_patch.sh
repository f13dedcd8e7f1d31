#!/usr/bin/env bash
# `optbot analyze` (profile + detectors) of a workload's engine WITH a candidate patch applied, on the
# H200: what is left after a stack, from the profile (issue 20: "which opportunities remain").
#   bash benchmarks/gpu_analyze_patch.sh WORKLOAD PATCH [analyze options...]
# e.g. bash benchmarks/gpu_analyze_patch.sh qwen-image benchmarks/results/h200-qwen-modes-20261204/qwen-image-stack.patch
# Carry .whl/ (the diffusers sdist, gitpython). The pinned engine is materialized, cloned to /tmp,
# the patch committed there, and analyzed as the fork `diffusers=/tmp/...`.
# Writes analyze-<workload>-patched.{json,md,txt} and profile-<workload>-patched.json under $RES (default benchmarks/results/<gpu>-<date>/),
# and copies them to $OUT when set. MODE=compile (any production mode): `optbot profile --mode MODE` of
# the patched engine instead (no analysis: the analyzer reads eager profiles), written as
# profile-<workload>-patched-<mode>.{json,md,txt} (TRACE=1: and .trace.json.gz, the chrome trace: where the
# host spends a compiled step's time).
set -euo pipefail
wl=$1 patch=$2; shift 2
RES="${RES:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-$(date +%Y%m%d)}"
mkdir -p "$RES"
[ -n "${OPTBOT_WHEELS_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1
mkdir -p "$OPTBOT_HOME/downloads" && cp -n .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null || true
engine=${ENGINE:-diffusers}
src=$(python3 -m bot engine init "$engine" | awk '$1 == "repository" {print $2}')
fork=/tmp/optbot-patched-$wl
rm -rf "$fork" && git clone -q "$src" "$fork"
git -C "$fork" apply --index "$PWD/$patch"
git -C "$fork" -c user.name=optbot -c user.email=optbot@localhost commit -qm "candidate: $patch"
start=$(date +%s)
if [ -n "${MODE:-}" ]; then
  base="$RES/profile-$wl-patched-${MODE//[:+]/-}"
  python3 -m bot profile "$wl" --engine "$engine=$fork" --preset "${PRESET:-full}" --device "${DEVICE:-cuda}" \
    --mode "$MODE" --json "$base.json" "$@" > "$base.txt" 2>&1 && rc=0 || rc=$?
  echo "profile $wl + $patch in $MODE: exit $rc, $(( $(date +%s) - start )) s wall" | tee -a "$base.txt"
  if [ -n "${TRACE:-}" ] && [ $rc = 0 ]; then  # the chrome trace too (host ops and kernels on one timeline)
    t=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['trace'])" "$base.json")
    cp "$t" "$base.trace.json.gz"
  fi
  [ -n "${OUT:-}" ] && cp "$base".* "$OUT/" 2>/dev/null
  tail -40 "$base.txt"
  exit $rc
fi
python3 -m bot analyze "$wl" --engine "$engine=$fork" --preset "${PRESET:-full}" --device "${DEVICE:-cuda}" \
  --top 40 --json "$RES/analyze-$wl-patched.json" "$@" > "$RES/analyze-$wl-patched.txt" 2>&1 && rc=0 || rc=$?
if [ $rc = 0 ]; then  # the profile behind the analysis (its kernel table and categories), beside it
  d=$(dirname "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['profile']['source'])" "$RES/analyze-$wl-patched.json")")
  cp "$d/profile.json" "$RES/profile-$wl-patched.json"
fi
echo "analyze $wl + $patch: exit $rc, $(( $(date +%s) - start )) s wall" | tee -a "$RES/analyze-$wl-patched.txt"
[ -n "${OUT:-}" ] && cp "$RES"/analyze-"$wl"-patched.* "$RES"/profile-"$wl"-patched.* "$OUT/" 2>/dev/null
tail -30 "$RES/analyze-$wl-patched.txt"
exit $rc
