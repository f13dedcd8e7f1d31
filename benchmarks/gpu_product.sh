#!/usr/bin/env bash
# The product's number for one workload on the H200, in one lane of one device call:
#   1. optbot optimize WL --preset full --device cuda on the store as committed (its recorded H200
#      verdicts are reused where patch, base, workload, preset, dtype, hardware, torch and triton are
#      unchanged, known-rejected entries are skipped; the stack is validated fresh) -> branch;
#   2. optbot bench WL --candidate <that branch>: upstream eager, CUDA graph, torch.compile (regional),
#      the branch, SGLang's own DiT where it runs, and the roofline, outputs checked vs upstream eager.
#
#   bash benchmarks/gpu_product.sh WORKLOAD          (inside benchmarks/h200_x2.sh, one lane per workload)
# Env: GENERATORS (default replay), ABLATION_ROUNDS (default 1), ITERS (bench, default 5),
#      ENGINES (bench --with-engine, default sglang for flux2), RES (results folder).
set -uo pipefail
wl="${1:-flux2}"
RES="${RES:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-product-$(date +%Y%m%d)}/$wl"
mkdir -p "$RES"
[ -n "${OPTBOT_WHEELS_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" ;; esac
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1 OPTBOT_RUNS_DIR="/tmp/optbot-runs-$wl"
export OPTBOT_KNOWLEDGE_PATH="$PWD"
mkdir -p "$OPTBOT_HOME/downloads" && cp -n .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null
# the slim sglang wheel (its .so files stripped, same sha) travels as .whl.keep so pip does not install it
for f in .whl/*.whl.keep; do [[ -f "$f" ]] && cp -n "$f" "$OPTBOT_HOME/downloads/$(basename "${f%.keep}")"; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$RES/nvidia-smi.txt"
start=$(date +%s)
python3 -m bot optimize "$wl" --preset full --device cuda --dry-run --generators "${GENERATORS:-replay}" \
  --ablation-rounds "${ABLATION_ROUNDS:-1}" --json "$RES/optimize.json" > "$RES/optimize.txt" 2>&1
rc=$?
echo "optimize $wl: $(( $(date +%s) - start )) s wall, exit $rc" | tee "$RES/wall.txt"
run=$(ls -td "$OPTBOT_RUNS_DIR"/*-optimize-* 2>/dev/null | head -1)
[ -n "$run" ] && mkdir -p "$RES/run" && cp "$run"/*.json "$run"/report.md "$RES/run/" 2>/dev/null
repo="$OPTBOT_HOME/engines/diffusers-0.42.1"
base=$(git -C "$repo" rev-parse HEAD)
branch="optbot/$wl/${base:0:12}"
cand=()
if git -C "$repo" rev-parse -q --verify "refs/heads/$branch" >/dev/null && [ "$(git -C "$repo" rev-parse "$branch")" != "$base" ]; then
  cand=(--candidate "$branch")
  git -C "$repo" format-patch -q "$base..$branch" -o "$PWD/$RES/branch-patches"  # -o is relative to -C
  git -C "$repo" log --format='%h %s' "$base..$branch" > "$RES/branch.txt"
fi
engines=()
for e in ${ENGINES-$([ "$wl" = flux2 ] && echo sglang)}; do engines+=(--with-engine "$e"); done
start=$(date +%s)
python3 -m bot bench "$wl" --preset full --device cuda "${cand[@]}" "${engines[@]}" --modes eager,graph,compile --other-modes "${OTHER_MODES:-eager,graph}" \
  --iters "${ITERS:-5}" --json "$RES/bench.json" > "$RES/bench.txt" 2>&1
echo "bench $wl: $(( $(date +%s) - start )) s wall, exit $?" | tee -a "$RES/wall.txt"
tail -25 "$RES/bench.txt"
