#!/usr/bin/env bash
# SGLang's own FLUX.2 and Qwen-Image DiTs on the H200, full preset: the production baseline.
#
# Because the GPU box reaches no package registry:
#   1. here, with the registry:   bash benchmarks/gpu_sglang.sh download
#      fills the git-ignored carry folders (docs/sglang.md):
#        .whl-sgl-b/   the light import set the GPU image lacks, and diffusers' sdist (20 MB)
#        .sgl-engine/  the engine repository as a git bundle of its one commit (18 MB; the sglang
#                      wheel itself, 39 MB, is .whl-sgl-a/ for the older two-call way)
#        .cdsl-a/, .cdsl-b/, .cdsl-c/  CuTe-DSL (nvidia-cutlass-dsl 4.8.1, cu13: SGLang's Qwen-Image
#                      imports `cutlass` on CUDA), 97 MB of wheels as one xz tar in thirds of ~22 MB
#        .whl-sgl-c/   .whl-sgl-b less torchao (16 MB), for runs that carry .sgl-engine (without torchao
#                      a QUANT=fp8 bench's diffusers reference rows, torchao's recipe, cannot run: bench
#                      those in a call of their own carrying .whl-sgl-b)
#      The carry limit counts disk usage: the tree plus .whl-sgl-c and .sgl-engine was 66.9 MiB on
#      2026-12-07, so .sgl-engine goes in a call of its own first (`WHL=.whl-sgl-c bash
#      benchmarks/gpu_sglang.sh cmd true`: the engine is cloned into the machine's /tmp, where it stays
#      while the machine is warm), then the work carrying .whl-sgl-c; each CuTe-DSL third needs a call
#      of its own on the same warm machine first:
#        bash benchmarks/gpu_sglang.sh stage      # carry .cdsl-a, then .cdsl-b, then .cdsl-c
#   2. on the H200 (carry .whl-sgl-c and .sgl-engine, WHL=.whl-sgl-c):
#      bash benchmarks/gpu_sglang.sh            # profile of both DiTs; or: bash benchmarks/h200.sh sglang
#      results under $RES/sglang (from h200.sh), else $OUT, else benchmarks/results/h200-sglang-<date>/
#   3. the full optimize of SGLang's FLUX.2, in calls of at most LIMIT s (default 560) that pause
#      (exit 75) and resume on one warm machine (about 500 s of device time: issue 21):
#      WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh optimize flux2            # then, back to back:
#      WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh optimize flux2 RUN_ID
#      env: GENERATORS (default replay,template), ITERS, ABLATION (--ablation-rounds), QUANT (fp8: SGLang's
#      own FP8 path; replay offers sglang-fp8-quant-compile, which makes its compiled modes run), PAUSE
#      (default LIMIT - 340: one SGLang validation in four modes is ~330 s and is never cut), ENGINE
#      (diffusers: the same run on the diffusers engine, carried without .sgl-engine; e.g. QUANT=fp8
#      ENGINE=diffusers GENERATORS=replay ... optimize qwen-image: issue 16's FP8 optimize on a GPU).
#   4. any command in that environment: WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh cmd python3 -m bot ...
#      a store check of SGLang entries: WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh check ENTRY...
#      its GPU tests: WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh pytest tests/sglang/test_sglang_models.py -k fa3
#   5. the bench of what optimize delivered, on the same warm machine (its branch lives there):
#      WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh bench flux2 optbot/flux2/<sglang-sha12>
#
# Each workload runs `optbot profile WL --engine sglang --preset full --device cuda`. A workload that
# cannot be brought up leaves its exact blocker in $OUT/blocker-WL.txt (the failing step and the
# error) instead of stopping the script. The environment block of each result says which stand-ins
# were used (sgl_kernel: "optbot stand-in ...") and what is absent (flashinfer).
set -uo pipefail
what="${1:-run}"
WHL="${WHL:-.whl-sglang}"

