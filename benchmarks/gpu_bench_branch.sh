#!/usr/bin/env bash
# The product's number on the H200, in one bench run: upstream eager (+ CUDA graph), the bot's
# optimization branch, SGLang's own DiT, and the roofline, outputs checked against upstream eager.
#
#   bash benchmarks/gpu_bench_branch.sh WORKLOAD SOURCE_REPO WAIT_UNTIL_EPOCH
#
# Run beside benchmarks/gpu_optimize.sh on a 2-GPU machine (benchmarks/h200_x2.sh): it waits (until
# WAIT_UNTIL_EPOCH) for the optimization branch optbot/<workload>/<base12> to appear in the engine
# repository SOURCE_REPO of the optimize lane, fetches it (same commits, same shas) into this lane's
# engine repository, and benches it. Without a branch by then it benches upstream and SGLang only.
set -uo pipefail
wl=$1; src=$2; until_epoch=$3
RES="${RES:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-$(date +%Y%m%d)}"
mkdir -p "$RES"
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home-b}" PYTHONUNBUFFERED=1
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" ;; esac
mkdir -p "$OPTBOT_HOME/downloads" && cp -n .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null
python3 -m bot engine init diffusers > "$RES/bench-branch-engine.txt" 2>&1
repo="$OPTBOT_HOME/engines/diffusers-0.42.1"
base=$(git -C "$repo" rev-parse HEAD)
branch="optbot/$wl/${base:0:12}"
cand=()
while [ "$(date +%s)" -lt "$until_epoch" ]; do
  if git -C "$src" rev-parse -q --verify "refs/heads/$branch" >/dev/null 2>&1 \
     && [ "$(git -C "$src" rev-parse "$branch")" != "$base" ]; then
    git -C "$repo" fetch -q "$src" "+refs/heads/$branch:refs/heads/$branch" && cand=(--candidate "$branch")
    break
  fi
  sleep 5
done
echo "candidate: ${cand[*]:-none} $(git -C "$repo" rev-parse -q --verify "$branch" 2>/dev/null)" | tee "$RES/bench-branch-candidate.txt"
git -C "$repo" log --format='%h %s' "$base..$branch" 2>/dev/null | tee -a "$RES/bench-branch-candidate.txt"
python3 -m bot bench "$wl" --preset full --device cuda "${cand[@]}" --with-engine sglang --modes eager,graph \
  --iters "${ITERS:-6}" --json "$RES/bench-$wl-final.json" > "$RES/bench-$wl-final.txt" 2>&1
rc=$?
tail -30 "$RES/bench-$wl-final.txt"
exit $rc
