#!/usr/bin/env bash
# GPU checks of the generators (bot/agent, variant search, compile region). One self-contained
# command for the H200 (no network needed; no API key needed: the agent is exercised by the CPU tests
# against the local stand-in). Results go to benchmarks/results/gpu-generate-<date>/.
#   bash benchmarks/gpu_generate.sh            # ~5-9 minutes on one H200
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/gpu-generate-$(date -u +%Y%m%d)
mkdir -p "$OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

# 1. Variant search on the GPU: the test kernel's config space timed with runner/timing.time_interleaved.
python -m pytest -o addopts="" tests/generate/test_variants.py -m gpu -q -s 2>&1 | tee "$OUT/variant-search-test.txt"

# 2. Variant search over every kernel_store entry that declares a config space (bf16, cuda).
python - <<'PY' 2>&1 | tee "$OUT/variant-search-store.txt"
import json, pathlib, yaml
from bot.generate.variants import search_entry
out = pathlib.Path("benchmarks/results") / sorted(p.name for p in pathlib.Path("benchmarks/results").glob("gpu-generate-*"))[-1]
for d in sorted(pathlib.Path("kernel_store").iterdir()):
    f = d / "entry.yaml"
    if not f.is_file() or not (yaml.safe_load(f.read_text()) or {}).get("config_space"):
        continue
    try:
        res = search_entry(d, device="cuda", run_dir=out / f"variants-{d.name}")
        print(res.table())
    except Exception as e:  # one entry's failure must not hide the others
        print(f"{d.name}: {type(e).__name__}: {e}")
PY

# 3. Compile region on FLUX.2 full: regions from the committed H200 profile, the candidate commit,
#    then the validator (correctness + interleaved speed, eager and CUDA graph).
SHA=$(python - <<'PY'
import json, sys
from bot.target import resolve_target
from bot.generate import compile_region
t = resolve_target("flux2", None, None, "full", "cuda")
prof = json.load(open("benchmarks/results/h200-20261129/profile-flux2-full.json"))
c = compile_region.generate(t.checkout, t.checkout.base_sha, prof, t.model_class, t.checkout.import_root, "gpu-generate")
print(c.commit_sha)
PY
)
echo "compile-region candidate: $SHA" | tee "$OUT/compile-region.txt"
timeout 480 python -m bot validate flux2 --preset full --device cuda --candidate "$SHA" \
  --json "$OUT/compile-region-verdict.json" 2>&1 | tee -a "$OUT/compile-region.txt"
echo "results in $OUT"
