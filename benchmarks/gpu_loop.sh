#!/usr/bin/env bash
# The knowledge loop measured (issue 5): two `optbot optimize` runs of one workload, on a scratch
# knowledge repository, and both runs' gain and GPU time side by side.
#
#   bash benchmarks/gpu_loop.sh WORKLOAD [MODE]
#
# MODE seeded (default): run 1 starts from the seeded store with its GPU knowledge removed (no
#   gpu.* records, no GPU caveat lessons): it searches the entries' config spaces, validates every
#   candidate, ablates the stack; its learn step writes verdicts, adopted variants and the stack's
#   leave-one-out back. Run 2 starts from what run 1 left (its knowledge branch fast-forwarded, as a
#   person merging the knowledge PR would): known verdicts are reused, known-rejected entries
#   skipped, searched spaces not searched again, the stack validated fresh (new seeds).
#   On an H100 (the device tool lends one for an H200 at times) the seeded entries declared for
#   the H200 get the H100 added to their `hardware` for the experiment (listed in $RES/env.txt):
#   replay offers an entry only on hardware it lists, and validation decides on the lent GPU.
# MODE empty: run 1 starts from an empty store and no lessons: without ANTHROPIC_API_KEY only the
#   compile-region generator has anything to offer.
#
# In pieces: the experiment outlasts one 10-minute device call, so every invocation goes on where
# the last one stopped and ends within CALL_S seconds (default 570): optimize runs with
# --pause-after (CALL_S - elapsed - RESERVE_S), a clean stop between two pieces of work, and under
# `timeout` (CALL_S - elapsed - PACK_S, PACK_S default 30 for packing the kit): what the pause let
# start and the limit cut (one validation on the full preset is 300-450 s) resumes in the next call
# from the runner processes it finished (bot/validate/attempt.py), so a cut costs the process in
# flight, not the validation. Exit 0 with "call again" when it paused or was cut. A call that finds
# no loop state starts the experiment afresh; LOOP_CONTINUE=1 makes it fail instead (exit 3), for
# the calls after the first, so that a machine that went cold without the kit carried is noticed
# instead of starting run 1 over. A cut call that finished no runner process exits 4 (one process
# outlasts the call: raise CALL_S). Everything lives in $LOOP_DIR (default /tmp/optbot-loop); when $OUT is set, the resume kit
# (knowledge repository + what resume reads of the run in progress: kit_files) is written to $OUT/kit.tgz.part-* (15 MiB
# parts), and an invocation on a fresh machine restores it from $KIT.part-* (default
# .loop-kit/kit.tgz.part-*: copy the parts there and name .loop-kit in the call's carry).
# The results (both runs' logs, JSON, state, the summary) go to $RES and, as one archive, to
# $OUT/results.tgz.
#
# An experiment that spans sessions runs on the optbot it started with: benchmarks/loop_pin.sh COMMIT
# makes .loop-pin/ (that commit's bot/ and runner/, these scripts), and the calls run from there.
# $LOOP/calls.txt (copied to $RES) names each call's GPU and optbot commit.
#
# LOOP_RUNS="3" (after both runs ended): a third run on what run 2 left, on the optbot of the call (not the
# pin): how a newer optbot's run does on the same knowledge (its log, JSON and state in $RES as run3.*).
#
# Env: GPUS (default: all), GENERATORS (default: optimize's), ABLATION_ROUNDS (default 1),
#      PRESET/DEVICE (default full/cuda; tiny/cpu only to try the script itself), LOOP_RUNS (default "1 2").
set -uo pipefail
wl="${1:-qwen-image}"; mode="${2:-seeded}"
T0=$(date +%s)
CALL_S="${CALL_S:-570}"; RESERVE_S="${RESERVE_S:-180}"; PACK_S="${PACK_S:-30}"
PRESET="${PRESET:-full}"; DEVICE="${DEVICE:-cuda}"
LOOP="${LOOP_DIR:-/tmp/optbot-loop}/$wl-$mode"
RES="${RES:-benchmarks/results/$(bash benchmarks/gpu_tag.sh)-loop-$(date +%Y%m%d)/$wl-$mode}"
KIT="${KIT:-.loop-kit/kit.tgz}"
mkdir -p "$RES"
if [ -d .whl ] && [ ! -f /tmp/site/.optbot-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.optbot-wheels
fi
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" ;; esac
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1 OPTBOT_RUNS_DIR="$LOOP/runs"
mkdir -p "$OPTBOT_HOME/downloads" && cp -n .whl/diffusers-*.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null
if [ "$DEVICE" = cuda ]; then gpus="${GPUS:-$(nvidia-smi -L | wc -l)}"; else gpus=1; fi
know="$LOOP/knowledge"

kit_files() {  # what a fresh machine needs to go on: the knowledge, the loop's own files, of a finished
  # run its state.json (the summary reads it), of the run in progress everything but tensors and the
  # job directories of finished validations (a pause comes before a validation, never inside one:
  # their verdict-record.json is what resume reads). Keeps the kit, carried back in with the wheels,
  # under the device tool's 64 MiB.
  find "$LOOP" -path "$OPTBOT_RUNS_DIR" -prune -o -type f -print
  # run 1's profile and analysis of the base, which run 2 reuses (bot/run/base_cache.py)
  [ -d "$OPTBOT_HOME/cache/base" ] && find "$OPTBOT_HOME/cache/base" -type f
  for run in 1 2 3; do
    [ -f "$LOOP/run$run.id" ] || continue
    d="$OPTBOT_RUNS_DIR/$(cat "$LOOP/run$run.id")"
    if [ -f "$LOOP/run$run.done" ]; then echo "$d/state.json"
    else find "$d" -type f ! -name '*.pt' ! -name '*.safetensors' ! -path "$d/validate/*/*/*"; fi
  done
}

finished() {  # how much of run $1 is done: step results, verdicts, kept runner processes (a cut attempt keeps them)
  [ -s "$LOOP/run$1.id" ] || { echo 0; return; }
  local d="$OPTBOT_RUNS_DIR/$(cat "$LOOP/run$1.id")"
  { find "$d" -maxdepth 1 -name '*.json' ! -name state.json -type f
    find "$d" \( -path '*/done/*.json' -o -name verdict-record.json \) -type f; } 2>/dev/null | wc -l
}

pack() {  # the resume kit and the results, for the next call (maybe on another machine)
  [ -n "${OUT:-}" ] || return 0
  # what comes back from a device call is at most 16 MiB a file: the kit travels in 15 MiB parts
  rm -f "$OUT"/kit.tgz.part-*
  kit_files | tar czf - -P -T - 2>/dev/null | split -b 15M - "$OUT/kit.tgz.part-"
  tar czf "$OUT/results.tgz" "$RES" 2>/dev/null
  ls -la "$OUT"
}

if [ ! -d "$know/.git" ] && compgen -G "$KIT.part-*" > /dev/null; then
  # a kit holds one experiment's paths ($LOOP/...): another workload's kit is left alone
  # grep -c reads the whole listing: grep -q would stop early, and under pipefail tar's SIGPIPE fails the test
  if [ "$(cat "$KIT".part-* | tar tzf - -P 2>/dev/null | grep -c "^$LOOP/knowledge/")" -gt 0 ]; then
    echo "restoring the loop's state from $KIT.part-*"; cat "$KIT".part-* | tar xzf - -P
  else
    echo "$KIT.part-* is not this experiment's kit (no $LOOP/knowledge in it): not restored" >&2
  fi
fi
if [ ! -d "$know/.git" ] && [ "${LOOP_CONTINUE:-0}" = 1 ]; then
  echo "LOOP_CONTINUE=1 but no loop state in $LOOP and no kit at $KIT.part-*: carry .loop-kit (the last call's kit parts)" >&2
  exit 3
fi
if [ ! -d "$know/.git" ]; then
  mkdir -p "$know"
  # run 1 measures the base itself: no profile or analysis left by an earlier experiment on this machine
  rm -rf "$OPTBOT_HOME/cache/base"
  python3 - "$know" "$mode" "$(bash benchmarks/gpu_tag.sh)" <<'PY' | tee -a "$RES/env.txt"
import json, re, shutil, subprocess, sys
from pathlib import Path
dst, mode, hw = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(dst / "kernel_store").mkdir(); (dst / "lessons").mkdir()
if mode == "seeded":
    for d in sorted(Path("kernel_store").iterdir()):
        if (d / "entry.yaml").is_file():
            shutil.copytree(d, dst / "kernel_store" / d.name)
            b = dst / "kernel_store" / d.name / "bench.json"
            if b.is_file():  # the GPU knowledge goes; CPU correctness records stay
                data = json.loads(b.read_text()); data.pop("gpu", None); data.pop("history", None)
                b.write_text(json.dumps(data, indent=2) + "\n")
            # the device tool lends an H100 for an H200 at times: an entry declared for the H200 is
            # tried on the lent Hopper GPU too (validation decides), and the experiment says so
            y = dst / "kernel_store" / d.name / "entry.yaml"
            m = re.search(r"(?m)^hardware: \[([^\]]*)\]", y.read_text())
            have = [x.strip() for x in m[1].split(",")] if m else []
            if hw in ("h100", "h200") and "h200" in have and hw not in have:
                y.write_text(y.read_text().replace(m[0], f"hardware: [{', '.join(have + [hw])}]", 1))
                print(f"{d.name}: hardware {have} + {hw} (the lent GPU) for this experiment")
    for f in sorted(Path("lessons").glob("*.md")):
        if not re.search(r"-on-(?!cpu-)[a-z0-9]+-", f.name):  # a GPU verdict's caveat (knowledge/learn.check_lesson)
            shutil.copy(f, dst / "lessons" / f.name)
subprocess.run(["git", "init", "-q", str(dst)], check=True)
subprocess.run(["git", "-C", str(dst), "add", "-A"], check=True)
subprocess.run(["git", "-C", str(dst), "-c", "user.name=optbot", "-c", "user.email=optbot@localhost", "commit", "-q",
                "--allow-empty", "-m", f"loop experiment start ({mode})"], check=True)
PY
  { nvidia-smi 2>/dev/null || true; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } >> "$RES/env.txt" 2>&1
fi

# which machine and which optbot each call ran on: an experiment may span machines and sessions (a pinned
# optbot, benchmarks/loop_pin.sh, names its commit in PIN)
echo "$(date -u +%FT%TZ) $( (nvidia-smi -L 2>/dev/null || echo "$DEVICE") | head -1) optbot $(cat PIN 2>/dev/null \
  || git rev-parse HEAD 2>/dev/null || echo unknown)" >> "$LOOP/calls.txt"
cp "$LOOP/calls.txt" "$RES/"

runs="${LOOP_RUNS:-1 2}"
for run in $runs; do
  [ -f "$LOOP/run$run.done" ] && continue
  if [ "$run" -gt 1 ] && [ ! -f "$LOOP/run$((run - 1)).done" ]; then
    echo "run $run: run $((run - 1)) has not ended in $LOOP" >&2; exit 3
  fi
  left=$(( CALL_S - ($(date +%s) - T0) - RESERVE_S ))
  if [ "$left" -lt 30 ]; then
    echo "run $run: not started in this call (${left} s left before the reserve): call again"; pack; exit 0
  fi
  start=$(date +%s)
  if [ -s "$LOOP/run$run.id" ]; then
    args=(--resume "$(cat "$LOOP/run$run.id")")
  else
    args=(--preset "$PRESET" --device "$DEVICE" --gpus "$gpus" --dry-run --knowledge-path "$know"
          --ablation-rounds "${ABLATION_ROUNDS:-1}")
    [ -n "${GENERATORS:-}" ] && args+=(--generators "$GENERATORS")
  fi
  before=$(finished "$run")
  limit=$(( CALL_S - ($(date +%s) - T0) - PACK_S ))
  timeout --kill-after=15 "$limit" python3 -m bot optimize "$wl" "${args[@]}" --pause-after "${left}s" \
    --json "$LOOP/run$run.json" >> "$LOOP/run$run.txt" 2>&1
  rc=$?
  # the run's id from the first line optimize prints (an attempt cut by the limit writes no --json)
  [ -s "$LOOP/run$run.id" ] || grep -m1 -o '^run [0-9]\{8\}-[0-9]\{6\}-optimize-[0-9a-f]*' "$LOOP/run$run.txt" \
    | cut -d' ' -f2 > "$LOOP/run$run.id"
  [ -s "$LOOP/run$run.id" ] || { echo "run $run: no run id in $LOOP/run$run.txt" >&2; rm -f "$LOOP/run$run.id"; tail -30 "$LOOP/run$run.txt"; pack; exit 1; }
  echo "run $run: attempt exit $rc after $(( $(date +%s) - start )) s wall" | tee -a "$LOOP/wall.txt"
  cut=""
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    if [ "$(finished "$run")" = "$before" ]; then  # one runner process outlasts a whole call: it never would end
      cut=4; msg="cut at the call's limit ($limit s) without finishing one runner process: raise CALL_S"
    else
      cut=0; msg="cut at the call's limit ($limit s): call again; it resumes from the finished runner processes"
    fi
    echo "run $run: $msg" | tee -a "$LOOP/wall.txt" "$LOOP/run$run.txt"
  fi
  cp "$LOOP/run$run.txt" "$LOOP/run$run.json" "$LOOP/wall.txt" "$RES/" 2>/dev/null
  if [ "$rc" = 75 ]; then echo "run $run paused: call again"; pack; exit 0; fi
  if [ -n "$cut" ]; then pack; exit "$cut"; fi
  if [ "$rc" != 0 ]; then tail -30 "$LOOP/run$run.txt"; pack; exit "$rc"; fi
  touch "$LOOP/run$run.done"
  cp "$OPTBOT_RUNS_DIR/$(cat "$LOOP/run$run.id")/state.json" "$RES/run$run-state.json"
  # a person merges the knowledge PR between the runs: here, the knowledge branch fast-forwards
  kb=$(git -C "$know" for-each-ref --format='%(refname:short)' refs/heads/optbot/knowledge | head -1)
  if [ -n "$kb" ]; then
    git -C "$know" merge -q --ff-only "$kb" && git -C "$know" log --oneline -1 | tee -a "$LOOP/wall.txt"
    git -C "$know" branch -q -D "$kb"
    git -C "$know" show --stat HEAD > "$RES/run$run-knowledge-commit.txt"
  fi
done
# gain and GPU time of both runs, and every candidate's estimate against what it realized
[ "$runs" = "1 2" ] && python3 benchmarks/loop_summary.py "$LOOP/run1.json" "$LOOP/run2.json" | tee "$RES/summary.md"
pack
