#!/usr/bin/env bash
# The validator on the H200 (issue 3), in one self-contained command of a few minutes:
#   1. one real validation of the honest candidate (merged Q/K/V of the FLUX.2 double-stream
#      blocks, tests/validate/adversarial/honest_merge_qkv.patch) at the FULL preset, bf16:
#      3 fresh seeds x 2 shapes (1024x1024/txt512 and the untuned 768x1360/txt300), kernel
#      histogram engagement, per-step latency base vs candidate in 4 interleaved processes,
#      eager and CUDA graph, A/A noise, roofline floor;
#   2. the GPU-only adversarial cases (side stream, illegal memory access + health probe, and the
#      uninitialized output against the CUDA caching-allocator poison), tiny preset on cuda:
#      pytest -m gpu tests/validate.
# Usage on the device machine, from the repo root with .whl/ carried (as benchmarks/h200.sh):
#   bash benchmarks/gpu_validate.sh
# Writes 4 files under $OUT (default benchmarks/results/<gpu>-<date>/): validate-flux2-full.json and
# .txt (verdict, its table, wall time), gpu-adversarial.json and pytest-gpu.txt; prints them last.
# Expected wall time: about 4-5 minutes (4 full-preset FLUX.2 processes of ~20 s build each, plus
# about 15 tiny-preset processes for the GPU cases).
set -uo pipefail
OUT="${OUT:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-$(date +%Y%m%d)}"
mkdir -p "$OUT"
if [[ -d .whl ]]; then
  [ -n "${OPTBOT_WHEELS_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  mkdir -p /tmp/optbot-home/downloads && cp .whl/diffusers-*.tar.gz /tmp/optbot-home/downloads/ 2>/dev/null || true
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1
export OPTBOT_TEST_HOME="$OPTBOT_HOME" OPTBOT_RUNS_DIR="$OUT/runs"
# the test session materializes the engine in OPTBOT_TEST_HOME: give it the same downloads
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

start=$(date +%s)
python3 -m bot validate flux2 --preset full --device cuda \
  --candidate tests/validate/adversarial/honest_merge_qkv.patch --iters 10 \
  --json "$OUT/validate-flux2-full.json" > "$OUT/validate-flux2-full.txt" 2>&1
rc=$?
echo "validate flux2 full: exit $rc, $(( $(date +%s) - start )) s wall" | tee -a "$OUT/validate-flux2-full.txt"

start=$(date +%s)
OPTBOT_GPU_VALIDATE_OUT="$OUT" python3 -m pytest -o addopts="" -q -s -m gpu tests/validate -p no:cacheprovider > "$OUT/pytest-gpu.txt" 2>&1
prc=$?
echo "pytest -m gpu tests/validate: exit $prc, $(( $(date +%s) - start )) s wall" | tee -a "$OUT/pytest-gpu.txt"

rm -rf "$OUT/runs"  # .pt outputs and traces: large, not committed
tail -n 25 "$OUT/pytest-gpu.txt"
cat "$OUT/validate-flux2-full.txt" | grep -v '^·' | tail -n 40
