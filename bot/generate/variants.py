"""Variant search: explore a Triton kernel's declared config space and keep the best config per shape.

Where the space comes from (first found):
  1. `config_space:` in a kernel_store entry's entry.yaml (names -> lists of values), or
  2. `CONFIG_SPACE = {...}` in the kernel's test module or a kernel source next to it (read with
     ast.literal_eval: the bot never imports kernel code).
The configs are the cartesian product, split round-robin over workers: one runner process per GPU
(device cuda:i), or several CPU processes. Each worker is a `variant_bench` runner job
(runner/kinds/variant_bench.py): correctness of every config against the reference, and on a GPU
the timing of the correct ones against the reference with runner/timing.time_interleaved. On CPU
there is no speed verdict ("speed needs a GPU"), so no best config is chosen.
"""
from __future__ import annotations

import ast
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from bot.errors import ConfigError, OptbotError
from bot.jobs import run_job
from runner.job import Job

MAX_CONFIGS = 256


def config_space_from_module(path: Path) -> dict[str, list] | None:
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG_SPACE" for t in node.targets):
            try:
                space = ast.literal_eval(node.value)
            except ValueError:
                raise ConfigError(path, "CONFIG_SPACE", ast.unparse(node.value)[:80], "a literal dict name -> list of values") from None
            return _check_space(space, path, "CONFIG_SPACE")
    return None


def _check_space(space, file, key: str) -> dict[str, list]:
    if not isinstance(space, dict) or not space or not all(isinstance(v, list) and v for v in space.values()):
        raise ConfigError(file, key, space, "a mapping name -> non-empty list of values")
    return space


def find_config_space(entry_dir: Path | None = None, test_module: Path | None = None) -> tuple[dict[str, list], str]:
    """(space, where it was declared)."""
    if entry_dir is not None:
        f = Path(entry_dir) / "entry.yaml"
        if f.is_file():
            data = yaml.safe_load(f.read_text()) or {}
            if data.get("config_space"):
                return _check_space(data["config_space"], f, "config_space"), str(f)
    candidates = []
    if test_module is not None:
        candidates.append(Path(test_module))
        candidates += sorted(p for p in Path(test_module).parent.glob("*.py") if p != Path(test_module))
    elif entry_dir is not None:
        candidates += sorted(Path(entry_dir).glob("*.py"))
    for p in candidates:
        space = config_space_from_module(p)
        if space:
            return space, str(p)
    where = entry_dir or test_module
    raise OptbotError(f"{where}: no config space declared (config_space: in entry.yaml, or CONFIG_SPACE in the kernel module)")


def expand(space: dict[str, list], limit: int = MAX_CONFIGS) -> list[dict]:
    keys = sorted(space)
    configs = [dict(zip(keys, vals)) for vals in itertools.product(*(space[k] for k in keys))]
    if len(configs) > limit:
        raise OptbotError(f"config space has {len(configs)} configs, over the limit of {limit}; narrow it")
    return configs


def find_test_module(entry_dir: Path) -> Path:
    tests = sorted(Path(entry_dir).glob("test_*.py"))
    if not tests:
        raise OptbotError(f"{entry_dir}: no test_<op>.py (the kernel test contract) to run variants against")
    return tests[0]


