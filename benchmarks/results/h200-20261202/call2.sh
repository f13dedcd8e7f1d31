#!/usr/bin/env bash
# Device call 2 of 2026-12-02, on the machine call 1 left warm: SGLang's own FLUX.2 (profile, the
# production baseline) and the store entry sglang-flux2-cudnn-attention validated against SGLang.
# Carry: .whl (bot wheels) and .whl-sgl-b (SGLang's light import set); the sglang wheel is in
# /tmp/sglw from call 1 (the two halves exceed one call's 64 MiB with the tree).
set -uo pipefail
R=/tmp/res2; mkdir -p $R
ls /tmp/sglw/sglang-*.whl >/dev/null || { echo "machine went cold: /tmp/sglw has no sglang wheel"; exit 3; }
cp .whl-sgl-b/* /tmp/sglw/ && ln -sfn /tmp/sglw .whl-sglang
export OPTBOT_WHEELS_INSTALLED=1 PYTHONPATH=/tmp/site:$PWD OPTBOT_HOME=/tmp/optbot-home PYTHONUNBUFFERED=1
OUT=$R timeout -k 10 300 bash benchmarks/gpu_sglang.sh
echo "sglang profile: rc $?" | tee -a $R/wall.txt
s=$(date +%s)
timeout -k 10 330 python3 -m bot store check sglang-flux2-cudnn-attention --engine sglang --device cuda \
  > $R/store-check-sglang.txt 2>&1
echo "store check sglang: rc $? $(( $(date +%s) - s )) s" | tee -a $R/wall.txt
cp "$(ls -t /tmp/optbot-runs/*/store-check.json $OPTBOT_HOME/runs/*/store-check.json 2>/dev/null | head -1)" $R/store-check-sglang.json
tail -30 $R/store-check-sglang.txt | cut -c1-300
tar czf $OUT/call2.tar.gz -C $R .
