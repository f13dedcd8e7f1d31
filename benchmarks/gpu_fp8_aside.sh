#!/usr/bin/env bash
# The FP8 step-aside on a GPU as one self-contained command (benchmarks/results/cpu-fp8-aside-20261205/):
#   bash benchmarks/gpu_fp8_aside.sh flux2|qwen-image
# First inductor_quant_fusion.py on this GPU (seconds: does inductor fuse a norm + modulation with the
# FP8 quantization, what does an opaque op in between cost), then one `optbot bench --quant fp8` run
# with the workload's FP8 stack twice: its norm + modulation kernel as the op and stepping aside
# under compile. Carry .whl (torchao, gitpython, diffusers' sdist). Results under $RES, copied to $OUT.
set -uo pipefail
wl=$1; shift
SRC=benchmarks/results/cpu-fp8-aside-20261205
RES="${RES:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-fp8-aside-$(date +%Y%m%d)}"
mkdir -p "$RES"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export OPTBOT_WHEELS_INSTALLED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$RES/nvidia-smi.txt" 2>&1
timeout 120 python3 benchmarks/inductor_quant_fusion.py cuda > "$RES/inductor-quant-fusion-cuda.json" 2> "$RES/inductor-quant-fusion-cuda.err"
echo "inductor_quant_fusion: exit $?"; cat "$RES/inductor-quant-fusion-cuda.json"
[ -n "${OUT:-}" ] && cp "$RES"/nvidia-smi.txt "$RES"/inductor-quant-fusion-cuda.* "$OUT/"
case "$wl" in
  flux2) op=benchmarks/results/cpu-flux2-single-20261205/flux2-fp8-stack.patch; aside=$SRC/flux2-fp8-stack-aside.patch ;;
  qwen-image) op=$SRC/qwen-image-fp8-stack.patch; aside=$SRC/qwen-image-fp8-stack-aside.patch ;;
  *) echo "usage: $0 flux2|qwen-image [bench options]"; exit 2 ;;
esac
# The two stacks differ only under compile: compile + graph (the production mode) is the row that
# matters; eager rows are the FP8 gate's reference (upstream+fp8 eager) and cost little on FLUX.2.
# Seven compiles would not fit one 600 s call, so upstream bf16 runs eager only (options after the
# workload override these: click keeps the last).
RES="$RES" TAG=fp8-aside bash benchmarks/gpu_bench.sh "$wl" --quant fp8 --candidate "$op" --candidate "$aside" \
  --modes eager --other-modes eager,compile+graph --iters 3 "$@"
