#!/usr/bin/env bash
# The FP8 kernels' GPU questions in one short call (about 120 s on an H100): the four FP8 entries' kernel
# tests (the exact forms bit for bit, the fast forms' bound), then the three microbenchmarks of
# benchmarks/gelu_quant_micro.py (the GELU kernel, the SwiGLU kernel exact and fast, the norm +
# modulation + quantization kernel of qwen-image-fp8-norm-quant against inductor's fusion). Carry .whl-sgl-b and .sgl-engine:
#   WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh cmd bash benchmarks/gpu_fp8_micro.sh
# Writes kernel-tests.txt and {gelu,swiglu,norm-quant}-micro.{json,txt} under $OUT (else $RES, else
# benchmarks/results/<gpu>-<date>/).
set -uo pipefail
RES="${OUT:-${RES:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-$(date +%Y%m%d)}}"
mkdir -p "$RES"
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$RES/nvidia-smi.txt"
rc=0
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  kernel_store/qwen-image-fp8-gelu-quant/test_gelu_quant.py kernel_store/flux2-fp8-swiglu-quant/test_swiglu_quant.py \
  kernel_store/qwen-image-fp8-norm-quant/test_norm_quant.py kernel_store/flux2-fp8-norm-quant/test_flux2_norm_quant.py \
  2>&1 | tail -30 | tee "$RES/kernel-tests.txt" || rc=1
# BEFORE=DIR: earlier copies of the kernel files, benched beside the live ones (gelu_quant_micro.py --before)
for k in gelu norm-quant swiglu; do
  timeout 150 python3 benchmarks/gelu_quant_micro.py --kernel "$k" ${BEFORE:+--before "$BEFORE"} \
    --json "$RES/$k-micro.json" 2>&1 | tee "$RES/$k-micro.txt" | tail -12 || rc=1
done
exit $rc
