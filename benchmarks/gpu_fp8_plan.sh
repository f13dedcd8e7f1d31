#!/usr/bin/env bash
# The FP8 plan's GPU items (benchmarks/results/README.md, "Next" of the twenty-sixth session), each step
# one bench or profile, so that one machine start answers as many as fit: carry .whl-sgl-b only (the tree
# plus .whl-sgl-b and .sgl-engine pass one call's 64 MiB; `cmd` needs no SGLang engine), then
#   WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh cmd bash benchmarks/gpu_fp8_plan.sh
# Steps, each skipped when it cannot finish before DEADLINE seconds (default 560: a call may run 600, and
# `gpu_sglang.sh cmd` installs the carried wheels for about 30 s before this starts) and
# each packed as $OUT/<step>.tgz as soon as it ends (the device returns at most 8 files, and a call cut
# short still returns the steps that finished). By default (one call, about 310 s with the install):
#   micro-norm    (about 25 s) qwen-image-fp8-norm-quant's kernel as the store holds it (fp fusion off: no bf16
#                 FMA contraction, 616 instructions a thread) against the kernel s12 ran (--before: BEFORE,
#                 default s12.patch; 584 instructions, contracted): what the unfused rounding costs, and
#                 whether the e4m3 codes come back to eager's (2,317 of 12.6 M differed with the integer
#                 rounding, 505,238 with the contraction: benchmarks/results/h100-fp8-s12-20261207/)
#   bench-s13     (about 260 s) s13.patch (s12 with fp fusion off in its rounding kernels,
#                 cpu-fp8-fpfusion-20261207/) against s12.patch, one bench: predicted within 1 ms of s12
# By name (STEPS="..."):
#   bench-f5      (about 330 s: a call of its own) f5.patch (FLUX.2's flux2-fp8-norm-quant with fp fusion off)
#                 against f4.patch (272.63 ms/step compile + graph on 2026-12-07, 1 element over the atol
#                 then, under the 0.5 that the trusted rewrite's evidence set since)
#   bench-f4x     (about 330 s on an H100) f4 with exact arithmetic against f4: ran 2026-12-07,
#                 benchmarks/results/h100-fp8-s12-20261207/bench-f4x/
#   bench-s11, profile-s11   s11.patch (the merged modulation) against s10.patch, and s11's compile + CUDA
#                 graph profile: ran 2026-12-07 (427 + 71 s), benchmarks/results/h100-fp8-modmerge-20261207/
#   bench-s10, profile-s10   s10 alone (434 s for the bench of one stack on an H100)
#   bench-f2      f2 against the three-entry stack (f3.patch)
#   bench-f2x     f2 with exact arithmetic against f2 (the integer bf16 rounding; superseded by bench-f4x)
#   micro-gelu    (about 20 s) the GELU + quantization kernel against the one BEFORE's stack ran (--before)
#   bench-s12, profile-s12   s12.patch against s11.patch, and s12's compile + graph profile: ran 2026-12-07
#                 (256 + 57 s), benchmarks/results/h100-fp8-s12-20261207/
#   wide-gemv     (about 60 s) the merged modulation's FP8 GEMMs at 1-120 block linears a run (the entry's
#                 6 ran at 78% of the copy ceiling: do wider runs close it?)
# Earlier steps (session 22's: bench-s8, profile-f3, profile-s8, eager-s8, eager-s7d, bench-f1) ran;
# their results are benchmarks/results/h100-fp8-plan-20261206/.
# STEPS="a b ..." runs those steps only. PLAN_DRY=1 prints the steps instead of running them. Writes
# $OUT/steps.txt (each step's exit and wall).
set -uo pipefail
OUT="${OUT:-benchmarks/results/$(bash benchmarks/gpu_tag.sh 2>/dev/null || echo gpu)-fp8-plan-$(date +%Y%m%d)}"
mkdir -p "$OUT"
DEADLINE="${DEADLINE:-560}"
export OPTBOT_WHEELS_INSTALLED=1 PYTHONUNBUFFERED=1
S10=benchmarks/results/cpu-fp8-next-20261206/s10.patch
F2=benchmarks/results/cpu-fp8-next-20261206/f2.patch
S11=benchmarks/results/cpu-fp8-modmerge-20261206/s11.patch
F3=benchmarks/results/h100-flux2-fp8-20261206/f3.patch
F2X=benchmarks/results/cpu-fp8-exact-20261207/f2-exact.patch
S12=benchmarks/results/cpu-fp8-normblocks-20261207/s12.patch
F4=benchmarks/results/cpu-fp8-nativeround-20261207/f4.patch
F4X=benchmarks/results/cpu-fp8-nativeround-20261207/f4-exact.patch
S13=benchmarks/results/cpu-fp8-fpfusion-20261207/s13.patch
F5=benchmarks/results/cpu-fp8-fpfusion-20261207/f5.patch
BEFORE="${BEFORE:-$S12}"  # the stack whose kernels the micros' --before rows run
STEPS="${STEPS:-micro-norm bench-s13}"
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