if [[ "$what" == download ]]; then
  set -e
  mkdir -p "$WHL"
  # manylinux_2_34: the only platform sglang 0.5.23 publishes.
  PLAT=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
    -d "$WHL" sglang==0.5.23
  # The light set (requirements-sglang.txt) minus what the GPU image already holds (KINDS.md's
  # list: aiohttp, einops, psutil, sentencepiece, imageio, transformers 5.17, triton, ...), plus
  # their missing dependencies and gitpython for the
  # bot. Versions as this registry resolved them for cp312; never a torch, triton or CUDA library.
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
    -d "$WHL" \
    apache-tvm-ffi==0.1.11 cache-dit==1.5.1 compressed-tensors==0.18.0 importlib-metadata==10.2.0 \
    gguf==0.19.0 addict==2.4.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 msgspec==0.23.0 orjson==3.13.0 pybase64==1.5.1 pyzmq==27.3.0 starlette==1.10.0 \
    loguru==0.7.3 dill==0.4.1 ipython==9.18.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1 parso==0.8.7 \
    matplotlib-inline==0.2.2 pexpect==4.9.0 ptyprocess==0.7.0 prompt-toolkit==3.0.53 wcwidth==0.9.4 \
    stack-data==0.6.3 asttokens==3.0.2 executing==2.3.0 pure-eval==0.2.4 traitlets==5.16.1 \
    gitpython gitdb smmap
  # torchao for QUANT=fp8 (issue 16: the FP8 recipe's float8 weights; 3.4 MB)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
    --platform manylinux_2_24_x86_64 -d "$WHL" torchao==0.18.0
  # diffusers' source distribution: the diffusers engine (bench's reference rows) is made from it,
  # and its src/ also serves cache_dit's `import diffusers`, so the 6 MB wheel stays behind
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$WHL" diffusers==0.42.1
  # Two halves for two calls to one warm machine (docs/sglang.md): the wheel, and the rest.
  rm -rf .whl-sgl-a .whl-sgl-b && mkdir -p .whl-sgl-a .whl-sgl-b
  cp "$WHL"/sglang-0.5.23-*.whl .whl-sgl-a/
  # jedi (4.9 MB) and parso stay behind: IPython 9 imports jedi only for completion
  # (IPython/core/completer.py `_get_jedi`), and without them the tree, .whl-sgl-b and .sgl-engine
  # fit one call's 64 MiB (68.3 MiB with them on 2026-12-05)
  find "$WHL" -name '*.whl' ! -name 'sglang-0.5.23-*' ! -name 'diffusers-*' ! -name 'jedi-*' ! -name 'parso-*' \
    -exec cp {} .whl-sgl-b/ \;
  cp "$WHL"/diffusers-0.42.1.tar.gz .whl-sgl-b/
  # .whl-sgl-c: .whl-sgl-b less torchao (16 MB), for runs with .sgl-engine: the tree grew so that
  # .whl-sgl-b + .sgl-engine passed one call's 64 MiB (2026-12-07; 62.2 MiB with .whl-sgl-c). SGLang's own
  # FP8 path needs no torchao; the sdist stays (cache_dit, in SGLang's import chain, imports diffusers).
  rm -rf .whl-sgl-c && mkdir -p .whl-sgl-c && cp .whl-sgl-b/* .whl-sgl-c/ && rm .whl-sgl-c/torchao-*
  # CuTe-DSL: the meta wheel only holds a .pth that puts nvidia_cutlass_dsl/dsl_packages on
  # sys.path, which an install into a --target folder never runs: the run below names that folder
  # on PYTHONPATH itself. cuda-bindings and protobuf are on the GPU image.
  mkdir -p "$WHL/cdsl"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
    -d "$WHL/cdsl" nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
    nvidia-cutlass-dsl-libs-cu13==4.8.1
  if [[ ! -f "$WHL/cdsl.tar.xz" ]]; then
    x=$(mktemp -d); for w in "$WHL"/cdsl/*.whl; do unzip -q -o "$w" -d "$x"; done
    tar cf - -C "$x" . | xz -T0 -6 > "$WHL/cdsl.tar.xz"; rm -rf "$x"
  fi
  # in thirds (22 MB each): a half (33 MB) and the tree passed one call's 64 MiB once the tree grew past 30 MiB
  rm -rf .cdsl-a .cdsl-b .cdsl-c && mkdir -p .cdsl-a .cdsl-b .cdsl-c
  split -n 3 -d "$WHL/cdsl.tar.xz" "$WHL/cdsl.tar.xz.part-"
  mv "$WHL/cdsl.tar.xz.part-00" .cdsl-a/ && mv "$WHL/cdsl.tar.xz.part-01" .cdsl-b/ && mv "$WHL/cdsl.tar.xz.part-02" .cdsl-c/
  # The engine repository as a git bundle: the same deterministic commit the wheel gives
  # (bot/engine.py), in half the bytes, so that one call carries all it needs.
  repo=$(python3 -m bot engine init sglang | awk '$1 == "repository" {print $2}')
  rm -rf .sgl-engine && mkdir -p .sgl-engine
  git -C "$repo" bundle create "$PWD/.sgl-engine/sglang-0.5.23.bundle" main
  ls -la "$WHL"; du -sh "$WHL" .whl-sgl-a .whl-sgl-b .sgl-engine .cdsl-a .cdsl-b .cdsl-c
  exit 0
fi

# CuTe-DSL, staged in thirds by earlier calls on this machine (each carrying one), unpacked once all are here
CDSL=/tmp/cdsl-parts
for d in .cdsl-a .cdsl-b .cdsl-c; do [[ -d "$d" ]] && mkdir -p "$CDSL" && cp "$d"/cdsl.tar.xz.part-* "$CDSL"/; done
if [[ "$what" == stage ]]; then ls -la "$CDSL"; exit 0; fi
if [[ ! -d /tmp/site-cdsl/nvidia_cutlass_dsl && -f "$CDSL/cdsl.tar.xz.part-00" && -f "$CDSL/cdsl.tar.xz.part-01" \
      && -f "$CDSL/cdsl.tar.xz.part-02" ]]; then
  mkdir -p /tmp/site-cdsl && cat "$CDSL"/cdsl.tar.xz.part-* | xz -d | tar xf - -C /tmp/site-cdsl
fi
CDSL_PATH=""
[[ -d /tmp/site-cdsl/nvidia_cutlass_dsl ]] && CDSL_PATH="/tmp/site-cdsl:/tmp/site-cdsl/nvidia_cutlass_dsl/dsl_packages"

# Results: $RES/sglang when called from benchmarks/h200.sh (its staging folder), else $OUT, else
# benchmarks/results/h200-sglang-<date>/.
D="${RES:+$RES/sglang}"
D="${D:-${OUT:-benchmarks/results/h200-sglang-$(date +%Y%m%d)}}"
mkdir -p "$D"
export OPTBOT_HOME="${OPTBOT_HOME:-/tmp/optbot-home}" PYTHONUNBUFFERED=1
mkdir -p "$OPTBOT_HOME/downloads"
if [[ -d "$WHL" ]]; then
  # Everything but sglang itself goes to /tmp/site; sglang's wheel only feeds the engine repository.
  ls "$WHL"/*.whl | grep -v '/sglang-' | xargs python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site 2>&1 | tail -3
  cp "$WHL"/sglang-0.5.23-*.whl "$WHL"/diffusers-0.42.1.tar.gz "$OPTBOT_HOME/downloads/" 2>/dev/null
fi
# (benchmarks/h200.sh's own layout also works: light-set wheels in .whl/ installed there, and the
# sglang wheel carried as .whl/sglang-*.whl.keep, copied to the downloads folder.)
for f in .whl/sglang-0.5.23-*.whl.keep; do [[ -f "$f" ]] && cp "$f" "$OPTBOT_HOME/downloads/$(basename "${f%.keep}")"; done
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" ;; esac
[[ -n "$CDSL_PATH" ]] && export PYTHONPATH="$PYTHONPATH:$CDSL_PATH"
eng="$OPTBOT_HOME/engines/sglang-0.5.23"
if [[ -f .sgl-engine/sglang-0.5.23.bundle && ! -d "$eng/.git" ]]; then
  # the clone gets the settings bot/engine.py gives a repository it materializes
  git clone -q --branch main .sgl-engine/sglang-0.5.23.bundle "$eng" && git -C "$eng" remote remove origin && \
    git -C "$eng" config core.autocrlf false && git -C "$eng" config user.name optbot && \
    git -C "$eng" config user.email optbot@localhost
fi
# cache_dit (in SGLang's import chain) imports diffusers: the diffusers engine's src/ serves it
if ! python3 -c "import diffusers" 2>/dev/null && [[ -f "$OPTBOT_HOME/downloads/diffusers-0.42.1.tar.gz" ]]; then
  python3 -m bot engine init diffusers > /dev/null && export PYTHONPATH="$PYTHONPATH:$OPTBOT_HOME/engines/diffusers-0.42.1/src"
fi
# `cmd` also serves diffusers-only work (benchmarks/gpu_fp8_plan.sh), carried without .sgl-engine when the
# tree, .whl-sgl-b and .sgl-engine together pass one call's 64 MiB
[[ -d "$eng/.git" || "$what" == cmd || "${ENGINE:-sglang}" == diffusers ]] || ls "$OPTBOT_HOME"/downloads/sglang-0.5.23-*.whl >/dev/null 2>&1 || {
  echo "no sglang 0.5.23 wheel: run 'bash benchmarks/gpu_sglang.sh download' where a registry is reachable and carry $WHL" \
    | tee "$D/blocker.txt"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$D/nvidia-smi.txt"

if [[ "$what" == optimize ]]; then
  wl="${2:-flux2}"; resume="${3:-}"; ENGINE="${ENGINE:-sglang}"
  LIMIT="${LIMIT:-560}"; PAUSE="${PAUSE:-$((LIMIT - 340))}"
  # what starts before PAUSE runs to its end: one SGLang validation (~330 s) or one ablation round
  # (~150 s); a PAUSE closer to LIMIT lets `timeout` cut it (2026-12-07: PAUSE=560 LIMIT=570 cut a
  # leave-one-out one job before its end), and the next --resume call redoes the runner process it cut
  # (finished ones are kept: bot/validate/attempt.py, ablation/rounds.json)
  (( PAUSE + 340 > LIMIT )) && echo "warning: PAUSE=$PAUSE leaves $((LIMIT - PAUSE)) s of LIMIT=$LIMIT for the work it lets start (one validation is ~330 s)" >&2
  export OPTBOT_RUNS_DIR="${OPTBOT_RUNS_DIR:-/tmp/optbot-runs}"
  start=$(date +%s)
  if [[ -n "$resume" ]]; then
    timeout "$LIMIT" python3 -m bot optimize "$wl" --resume "$resume" --pause-after "${PAUSE}s" \
      --json "$D/optimize-$wl-$ENGINE.json" 2>&1 | tee -a "$D/optimize-$wl-$ENGINE.txt"
  else
    timeout "$LIMIT" python3 -m bot optimize "$wl" --engine "$ENGINE" --preset full --device cuda --dry-run \
      ${QUANT:+--quant "$QUANT"} \
      --generators "${GENERATORS:-replay,template}" --pause-after "${PAUSE}s" ${ITERS:+--iters $ITERS} \
      ${ABLATION:+--ablation-rounds $ABLATION} --json "$D/optimize-$wl-$ENGINE.json" 2>&1 | tee "$D/optimize-$wl-$ENGINE.txt"
  fi
  rc=${PIPESTATUS[0]}
  echo "$wl $ENGINE optimize attempt: $(( $(date +%s) - start )) s wall, exit $rc" | tee -a "$D/wall.txt"
  run=$(ls -td "$OPTBOT_RUNS_DIR"/*-optimize-* 2>/dev/null | head -1)
  if [[ -n "$run" ]]; then
    bash benchmarks/collect_run.sh "$run" "$D" "WHL=/tmp/sglw bash benchmarks/gpu_sglang.sh optimize"
  fi
  exit "$rc"
fi

if [[ "$what" == cmd ]]; then
  # any command in this environment, e.g. WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh cmd python3 -m bot profile ...
  shift
  "$@"
  exit $?
fi

if [[ "$what" == check ]]; then
  # the store check of SGLang entries on this GPU (correctness, engagement, the four timed modes), e.g.
  #   WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh check sglang-fp8-quant-compile     (~330 s a FLUX.2 entry)
  # then, on the machine that holds the repository: optbot store record-bench <the JSON in the results>
  shift
  start=$(date +%s)
  timeout "${LIMIT:-560}" python3 -m bot store check "$@" --engine sglang --device cuda \
    --json "$D/store-check-sglang.json" 2>&1 | tee "$D/store-check-sglang.txt"
  rc=${PIPESTATUS[0]}
  echo "sglang store check: $(( $(date +%s) - start )) s wall, exit $rc" | tee -a "$D/wall.txt"
  # a failing job's log names the cause (the FP8 compile obstacles were found this way)
  run=$(ls -td "${OPTBOT_RUNS_DIR:-.optbot/runs}"/*-store-check-* /tmp/optbot-runs/*-store-check-* 2>/dev/null | head -1)
  [[ -n "$run" ]] && find "$run" -name '*.log' -size -2M -exec grep -l -E 'Error|Traceback' {} + 2>/dev/null | head -8 |
    while read -r f; do cp "$f" "$D/$(echo "${f#$run/}" | tr '/' '_')"; done
  exit "$rc"
fi

if [[ "$what" == pytest ]]; then
  # the GPU tests of SGLang in this same environment, e.g.
  #   WHL=.whl-sgl-b bash benchmarks/gpu_sglang.sh pytest tests/sglang/test_sglang_models.py -k fa3
  shift
  # the tests' home is this script's (tests/conftest.py): the engine cloned from the bundle above, no download
  OPTBOT_TEST_HOME="$OPTBOT_HOME" python3 -m pytest -o addopts="" -q -m gpu "$@" 2>&1 | tee "$D/pytest-gpu.txt"
  exit "${PIPESTATUS[0]}"
fi

if [[ "$what" == bench ]]; then
  # upstream SGLang in the four production modes (MODES: bench's --modes; the whole-model compile
  # recipes add about two minutes), the optimized SGLang branch (CANDIDATE: a ref in the engine
  # repository, e.g. what `optimize` delivered on this machine) in the four production modes,
  # diffusers upstream in the same four as the reference, and the floor: one run (QUANT=fp8: the
  # upstream+fp8 rows and the FP8 floor too; torchao must be carried beside the light set)
  wl="${2:-flux2}"; cand="${3:-}"
  start=$(date +%s)
  timeout "${LIMIT:-560}" python3 -m bot bench "$wl" --engine sglang --preset full --device cuda \
    ${QUANT:+--quant "$QUANT"} ${cand:+--candidate "$cand"} --modes "${MODES:-eager,graph,compile,compile+graph}" --with-engine diffusers --json "$D/bench-$wl-sglang.json" 2>&1 | tee "$D/bench-$wl-sglang.txt"
  rc=${PIPESTATUS[0]}
  echo "$wl sglang bench: $(( $(date +%s) - start )) s wall, exit $rc" | tee -a "$D/wall.txt"
  exit "$rc"
fi

python3 -m bot engine init sglang 2>&1 | tee "$D/engine.txt"
python3 -m pip list 2>/dev/null | grep -iE '^(torch|triton|transformers|diffusers|apache-tvm-ffi|cache.dit|compressed-tensors|nvidia-cutlass-dsl[a-z0-9-]*) ' \
  > "$D/packages.txt"

status=0
for wl in flux2 qwen-image; do
  start=$(date +%s)
  # Each workload gets at most 240 s, so both fit in one 10-minute device command.
  timeout -k 10 240 python3 -m bot profile "$wl" --engine sglang --preset full --device cuda --iters 5 \
    --json "$D/profile-$wl-sglang-full.json" > "$D/profile-$wl-sglang-full.txt" 2>&1
  rc=$?
  echo "$wl: exit $rc, $(( $(date +%s) - start )) s wall" | tee -a "$D/wall.txt"
  if [[ $rc -ne 0 ]]; then
    status=1
    { echo "optbot profile $wl --engine sglang --preset full --device cuda: exit $rc"
      [[ $rc -eq 124 ]] && echo "killed after 240 s (timeout)"
      grep -E "Error|error:|Exception|not available|No module" "$D/profile-$wl-sglang-full.txt" | tail -8
      echo "--- log tail"; tail -40 "$D/profile-$wl-sglang-full.txt"; } > "$D/blocker-$wl.txt"
    tail -15 "$D/blocker-$wl.txt"
  fi
done

python3 - "$D" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print(f"{'workload':<11} {'engine':<8} {'step ms':>9} {'pass ms':>9} {'gemm':>7} {'attn':>7} {'norm':>7} {'elem':>7} {'copy':>7} {'launch':>7}  stand-ins")
for wl in ("flux2", "qwen-image"):
    f = out / f"profile-{wl}-sglang-full.json"
    if not f.is_file():
        print(f"{wl:<11} sglang   blocked: see {out / f'blocker-{wl}.txt'}")
        continue
    p = json.loads(f.read_text())
    c = p["categories"]
    st = {k: p["env"][k] for k in ("sgl_kernel", "torchvision") if k in p["env"]}
    print(f"{wl:<11} sglang   {p['step_ms']:9.1f} {p['per_pass_ms']:9.1f} {c['gemm']:7.1f} {c['attention']:7.1f} "
          f"{c['normalization']:7.1f} {c['elementwise']:7.1f} {c['copy']:7.1f} {p['launches']:7d}  {st}")
    print("device:", p["env"]["device_name"], "driver", p["env"]["driver"], "torch", p["env"]["torch"],
          "triton", p["env"]["triton"], "engine", p["env"]["engine_sha"][:12])
PY
exit $status