@dataclass
class VariantResult:
    test_module: str
    space: dict
    space_from: str
    device: str
    workers: int
    rows: list[dict] = field(default_factory=list)  # one per config: correct, max_abs_err, reason
    timings: dict = field(default_factory=dict)  # shape -> label -> TimingStats json (GPU only)
    best: dict = field(default_factory=dict)  # shape -> {label, config, median_ms, reference_ms, speedup}
    note: str = ""
    failures: list[str] = field(default_factory=list)  # workers that crashed / timed out

    def to_json(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        lines = [f"variant search over {len(self.rows)} configs from {self.space_from} on {self.device} "
                 f"({self.workers} worker{'s' if self.workers != 1 else ''})"]
        for r in self.rows:
            lines.append(f"  {'ok ' if r['correct'] else 'BAD'} {r['label']:<40} max abs err {r['max_abs_err']:.3g}"
                         + ("" if r["correct"] else f"  {r['reason']}"))
        for shape, b in self.best.items():
            lines.append(f"  best at {shape}: {b['label']} {b['median_ms']:.4f} ms (reference {b['reference_ms']:.4f} ms, "
                         f"x{b['speedup']:.2f}, cuda)")
        if self.note:
            lines.append("  " + self.note)
        for f in self.failures:
            lines.append("  worker failed: " + f)
        return "\n".join(lines)


def search(test_module: Path, space: dict[str, list], *, device: str, run_dir: Path, gpus: int = 1, workers: int = 2,
           dtype: str = "float32", seeds: tuple[int, ...] = (0, 1), shapes: list | None = None,
           space_from: str = "", timeout_s: float = 600.0) -> VariantResult:
    """Check every config (and time them on a GPU) in parallel runner processes; keep the best per shape."""
    configs = expand(space)
    on_cuda = device.startswith("cuda")
    n = max(1, min(gpus if on_cuda else workers, len(configs)))
    slices = [configs[i::n] for i in range(n)]
    devices = [f"cuda:{i}" for i in range(n)] if on_cuda else ["cpu"] * n
    root = str(Path(test_module).resolve().parent)

    def one(i: int):
        job = Job(kind="variant_bench", workload={}, preset="", device=devices[i], dtype=dtype, engine_root=root,
                  engine_sha="", model_class="", shapes=[], seeds=list(seeds), warmup=3, iters=20,
                  out_dir=str(run_dir / f"worker{i}"), save_outputs=False,
                  params={"test_module": str(Path(test_module).resolve()), "configs": slices[i], "shapes": shapes})
        return run_job(job, run_dir / f"worker{i}", timeout_s=timeout_s, name="variant_bench")

    with ThreadPoolExecutor(max_workers=n) as ex:
        outs = list(ex.map(one, range(n)))
    res = VariantResult(str(test_module), space, space_from, "cuda" if on_cuda else "cpu", n)
    for i, out in enumerate(outs):
        if not out.ok:
            res.failures.append(f"worker {i} ({devices[i]}): {out.reason()}")
            for cfg in slices[i]:
                res.rows.append({"config": cfg, "label": _label(cfg), "correct": False, "max_abs_err": float("nan"),
                                 "reason": f"worker {out.status}: {out.reason()}"})
            continue
        res.rows += out.result["rows"]
        res.note = res.note or out.result.get("note", "")
        for shape, t in out.result.get("timings", {}).items():
            res.timings.setdefault(shape, {}).update(t)
    res.rows.sort(key=lambda r: r["label"])
    # Best per shape: the fastest correct config by median. With several GPUs each worker times its
    # slice beside its own reference run; the GPUs of one host are the same model, and the reference
    # kept is one worker's, so a speedup across workers carries that GPU-to-GPU spread.
    for shape, t in res.timings.items():
        stats = {k: v for k, v in t.items() if isinstance(v, dict) and k != "reference"}
        if not stats or not isinstance(t.get("reference"), dict):
            continue
        label = min(stats, key=lambda k: stats[k]["median_ms"])
        ref = t["reference"]["median_ms"]
        cfg = next(r["config"] for r in res.rows if r["label"] == label)
        res.best[shape] = {"label": label, "config": cfg, "median_ms": stats[label]["median_ms"], "reference_ms": ref,
                           "speedup": ref / stats[label]["median_ms"] if stats[label]["median_ms"] > 0 else 0.0}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "variants.json").write_text(json.dumps(res.to_json(), indent=2, default=str))
    return res


def _label(cfg: dict) -> str:
    return ",".join(f"{k}={cfg[k]}" for k in sorted(cfg))


def search_entry(entry_dir: Path, *, device: str, run_dir: Path, gpus: int = 1, workers: int = 2) -> VariantResult:
    """Variant search for a kernel_store entry: its declared space, its test module."""
    test = find_test_module(entry_dir)
    space, where = find_config_space(entry_dir, test)
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return search(test, space, device=device, run_dir=run_dir, gpus=gpus, workers=workers, dtype=dtype, space_from=where)
