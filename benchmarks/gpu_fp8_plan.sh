#!/usr/bin/env bash
# The FP8 plan's GPU items in one call (benchmarks/results/README.md, "Next" of the twenty-first session),
# so that one machine start answers all of them: carry .whl-sgl-b and .sgl-engine, then
#   WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh cmd bash benchmarks/gpu_fp8_plan.sh
# Steps, in order of what they decide, each skipped when it cannot finish before DEADLINE seconds
# (default 540: a call may run 600) and each packed as $OUT/<step>.tgz as soon as it ends (the device
# returns at most 8 files, and a call cut short still returns the steps that finished):
#   bench-s8      the Qwen-Image FP8 stack with qwen-image-fp8-norm-quant, one bench (the H200's number
#                 for issue 16's 200 ms; 206.03 on an H100)
#   profile-f3    FLUX.2's FP8 stack under compile + CUDA graph (never profiled: 34 ms above its floor)
#   profile-s8    the Qwen-Image stack under compile + CUDA graph (what the 1.2x still needs)
#   eager-s7d, eager-s8   both Qwen-Image stacks' eager profiles (the 241 ms eager difference)
# and, asked for by name in a call of its own (551 s on an H100 for the same bench of two stacks), with
# STEPS=bench-f1 DEADLINE=590: FLUX.2's FP8 stack
# with flux2-fp8-norm-quant (f1.patch, the entry alone) against the three-entry stack (f3.patch) in one bench.
# STEPS="a b ..." runs those steps only. PLAN_DRY=1 prints the steps instead of running them. Writes
# $OUT/steps.txt (each step's exit and wall).
set -uo pipefail
OUT="${OUT:-benchmarks/results/$(bash benchmarks/gpu_tag.sh 2>/dev/null || echo gpu)-fp8-plan-$(date +%Y%m%d)}"
mkdir -p "$OUT"
DEADLINE="${DEADLINE:-540}"
export OPTBOT_WHEELS_INSTALLED=1 PYTHONUNBUFFERED=1
S8=benchmarks/results/h100-qwen-fp8-normquant-20261206/s8.patch
S7D=benchmarks/results/h100-qwen-fp8-onepass-20261206/s7d.patch
F3=benchmarks/results/h100-flux2-fp8-20261206/f3.patch
F1=benchmarks/results/cpu-flux2-fp8-normquant-20261206/f1.patch
STEPS="${STEPS:-bench-s8 profile-f3 profile-s8 eager-s8 eager-s7d}"
t0=$(date +%s)
work=/tmp/optbot-fp8-plan
[ -n "${PLAN_DRY:-}" ] || nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/nvidia-smi.txt"

step() {  # step NAME EXPECTED_S COMMAND...: run it with RES=$work/NAME (no copy to $OUT), pack it
  local name=$1 need=$2
  shift 2
  [[ " $STEPS " == *" $name "* ]] || return 0
  local left=$(( DEADLINE - ($(date +%s) - t0) ))
  if (( left < need )); then
    echo "$name: skipped, $left s left of $DEADLINE, needs about $need" | tee -a "$OUT/steps.txt"
    return
  fi
  if [ -n "${PLAN_DRY:-}" ]; then
    echo "$name (about $need s, at most $left): $*" | tee -a "$OUT/steps.txt"
    return
  fi
  mkdir -p "$work/$name"
  local start=$(date +%s)
  RES="$work/$name" OUT="" timeout "$left" "$@" > "$work/$name/log.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.txt"
  tar czf "$OUT/$name.tgz" -C "$work" "$name"
}

step bench-s8 240 env TAG=s8 bash benchmarks/gpu_bench.sh qwen-image --quant fp8 --candidate "$S8" \
  --modes eager --other-modes eager,compile+graph --iters 3
step profile-f3 90 env MODE=compile+graph bash benchmarks/gpu_analyze_patch.sh flux2 "$F3" --quant fp8 --iters 5
step profile-s8 80 env MODE=compile+graph bash benchmarks/gpu_analyze_patch.sh qwen-image "$S8" --quant fp8 --iters 5
step eager-s8 60 env MODE=eager bash benchmarks/gpu_analyze_patch.sh qwen-image "$S8" --quant fp8 --iters 3
step eager-s7d 60 env MODE=eager bash benchmarks/gpu_analyze_patch.sh qwen-image "$S7D" --quant fp8 --iters 3
step bench-f1 520 env TAG=f1 bash benchmarks/gpu_bench.sh flux2 --quant fp8 --candidate "$F1" --candidate "$F3" \
  --modes eager --other-modes eager,compile+graph --iters 3
cat "$OUT/steps.txt"
