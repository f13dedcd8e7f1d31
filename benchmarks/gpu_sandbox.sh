#!/usr/bin/env bash
# The runner sandbox on the H200 (issue 14), one self-contained command of about 8 minutes:
#   1. the attacker's probes (tests/test_sandbox.py) on this host's kernel;
#   2. the GPU clock forgeries, tiny preset on cuda: gpu_slow_event.patch (Event.elapsed_time
#      halved) and gpu_slow_clocks.patch (elapsed_time and perf_counter halved), verdicts appended
#      to gpu-adversarial.json;
#   3. the sandbox's cost: a probe job 10 times each way (benchmarks/sandbox_cost.py), and the honest candidate (merged Q/K/V) validated at the FULL preset twice,
#      OPTBOT_SANDBOX=off then on, each from an empty compile cache, wall time of each;
#   4. the accepted flux2 store entries re-validated (optbot store check, full preset) in the sandbox.
# SKIP_COST=1 leaves out step 3 (about 5 of the 8 minutes): a re-check of 1, 2 and 4 at a new commit.
# Usage on the device machine, from the repo root with .whl/ carried (as benchmarks/gpu_validate.sh):
#   bash benchmarks/gpu_sandbox.sh
set -uo pipefail
OUT="${OUT:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-sandbox-$(date +%Y%m%d)}"
mkdir -p "$OUT"
if [[ -d .whl ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  mkdir -p /tmp/optbot-home/downloads && cp .whl/diffusers-*.tar.gz /tmp/optbot-home/downloads/ 2>/dev/null || true
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1
export OPTBOT_TEST_HOME="$OPTBOT_HOME" OPTBOT_RUNS_DIR="/tmp/optbot-runs" OPTBOT_KNOWLEDGE_PATH="$PWD"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; id;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)";
  git rev-parse HEAD 2>/dev/null; } > "$OUT/provenance.txt" 2>&1

step() { echo "== $1: exit $2, $3 s wall" | tee -a "$OUT/summary.txt"; }

t=$(date +%s)
python3 -m pytest -o addopts="" -q -p no:cacheprovider tests/test_sandbox.py > "$OUT/pytest-sandbox.txt" 2>&1
step "pytest tests/test_sandbox.py" $? $(( $(date +%s) - t ))

t=$(date +%s)
OPTBOT_GPU_VALIDATE_OUT="$OUT" python3 -m pytest -o addopts="" -q -s -m gpu -p no:cacheprovider tests/validate/test_gpu.py \
  -k "clock" > "$OUT/pytest-gpu-clocks.txt" 2>&1
step "pytest -m gpu -k clock tests/validate/test_gpu.py" $? $(( $(date +%s) - t ))

if [[ -z "${SKIP_COST:-}" ]]; then
t=$(date +%s)
python3 benchmarks/sandbox_cost.py 10 --device cuda > "$OUT/sandbox-cost-probe-cuda.json" 2> "$OUT/sandbox-cost-probe-cuda.err"
step "sandbox_cost.py 10 --device cuda" $? $(( $(date +%s) - t ))

for mode in off on; do
  rm -rf "$OPTBOT_HOME/compile-cache"
  t=$(date +%s)
  OPTBOT_SANDBOX=$mode python3 -m bot validate flux2 --preset full --device cuda \
    --candidate tests/validate/adversarial/honest_merge_qkv.patch --iters 10 \
    --json "$OUT/validate-full-sandbox-$mode.json" > "$OUT/validate-full-sandbox-$mode.txt" 2>&1
  step "validate flux2 full, OPTBOT_SANDBOX=$mode" $? $(( $(date +%s) - t ))
done
fi

t=$(date +%s)
python3 -m bot store check flux2-qk-rmsnorm-rope flux2-swiglu --device cuda --json "$OUT/store-check-cuda.json" \
  > "$OUT/store-check-cuda.txt" 2>&1
step "store check flux2-qk-rmsnorm-rope flux2-swiglu, cuda, full preset, sandbox on" $? $(( $(date +%s) - t ))

cat "$OUT/summary.txt"
tail -n 3 "$OUT/pytest-sandbox.txt" "$OUT/pytest-gpu-clocks.txt"
grep -E "^(ACCEPTED|REJECTED|HELD)" "$OUT"/validate-full-sandbox-*.txt
grep -E "^(ok|FAIL) " "$OUT/store-check-cuda.txt"
