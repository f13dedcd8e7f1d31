#!/usr/bin/env bash
# Kernel store on the H200: kernel correctness + microbenchmarks, and end-to-end base vs patched.
# Each mode is one self-contained command of at most ~10 minutes (DESIGN decision 10).
#
# Usage on the device machine (from the repo root, with .whl/ carried, like benchmarks/h200.sh):
#   bash benchmarks/gpu_store.sh check        # optbot store check --device cuda --gpus $GPUS: every
#                                             #   entry's kernel tests + microbenchmarks AND the full
#                                             #   validator on the full preset (correctness, engagement,
#                                             #   end-to-end speed eager + CUDA graph), one lane per GPU
#   bash benchmarks/gpu_store.sh micro        # optbot store check --device cuda: every entry's kernel
#                                             #   tests on CUDA + A/B microbenchmark vs its reference
#   bash benchmarks/gpu_store.sh e2e-flux2    # optbot store bench: FLUX.2 full preset, base vs each entry
#   bash benchmarks/gpu_store.sh e2e-qwen     # the same for Qwen-Image
#   bash benchmarks/gpu_store.sh tune         # the GPU-marked tests (pytest -m gpu), then optbot store
#                                             #   tune: every config of every tunable entry checked
#                                             #   and timed per shape, one worker per GPU
# Then, on any machine, with the files from $OUT:
#   optbot store record-bench $OUT/store-check-cuda.json     (micro, check: validation too)
#   optbot store record-bench $OUT/store-bench-flux2.json
#   optbot store record-bench $OUT/store-bench-qwen-image.json
# which copies the measured numbers into kernel_store/<entry>/bench.json with their provenance.
# ROUNDS (default 1) alternating base/patched job pairs per entry; ITERS (default 10) timed steps per job.
set -euo pipefail
what="${1:-micro}"
OUT="${OUT:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-store-$(date +%Y%m%d)}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1 OPTBOT_RUNS_DIR="$OUT/runs"
mkdir -p "$OPTBOT_HOME/downloads" && cp .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.txt"
unset TRITON_INTERPRET
ROUNDS="${ROUNDS:-1}" ITERS="${ITERS:-10}"

case "$what" in
  check)
    # run directories stay on the machine (thousands of files); verdicts come back inside the JSON
    OPTBOT_RUNS_DIR=/tmp/optbot-runs python3 -m bot store check --device cuda --gpus "${GPUS:-$(nvidia-smi -L | wc -l)}" \
      --json "$OUT/store-check-cuda.json" ${ENTRIES:-} 2>&1 | tee "$OUT/store-check-cuda.txt"
    ;;
  micro)
    python3 -m bot store check --device cuda --json "$OUT/store-check-cuda.json" 2>&1 | tee "$OUT/store-check-cuda.txt"
    ;;
  e2e-flux2)
    python3 -m bot store bench flux2-qk-rmsnorm-rope flux2-swiglu flux2-norm-modulate flux2-merge-qkv \
      flux2-qkv-norm-rope-epilogue --device cuda --preset full \
      --rounds "$ROUNDS" --iters "$ITERS" --json "$OUT/store-bench-flux2.json" 2>&1 | tee "$OUT/store-bench-flux2.txt"
    ;;
  e2e-qwen)
    python3 -m bot store bench qwen-image-drop-all-ones-mask qwen-image-cfg-modulation-cache qwen-image-absorb-bias \
      qwen-image-qkv-norm-rope-epilogue qwen-image-hoist-host-copies qwen-image-linear-gelu-epilogue --device cuda --preset full \
      --rounds "$ROUNDS" --iters "$ITERS" --json "$OUT/store-bench-qwen-image.json" 2>&1 | tee "$OUT/store-bench-qwen-image.txt"
    ;;
  tune)
    # the tests keep their engines in their own home (tests/conftest.py): the sdist goes there too
    mkdir -p "$HOME/.cache/optbot-test/downloads" && cp .whl/diffusers-*.tar.gz "$HOME/.cache/optbot-test/downloads/" 2>/dev/null
    timeout "${PYTEST_S:-300}" python3 -m pytest -o addopts="" -q -m gpu -p no:cacheprovider tests/validate/test_gpu.py \
      tests/generate/test_variants.py 2>&1 | tee "$OUT/pytest-gpu.txt" || true
    OPTBOT_RUNS_DIR=/tmp/optbot-runs python3 -m bot store tune --device cuda --gpus "${GPUS:-$(nvidia-smi -L | wc -l)}" \
      --json "$OUT/store-tune-cuda.json" ${ENTRIES:-} 2>&1 | tee "$OUT/store-tune-cuda.txt"
    ;;
  *) echo "usage: $0 check|micro|e2e-flux2|e2e-qwen|tune" >&2; exit 2 ;;
esac
rm -rf "$OUT/runs"/*/*/*.pt 2>/dev/null || true
