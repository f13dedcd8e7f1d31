"""Where a profile's non-GEMM time goes, by place: kernels summed over the repeated blocks.

    python benchmarks/profile_places.py PROFILE.json[.gz] [CATEGORY ...] [--top N]

A profile (`optbot profile WL --json ...`) lists each kernel with its module
(`single_transformer_blocks.17.attn`); this folds the block indices (`single_transformer_blocks.*.attn`)
and sums ms and calls per (category, op, kernel, place), largest first. Categories default to
elementwise, copy and normalization: the time a fusion can take. Every number printed is the
profile's own.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
from pathlib import Path


def load(path: Path) -> dict:
    """A result JSON, plain or gzipped (benchmarks/summarize.py reads through this too)."""
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def places(profile: dict, categories: set[str]) -> list[tuple[float, int, tuple[str, str, str, str]]]:
    ms: dict[tuple[str, str, str, str], float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    for k in profile["kernels"]:
        if k["category"] not in categories:
            continue
        place = re.sub(r"\.\d+(?=\.|$)", ".*", k.get("module") or "")
        key = (k["category"], k.get("op") or "-", k["name"][:60], place or "-")
        ms[key] += k["ms"]
        calls[key] += k["calls"]
    return sorted(((v, calls[key], key) for key, v in ms.items()), reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("categories", nargs="*", default=["elementwise", "copy", "normalization"])
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    if not a.profile.is_file():
        ap.error(f"{a.profile}: no such file (large results are stored as NAME.json.gz)")
    p = load(a.profile)
    cats = p["categories"]
    print(f"{a.profile}: {p['total_ms']:.1f} ms/step on {p['env'].get('device_name')}; "
          + ", ".join(f"{c} {v:.1f}" for c, v in cats.items() if v))
    print("| ms | calls | category | op | kernel | place |\n|---:|---:|---|---|---|---|")
    for v, n, (cat, op, name, place) in places(p, set(a.categories))[: a.top]:
        print(f"| {v:.2f} | {n} | {cat} | {op} | `{name}` | {place} |")


if __name__ == "__main__":
    main()