# the kernel files BEFORE's stack ran (its patch adds them) beside the live ones: the micros' --before
before_kernels() { rm -rf "$work/before-kernels" "$work/before" && mkdir -p "$work/before-kernels" && local root=$PWD \
  && (cd "$work/before-kernels" && git apply --include='src/diffusers/models/optbot_kernels/*' "$root/$BEFORE") \
  && mv "$work/before-kernels/src/diffusers/models/optbot_kernels" "$work/before"; }
[[ ( " $STEPS " == *" micro-norm "* || " $STEPS " == *" micro-gelu "* ) && -z "${PLAN_DRY:-}" ]] && before_kernels
step micro-norm 60 bash -c 'python3 benchmarks/gelu_quant_micro.py --kernel norm-quant --before '"$work/before"' --json "$RES/norm-quant-micro.json" > "$RES/norm-quant-micro.txt" 2>&1'
step micro-gelu 60 bash -c 'python3 benchmarks/gelu_quant_micro.py --kernel gelu --before '"$work/before"' --json "$RES/gelu-micro.json" > "$RES/gelu-micro.txt" 2>&1'
step bench-s10 440 env TAG=s10 bash benchmarks/gpu_bench.sh qwen-image --quant fp8 --candidate "$S10" \
  --modes eager --other-modes eager,compile+graph --iters 3
step profile-s10 80 env MODE=compile+graph bash benchmarks/gpu_analyze_patch.sh qwen-image "$S10" --quant fp8 --iters 5
step bench-s11 500 env TAG=s11 bash benchmarks/gpu_bench.sh qwen-image --quant fp8 --candidate "$S11" --candidate "$S10" \
  --modes eager --other-modes eager,compile+graph --iters 3
step profile-s11 80 env MODE=compile+graph bash benchmarks/gpu_analyze_patch.sh qwen-image "$S11" --quant fp8 --iters 5
step bench-f2 520 env TAG=f2 bash benchmarks/gpu_bench.sh flux2 --quant fp8 --candidate "$F2" --candidate "$F3" \
  --modes eager --other-modes eager,compile+graph --iters 3
step bench-f2x 520 env TAG=f2x bash benchmarks/gpu_bench.sh flux2 --quant fp8 --candidate "$F2X" --candidate "$F2" \
  --modes eager --other-modes eager,compile+graph --iters 3
step bench-f4x 520 env TAG=f4x bash benchmarks/gpu_bench.sh flux2 --quant fp8 --candidate "$F4X" --candidate "$F4" \
  --modes eager --other-modes eager,compile+graph --iters 3
step bench-s12 440 env TAG=s12 bash benchmarks/gpu_bench.sh qwen-image --quant fp8 --candidate "$S12" --candidate "$S11" \
  --modes eager --other-modes eager,compile+graph --iters 3
step profile-s12 80 env MODE=compile+graph bash benchmarks/gpu_analyze_patch.sh qwen-image "$S12" --quant fp8 --iters 5
step bench-s13 300 env TAG=s13 bash benchmarks/gpu_bench.sh qwen-image --quant fp8 --candidate "$S13" --candidate "$S12" \
  --modes eager --other-modes eager,compile+graph --iters 3
step bench-f5 360 env TAG=f5 bash benchmarks/gpu_bench.sh flux2 --quant fp8 --candidate "$F5" --candidate "$F4" \
  --modes eager --other-modes eager,compile+graph --iters 3
step wide-gemv 90 bash -c 'python3 benchmarks/wide_gemv_micro.py --json "$RES/wide-gemv.json" > "$RES/wide-gemv.txt" 2>&1'
