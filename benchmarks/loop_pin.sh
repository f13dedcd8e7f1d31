#!/usr/bin/env bash
# Pin a knowledge-loop experiment (benchmarks/gpu_loop.sh) to the optbot it started with, when main
# has moved on in ways that change what a run does (which candidates are validated, how): both runs
# of one experiment must run the same code, or their GPU times do not compare.
#
#   bash benchmarks/loop_pin.sh COMMIT     # here: .loop-pin/ = that commit's bot/, runner/ and workloads/,
#                                          # with the loop's own scripts as they are now (the harness, not the optimizer)
#   # then each device call carries .whl, .loop-kit and .loop-pin and runs from there:
#   cd .loop-pin && LOOP_CONTINUE=1 RES=... bash benchmarks/gpu_loop.sh WORKLOAD
#
# .loop-pin/ is git-ignored (1.6 MB at f540452); .whl and .loop-kit are linked from the checkout's root.
set -euo pipefail
c="${1:?usage: bash benchmarks/loop_pin.sh COMMIT}"
rm -rf .loop-pin && mkdir -p .loop-pin
git archive "$c" bot runner workloads pyproject.toml | tar -x -C .loop-pin
mkdir -p .loop-pin/benchmarks && cp benchmarks/gpu_loop.sh benchmarks/gpu_tag.sh benchmarks/loop_summary.py .loop-pin/benchmarks/
ln -s ../.whl .loop-pin/.whl && ln -s ../.loop-kit .loop-pin/.loop-kit
git rev-parse "$c" > .loop-pin/PIN
echo ".loop-pin/ at $(cat .loop-pin/PIN) ($(du -sh .loop-pin | cut -f1))"
