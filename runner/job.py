"""The job schema: what the bot hands the runner, and what comes back. Pure Python (no torch), so
the bot can import it without importing torch.

Job JSON (written by the bot, read by ``python -m runner JOB FD``):
  kind          a module of runner/kinds/: "step" (build, run, time, save outputs), "profile"
                (step + torch.profiler + FLOPs + ceilings), "probe" (environment only), ...
  workload      Workload.to_json() of bot/workload.py, the whole parsed file
  preset        "full" | "tiny"
  device        "cpu" | "cuda" | "cuda:N"
  dtype         "float32" | "bfloat16" | "float16", with "+fp8" when the linear layers run in FP8
                (split_precision; runner/quant.py)
  engine_root   absolute path of the engine's import root (first on PYTHONPATH)
  engine_sha    the worktree's commit (recorded in the environment block)
  model_class   dotted path of the model class inside the engine
  shapes        list of Shape dicts to run (resolution, text_tokens, batch)
  seeds         input seeds; every (shape, seed) pair is one saved output set
  weight_seed   seed of the seeded state dict (one derived seed per tensor name)
  warmup, iters timing: warm-up steps and timed steps (first shape, first seed)
  out_dir       where outputs (.pt) and traces go
  params        kind-specific parameters (documented in that kind's module)
Result (one message on the FD pipe, runner/channel.py): {"ok": bool, "error": {kind, message, log_tail} | null, ...kind-specific fields}.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any



# Quantization recipes (runner/quant.py applies one after the weights load). A job's dtype names
# its precision: the model's dtype, then "+RECIPE" when its linear layers run quantized
# ("bfloat16+fp8"). One string, so that every record keyed by dtype (verdicts, store matches,
# tolerances, cached profiles) keeps quantized and unquantized results apart by construction.
QUANT_RECIPES = ("fp8",)
FLOAT_DTYPES = ("float32", "bfloat16", "float16")  # a model's dtype
PRECISIONS = FLOAT_DTYPES + tuple(f"{d}+{q}" for d in FLOAT_DTYPES for q in QUANT_RECIPES)


def split_precision(dtype: str) -> tuple[str, str | None]:
    """"bfloat16+fp8" -> ("bfloat16", "fp8"); "bfloat16" -> ("bfloat16", None)."""
    base, _, recipe = dtype.partition("+")
    if recipe and recipe not in QUANT_RECIPES:
        raise ValueError(f"precision {dtype!r}: unknown quantization recipe {recipe!r}, one of {list(QUANT_RECIPES)}")
    return base, recipe or None


def precision(dtype: str, quant: str | None) -> str:
    return f"{dtype}+{quant}" if quant else dtype


def job_kinds() -> list[str]:
    """The kinds runner/kinds/ implements (one module each)."""
    kinds_dir = Path(__file__).parent / "kinds"
    return sorted(p.stem for p in kinds_dir.glob("*.py") if not p.stem.startswith("_"))


# A failed job's `error.kind` when what raised was not a typed runner error (runner/__main__.py):
# anything else names a refusal the runner explained, which the bot prints without the log's tail.
UNEXPLAINED_ERROR = "exception"

# What a successful result of a kind must hold, where the bot reads it. A result without these keys
# is no valid result (the job's code, or code it ran, wrote something else to the result path): the
# bot treats it as a crash, never as data (bot/jobs.run_job).
RESULT_KEYS: dict[str, tuple[str, ...]] = {
    "validate_step": ("runs", "timing", "profile", "flops", "passes", "env"),
    "compare": ("checks",),
}


def open_new(path: Path, mode: str = "wb"):
    """A new file at path, opened for writing: whatever stood there (a symlink a runner child left in
    its scratch, say) is removed, never followed (O_NOFOLLOW | O_EXCL)."""
    path = Path(path)
    if path.is_symlink() or path.exists():
        path.unlink()
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), mode)


@dataclass
class Job:
    kind: str
    workload: dict[str, Any]
    preset: str
    device: str
    dtype: str
    engine_root: str
    engine_sha: str
    model_class: str
    shapes: list[dict[str, Any]]
    seeds: list[int] = field(default_factory=lambda: [0])
    weight_seed: int = 0
    warmup: int = 2
    iters: int = 5
    out_dir: str = ""
    save_outputs: bool = True
    params: dict[str, Any] = field(default_factory=dict)  # kind-specific parameters

    def to_file(self, path: Path) -> None:
        with open_new(path, "w") as f:
            f.write(json.dumps(asdict(self), indent=2))

    @classmethod
    def from_file(cls, path: Path) -> "Job":
        data = json.loads(Path(path).read_text())
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"job {path}: unknown keys {sorted(unknown)}")
        job = cls(**data)
        if job.kind not in job_kinds():
            raise ValueError(f"job {path}: kind {job.kind!r} is not one of {job_kinds()}")
        return job


# The production modes (runner/modes.py runs them); here because the bot parses them too and
# this module imports no torch.
MODES = ("eager", "graph", "compile", "compile+graph")
RECIPES = ("regional", "whole", "max-autotune")


def parse_mode(mode: str) -> tuple[str | None, bool]:
    """(compile recipe or None for eager, captured into a CUDA graph?). Raises ValueError for an unknown mode."""
    base, graph = (mode[:-len("+graph")], True) if mode.endswith("+graph") else (mode, False)
    if base == "graph" and not graph:
        return None, True
    if base == "eager":
        return None, graph
    if base == "compile":
        return "regional", graph
    if base.startswith("compile:") and base[len("compile:"):] in RECIPES:
        return base[len("compile:"):], graph
    raise ValueError(f"unknown mode {mode!r}: eager, graph, compile[:RECIPE][+graph] with RECIPE one of {RECIPES}")
