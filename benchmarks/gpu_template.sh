#!/usr/bin/env bash
# Issue 22's check: `optbot optimize WL` with the agent off and the store emptied of every entry for
# WL, so that whatever it delivers comes from template-generated kernels (bot/generate/template/).
#
#   bash benchmarks/gpu_template.sh WORKLOAD [RUN_ID]      # on the H200 (repo root, .whl/ carried)
#   DEVICE=cpu bash benchmarks/gpu_template.sh flux2       # the same on CPU (tiny preset)
#   BUDGET=300s bash benchmarks/gpu_template.sh qwen-image  # candidates reached after 300 s are held:
#                                                          # fewer validations when device time is short
#
# The knowledge copy: kernel_store/ and lessons/ of this tree, less the entries whose `workloads`
# name WL, as a git repository in /tmp (the knowledge PR's branch needs one). Lessons stay: they are
# what a new workload would start from too. A second call with RUN_ID resumes a paused run (the
# copy is kept on a warm machine). Results (the run's step JSONs, report, the template entries, the
# branch as patches) go under $OUT.
set -uo pipefail
wl="${1:?workload}"
resume="${2:-}"
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-benchmarks/results/template-$wl-$(date +%Y%m%d)}"
LIMIT="${LIMIT:-560}"
# A candidate's validation in the four production modes takes 250-300 s on FLUX.2 full on one H200
# (2026-12-02) and is never interrupted: pause before starting one that could not finish in $LIMIT.
PAUSE="${PAUSE:-$((LIMIT - 320))}"
mkdir -p "$OUT"
if [[ "$DEVICE" == cuda* && -z "${OPTBOT_WHEELS_INSTALLED:-}" && ! -d /tmp/site/git ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[[ -d /tmp/site ]] && export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1 OPTBOT_RUNS_DIR="${OPTBOT_RUNS_DIR:-$PWD/.optbot/runs}"
mkdir -p "$OPTBOT_HOME/downloads" && cp -n .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null
K="${KNOWLEDGE:-/tmp/knowledge-without-$wl}"
if [[ -z "$resume" ]]; then
  rm -rf "$K" && mkdir -p "$K" && cp -r kernel_store lessons "$K/"
  python3 - "$K" "$wl" <<'PY' | tee "$OUT/knowledge.txt"
import shutil, sys, pathlib, yaml
k, wl = pathlib.Path(sys.argv[1]), sys.argv[2]
for f in sorted((k / "kernel_store").glob("*/entry.yaml")):
    if wl in ((yaml.safe_load(f.read_text()) or {}).get("workloads") or []):
        shutil.rmtree(f.parent)
        print(f"store emptied for {wl}: removed {f.parent.name}")
print("kept:", ", ".join(sorted(p.parent.name for p in (k / "kernel_store").glob("*/entry.yaml"))) or "nothing")
PY
  git -C "$K" init -q && git -C "$K" add -A && git -C "$K" -c user.name=optbot -c user.email=optbot@localhost commit -qm "knowledge without $wl"
fi
export OPTBOT_KNOWLEDGE_PATH="$K"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
start=$(date +%s)
if [[ -n "$resume" ]]; then
  timeout "$LIMIT" python3 -m bot optimize "$wl" --resume "$resume" --pause-after "${PAUSE}s" \
    --json "$OUT/optimize-$wl.json" 2>&1 | tee -a "$OUT/optimize-$wl.txt"
else
  timeout "$LIMIT" python3 -m bot optimize "$wl" --device "$DEVICE" --dry-run --generators "${GENERATORS:-replay,template}" \
    --pause-after "${PAUSE}s" ${ITERS:+--iters $ITERS} ${BUDGET:+--budget $BUDGET} ${ABLATION:+--ablation-rounds $ABLATION} --json "$OUT/optimize-$wl.json" 2>&1 | tee "$OUT/optimize-$wl.txt"
fi
rc=${PIPESTATUS[0]}
echo "$wl attempt: $(( $(date +%s) - start )) s wall, exit $rc" | tee -a "$OUT/wall.txt"
run=$(ls -td "$OPTBOT_RUNS_DIR"/*-optimize-* 2>/dev/null | head -1)
if [[ -n "$run" ]]; then
  bash benchmarks/collect_run.sh "$run" "$OUT" "bash benchmarks/gpu_template.sh"
  # what the agent would be told for the run's top opportunity, with the full store (docs/generate.md)
  [[ -f "$run/analysis.full.json" && ! -f "$OUT/agent-prompt-$wl.md" ]] && \
    python3 benchmarks/agent_prompt.py "$(basename "$run")" --store "$PWD/kernel_store" --lessons "$PWD/lessons" \
      --out "$OUT/agent-prompt-$wl.md" 2>&1 | tail -1
fi
exit $rc
