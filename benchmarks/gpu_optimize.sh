#!/usr/bin/env bash
# `optbot optimize flux2 --preset full` on the H200, as one self-contained command (issue 6).
#
# Usage on the device machine (repo root, .whl/ carried as for benchmarks/h200.sh):
#   bash benchmarks/gpu_optimize.sh [WORKLOAD] [RUN_ID]
# The run directory lives in ./.optbot/runs (kept on a warm machine); the command stops itself after
# $LIMIT seconds (default 560) so a device call never runs past 10 minutes, and prints the RUN_ID to
# continue with on the next call:  bash benchmarks/gpu_optimize.sh flux2 <RUN_ID>
# --dry-run: no pushes and no PRs from the GPU box; the local forge leaves the branch and the report.
# Results (report.md/.html, latency.png, every <step>.json, wall time) go under $OUT.
set -uo pipefail
wl="${1:-flux2}"
resume="${2:-}"
OUT="${OUT:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-optimize-$(date +%Y%m%d)}"
LIMIT="${LIMIT:-560}"
mkdir -p "$OUT"
[ -n "${OPTBOT_WHEELS_INSTALLED:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OPTBOT_HOME=/tmp/optbot-home PYTHONUNBUFFERED=1 OPTBOT_RUNS_DIR="$PWD/.optbot/runs"
export OPTBOT_KNOWLEDGE_PATH="$PWD"
mkdir -p "$OPTBOT_HOME/downloads" && cp .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
start=$(date +%s)
if [[ -n "$resume" ]]; then
  timeout "$LIMIT" python3 -m bot optimize "$wl" --resume "$resume" --json "$OUT/optimize-$wl.json" \
    2>&1 | tee -a "$OUT/optimize-$wl.txt"
else
  timeout "$LIMIT" python3 -m bot optimize "$wl" --preset full --device cuda --dry-run --budget "${BUDGET:-$((LIMIT - 60))s}" \
    --json "$OUT/optimize-$wl.json" 2>&1 | tee "$OUT/optimize-$wl.txt"
fi
rc=${PIPESTATUS[0]}
echo "$wl attempt: $(( $(date +%s) - start )) s wall, exit $rc" | tee -a "$OUT/wall.txt"
run=$(ls -td "$OPTBOT_RUNS_DIR"/*-optimize-* 2>/dev/null | head -1)
if [[ -n "$run" ]]; then
  bash benchmarks/collect_run.sh "$run" "$OUT" "bash benchmarks/gpu_optimize.sh"
  # The device machine keeps nothing: export the optimization branch as a patch series, so a later
  # call can re-create it on the same deterministic base (git am) and bench it.
  python3 - "$run" "$OUT" <<'PY'
import json, subprocess, sys, pathlib
run, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
ck, cb = run / "checkout.json", run / "combine.json"
if ck.is_file() and cb.is_file():
    c, k = json.loads(cb.read_text()), json.loads(ck.read_text())
    repo, base, branch = k.get("repo_path") or k.get("repo"), k.get("base_sha"), c.get("branch")
    if repo and base and branch:
        dest = out / "branch-patches"
        dest.mkdir(exist_ok=True)
        subprocess.run(["git", "-C", repo, "format-patch", "-q", f"{base}..{branch}", "-o", str(dest)], check=False)
        (dest / "BRANCH").write_text(f"{branch} {base}\n")
        print(f"exported {branch} ({len(list(dest.glob('*.patch')))} commits) to {dest}")
PY
fi
exit $rc
