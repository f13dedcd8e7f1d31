#!/usr/bin/env bash
# What the device scripts bring back of an optimize run (gpu_template.sh, gpu_sglang.sh optimize):
# the step JSONs and the report (not the full analysis: large; analysis.json holds the ranking), the
# template entries and the forge's texts where there are any, every verdict reached so far (also
# when the attempt was cut: validate.json is written at the step's end), and the steps' table with
# the command that continues the run.
#
#   bash benchmarks/collect_run.sh RUN_DIR DEST "COMMAND THAT RESUMES"
set -uo pipefail
run="$1"; dest="$2"; again="$3"
[[ -n "$run" && -f "$run/state.json" ]] || { echo "collect_run.sh: no run state at '$run/state.json'" >&2; exit 1; }
mkdir -p "$dest/run" && cp "$run"/*.json "$run"/report.* "$dest/run/" 2>/dev/null
rm -f "$dest/run/analysis.full.json"
for d in template forge; do [[ -d "$run/$d" ]] && cp -r "$run/$d" "$dest/run/"; done
for v in "$run"/validate/*/verdict.json; do [[ -f "$v" ]] && cp "$v" "$dest/run/verdict-$(basename "$(dirname "$v")").json"; done
python3 benchmarks/run_steps.py "$run" "$again" | tee -a "$dest/steps.txt"
