"""The base's profile and analysis, kept for the next run of the very same base (issue 18).

A second `optimize` of an unchanged base spent about 85 GPU-s (of 691) re-profiling and
re-capturing it before any candidate was looked at. Those two measurements only rank the
opportunities; no verdict, speedup or delivered number comes from them (the baseline step still
times the base afresh, and the validator times base and candidate side by side, always). So the
profile and the analysis are reused when everything that determines them is unchanged:

- the base: engine name and commit, the workload's whole definition (its presets, shapes, inputs,
  tolerance), preset, dtype and device;
- the machine and software, from this run's fresh baseline: GPU name, driver, CUDA, torch, triton,
  Python, numpy, and the engine's own environment record (sgl_kernel stand-in, SGLang setup);
- optbot's measuring and analyzing code: every file of bot/analyze/ and the runner's profiler,
  graph capture, their jobs, the quantization recipe (runner/quant.py), the inputs and the engine
  adapters that call the model (runner/inputs.py, runner/engines/), by content;
- the profile's timed steps.

Only on a GPU (where the time is scarce and the key's software fields exist), never with
`--revalidate`. The cache lives in $OPTBOT_HOME/cache/base/<key>/ (profile.full.json, graph.json,
analysis.full.json, origin.json); a reuse copies the files into the run and says which run
measured them (the step's `reused_from`, the analysis meta's `reused_from`).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from bot.jsonable import write_json_atomic
from bot.paths import REPO_ROOT, optbot_home

# The environment record's fields that decide a profile (runner/env.py); paths and thread counts do not.
ENV_KEYS = ("device_kind", "device_name", "driver", "cuda", "torch", "triton", "python", "numpy", "capability",
            "sm_count", "sgl_kernel", "sglang_setup", "engine_sha")
FILES = ("profile.full.json", "graph.json", "analysis.full.json")
# runner/quant.py: an FP8 run's graph and profile are those of the model the recipe made; runner/inputs.py
# and runner/engines/: what the model is called with (an SGLang step shares one timestep between its CFG
# passes, and with it the second pass's modulation, since 2026-12-05)
CODE = ("bot/analyze", "runner/graph_capture.py", "runner/profiler.py", "runner/kinds/graph.py",
        "runner/kinds/profile.py", "runner/harness.py", "runner/quant.py", "runner/inputs.py", "runner/engines")


@dataclass(frozen=True)
class Origin:
    """Which run measured a cached base, and when."""
    run_id: str
    created_at: str
    key: str

    def line(self) -> str:
        return f"run {self.run_id} ({self.created_at}; same base, workload, machine, software and analyzer)"


def code_digest(root: Path = REPO_ROOT) -> str:
    h = hashlib.sha256()
    for rel in CODE:
        p = root / rel
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            if f.is_file():
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def key_of(target, env: dict, profile_iters: int) -> str:
    fields = {
        "workload": target.workload.to_json(), "engine": target.engine_name, "base_sha": target.checkout.base_sha,
        "preset": target.preset, "dtype": target.dtype, "device": target.device,
        "env": {k: env.get(k) for k in ENV_KEYS}, "code": code_digest(), "profile_iters": profile_iters,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:24]


def cache_dir(key: str) -> Path:
    return optbot_home() / "cache" / "base" / key


def lookup(key: str) -> tuple[Path, Origin] | None:
    """The cached folder and its origin when it holds the whole set (FILES)."""
    d = cache_dir(key)
    try:
        o = json.loads((d / "origin.json").read_text())
        origin = Origin(o["run_id"], o["created_at"], o["key"])
    except (OSError, ValueError, KeyError):
        return None
    if origin.key != key or not all((d / n).is_file() for n in FILES):
        return None
    return d, origin


def store(key: str, run_id: str, files: dict[str, Path]) -> None:
    """Copy `files` (cache name -> this run's file) into the key's folder, as one set: the origin
    is removed first and written last, so a half-written folder is never looked up."""
    import time
    d = cache_dir(key)
    d.mkdir(parents=True, exist_ok=True)
    (d / "origin.json").unlink(missing_ok=True)
    for name, src in files.items():
        tmp = d / f".{name}.tmp"
        shutil.copyfile(src, tmp)
        tmp.replace(d / name)
    write_json_atomic(d / "origin.json", {"run_id": run_id, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                          "key": key})
