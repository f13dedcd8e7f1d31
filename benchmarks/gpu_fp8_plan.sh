#!/usr/bin/env bash
# The FP8 plan's GPU items (benchmarks/results/README.md, "Next" of the twenty-fifth session), each step
# one bench or profile, so that one machine start answers as many as fit: carry .whl-sgl-b only (the tree
# plus .whl-sgl-b and .sgl-engine pass one call's 64 MiB; `cmd` needs no SGLang engine), then
#   WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh cmd bash benchmarks/gpu_fp8_plan.sh
# Steps, each skipped when it cannot finish before DEADLINE seconds (default 560: a call may run 600, and
# `gpu_sglang.sh cmd` installs the carried wheels for about 30 s before this starts) and
# each packed as $OUT/<step>.tgz as soon as it ends (the device returns at most 8 files, and a call cut
# short still returns the steps that finished). By default:
#   bench-f4x     (about 515 s on an H100: a call of its own) FLUX.2's FP8 stack (flux2-fp8-norm-quant) with
#                 its kernels' bf16 rounding on the GPU's own conversion (f4.patch; the norm kernel issues
#                 912 instructions a thread where f2's issued 1,912) beside the same with exact arithmetic
#                 (f4-exact.patch: 1,336), both cpu-fp8-nativeround-20261207/: does the distance from the FP8
#                 baseline fall under the gate with exact arithmetic (flux2-fp8-norm-quant was rejected at
#                 0.0893-0.092 against the 0.09 bound, docs/fp8.md), and at what cost? It also prints the
#                 trusted rewrite's largest element distance, the evidence FLUX.2's FP8 atol needs
# By name (STEPS="..."):
#   bench-s11, profile-s11   s11.patch (the merged modulation) against s10.patch, and s11's compile + CUDA
#                 graph profile: ran 2026-12-07 (427 + 71 s), benchmarks/results/h100-fp8-modmerge-20261207/
#   bench-s10, profile-s10   s10 alone (434 s for the bench of one stack on an H100)
#   bench-f2      f2 against the three-entry stack (f3.patch)
#   bench-f2x     f2 with exact arithmetic against f2 (the integer bf16 rounding; superseded by bench-f4x)
#   micro-norm    (about 60 s; runs first) qwen-image-fp8-norm-quant's kernel with the row in three
#                 1024-wide blocks and the GPU's own bf16 rounding (predicted 33 -> 18-21 us an image call
#                 on an H100; norm_quant.py's BLOCKS says why) against the kernel s11 ran (--before, from s11.patch)
#   micro-gelu    (about 60 s) the GELU + quantization kernel with the GPU's own bf16 rounding against the
#                 one s11 ran (--before)
#   bench-s12     s12.patch (s11 with that kernel, and the GELU kernel's bf16 rounding on the GPU's own
#                 conversion: cpu-fp8-normblocks-20261207/) against s11.patch (about 430 s)
#   profile-s12   s12's compile + CUDA graph profile (about 75 s; s11's: h100-fp8-modmerge-20261207/)
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
STEPS="${STEPS:-bench-f4x}"
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

# the kernel files s11 ran (its patch adds them) beside the live ones: the micro's --before
before_s11() { rm -rf "$work/s11-kernels" && mkdir -p "$work/s11-kernels" && local root=$PWD \
  && (cd "$work/s11-kernels" && git apply --include='src/diffusers/models/optbot_kernels/*' "$root/$S11") \
  && mv "$work/s11-kernels/src/diffusers/models/optbot_kernels" "$work/s11-before"; }
[[ ( " $STEPS " == *" micro-norm "* || " $STEPS " == *" micro-gelu "* ) && -z "${PLAN_DRY:-}" ]] \
  && rm -rf "$work/s11-before" && before_s11
step micro-norm 90 bash -c 'python3 benchmarks/gelu_quant_micro.py --kernel norm-quant --before '"$work/s11-before"' --json "$RES/norm-quant-micro.json" > "$RES/norm-quant-micro.txt" 2>&1'
step micro-gelu 90 bash -c 'python3 benchmarks/gelu_quant_micro.py --kernel gelu --before '"$work/s11-before"' --json "$RES/gelu-micro.json" > "$RES/gelu-micro.txt" 2>&1'
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
step wide-gemv 90 bash -c 'python3 benchmarks/wide_gemv_micro.py --json "$RES/wide-gemv.json" > "$RES/wide-gemv.txt" 2>&1'
