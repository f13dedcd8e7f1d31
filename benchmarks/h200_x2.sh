#!/usr/bin/env bash
# Two lanes of GPU work on a 2-GPU machine (nvidia-h200-x2), in one device call:
#   bash benchmarks/h200_x2.sh "LANE A COMMAND" "LANE B COMMAND"
# Each lane sees one GPU (CUDA_VISIBLE_DEVICES). Sub-scripts write under benchmarks/results/;
# everything new there is packed into $OUT/results.tar.gz at the end (the device tool brings back
# at most 8 files), and each lane's log comes back too.
set -uo pipefail
DEV_OUT="${OUT:-}"
unset OUT
stamp=$(mktemp); sleep 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export OPTBOT_WHEELS_INSTALLED=1  # once, before the lanes: concurrent installs into one folder race
LANE_LIMIT="${LANE_LIMIT:-540}"  # seconds: the packing below must happen inside the device's 600 s
( export CUDA_VISIBLE_DEVICES=0 OPTBOT_HOME=/tmp/optbot-home-a; timeout "$LANE_LIMIT" bash -c "$1" > lane-a.log 2>&1 ) &
a=$!
( export CUDA_VISIBLE_DEVICES=1 OPTBOT_HOME=/tmp/optbot-home-b; timeout "$LANE_LIMIT" bash -c "$2" > lane-b.log 2>&1 ) &
b=$!
wait $a; ra=$?
wait $b; rb=$?
echo "lane A exit $ra; lane B exit $rb"
if [ -n "$DEV_OUT" ]; then
  find benchmarks/results -newer "$stamp" -type f -not -name '*.pt' -print0 | tar czf "$DEV_OUT/results.tar.gz" --null -T -
  cp lane-a.log lane-b.log "$DEV_OUT/"
fi
tail -30 lane-a.log; echo ----; tail -40 lane-b.log
