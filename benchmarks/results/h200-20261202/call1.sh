#!/usr/bin/env bash
# Device call 1 of 2026-12-02 (nvidia-h200): issue 17's analyze of the three new models at the full
# preset with fingerprints, then the six store kernels' tests + microbenchmarks (eager calls the
# kernel function directly now). Carry: .whl (gitpython, gitdb, smmap, diffusers sdist) and
# .whl-sgl-a (the sglang wheel, parked in /tmp/sglw for call 2 on the same warm machine).
set -uo pipefail
R=/tmp/res; mkdir -p $R /tmp/sglw; cp .whl-sgl-a/* /tmp/sglw/ 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export OPTBOT_WHEELS_INSTALLED=1 PYTHONPATH=/tmp/site:$PWD OPTBOT_HOME=/tmp/optbot-home PYTHONUNBUFFERED=1
mkdir -p $OPTBOT_HOME/downloads && cp .whl/*.tar.gz $OPTBOT_HOME/downloads/
git rev-parse HEAD > $R/optbot-sha.txt 2>/dev/null
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee $R/versions.txt
s=$(date +%s)
OUT=$R FINGERPRINTS=1 timeout -k 10 280 bash benchmarks/gpu_analyze.sh wan2.1 sd3.5-large lumina2
echo "analyze: rc $? $(( $(date +%s) - s )) s" | tee -a $R/wall.txt
s=$(date +%s)
timeout -k 10 230 python3 -m bot store check flux2-qk-rmsnorm-rope flux2-swiglu flux2-norm-modulate \
  flux2-qkv-norm-rope-epilogue qwen-image-qkv-norm-rope-epilogue qwen-image-absorb-bias \
  --device cuda --no-validate > $R/store-check-kernels.txt 2>&1
echo "store check: rc $? $(( $(date +%s) - s )) s" | tee -a $R/wall.txt
cp "$(ls -t /tmp/optbot-runs/*/store-check.json $OPTBOT_HOME/runs/*/store-check.json 2>/dev/null | head -1)" $R/store-check-kernels.json
grep -E "micro|^(ok|FAIL)" $R/store-check-kernels.txt | cut -c1-220
tar czf $OUT/call1.tar.gz -C $R .
