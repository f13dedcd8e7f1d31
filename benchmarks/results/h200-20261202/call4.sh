#!/usr/bin/env bash
# Device call 4 of 2026-12-02 (a fresh machine: call 3's was taken back): Qwen-Image, upstream in
# every compile recipe vs the five-entry stack in the four production modes; the sglang wheel is
# parked in /tmp/sglw for call 5. Carry: .whl, .whl-sgl-a.
set -uo pipefail
mkdir -p /tmp/sglw /tmp/res4; cp .whl-sgl-a/* /tmp/sglw/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export OPTBOT_WHEELS_INSTALLED=1 RES=/tmp/res4 TAG=stack
timeout -k 10 400 bash benchmarks/gpu_bench.sh qwen-image --candidate benchmarks/results/h200-20261202/qwen-image-stack.patch --iters 5
echo "rc $?"; cp /tmp/res4/* $OUT/
