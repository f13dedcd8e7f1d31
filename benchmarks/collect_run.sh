#!/usr/bin/env bash
# What the device scripts bring back of an optimize run (gpu_template.sh, gpu_sglang.sh optimize):
# the whole run directory as one archive, DEST/run.tgz (the device tool returns at most 8 files, so
# a folder of step JSONs, verdicts and PR texts came back in part: 2026-12-06), without what is large
# and rebuilt on demand (candidates.bundle, profiler traces, analysis.full.json); and the steps'
# table with the command that continues the run, DEST/steps.txt. Here: tar xzf run.tgz -C FOLDER.
#
#   bash benchmarks/collect_run.sh RUN_DIR DEST "COMMAND THAT RESUMES"
set -uo pipefail
run="$1"; dest="$2"; again="$3"
[[ -n "$run" && -f "$run/state.json" ]] || { echo "collect_run.sh: no run state at '$run/state.json'" >&2; exit 1; }
mkdir -p "$dest"
tar czf "$dest/run.tgz" -C "$run" --exclude='*.bundle' --exclude='*trace*.json*' --exclude=analysis.full.json \
  --exclude='*.pt' --exclude='*.safetensors' .
python3 benchmarks/run_steps.py "$run" "$again" | tee -a "$dest/steps.txt"
