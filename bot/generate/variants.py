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

The generator (search_entry with a checkout): the config with the smallest total time over the timed
shapes becomes a candidate commit = the entry's patch replayed (replay.apply_entry) with that config
written as the defaults of the kernel-source function that takes the config keys (the engine calls
the wrapper with its defaults), so the diff against the entry is one signature line and a comment.
"""
from __future__ import annotations

import ast
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from bot.engine import EngineCheckout
from bot.errors import ConfigError, OptbotError
from bot.generate.candidate import Candidate, commit_message, make_trailers
from bot.generate.commits import commit_all
from bot.generate.replay import ReplayResult, apply_entry, aside_note, under_compile
from bot.hardware import hardware_name
from bot.jobs import run_job
from bot.knowledge.store import Entry, added_file_content, load_entry, patch_added_files
from runner.job import Job

MAX_CONFIGS = 256
# A tuned config becomes a candidate only when it beats the entry's own config by more than this
# (sum of median times over the shapes): a smaller gain is inside the run-to-run spread of the
# microbenchmark (1.5% between two searches of the same space on the H200, 2026-11-30) and cannot
# pay for an end-to-end validation (about 150 GPU-s on Qwen-Image full).
MIN_TUNE_GAIN_PCT = 3.0


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
    device_name: str = ""  # the GPU model that timed (from the workers' environment)
    chosen: dict = field(default_factory=dict)  # the one config a commit carries (choose_config), {} when none
    commit_note: str = ""  # what became of the chosen config (committed as <sha>, unchanged, why none)
    candidate: Candidate | None = None  # the variant-search commit
    kept: str = ""  # the entry's own config, when the search found nothing worth a candidate (a finished search)

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
        if self.chosen:
            lines.append(f"  chosen: {self.chosen['label']} ({self.chosen['by']}: {self.chosen['total_ms']:.4f} ms)")
        if self.commit_note:
            lines.append("  " + self.commit_note)
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
        res.device_name = res.device_name or (out.result.get("env") or {}).get("device_name", "")
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
    _save(res, run_dir)
    return res


def _save(res: VariantResult, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "variants.json").write_text(json.dumps(res.to_json(), indent=2, default=str))


def _label(cfg: dict) -> str:
    return ",".join(f"{k}={cfg[k]}" for k in sorted(cfg))


def search_entry(entry_dir: Path, *, device: str, run_dir: Path, gpus: int = 1, workers: int = 2,
                 dtype: str | None = None, space: dict[str, list] | None = None, checkout: EngineCheckout | None = None,
                 opportunity_id: str = "", choose: Callable[[VariantResult], dict | None] | None = None,
                 aside: tuple[str, str] | None = None) -> VariantResult:
    """Variant search for a kernel_store entry: its declared space (or `space`), its test module.
    With a checkout, the chosen config becomes a candidate commit (res.candidate); res.commit_note
    says what happened. `choose` defaults to choose_config (timings; nothing on CPU); tests inject a
    choice there because a CPU run has no speed to choose by. `aside`: the replay's choice under
    torch.compile for this run (ReplayResult.under_compile, _why), kept by the commit; None decides
    from the entry alone (replay.under_compile without the analysis's places: `store tune`)."""
    test = find_test_module(entry_dir)
    where = "the space passed in"
    if space is None:
        space, where = find_config_space(entry_dir, test)
    dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    res = search(test, space, device=device, run_dir=run_dir, gpus=gpus, workers=workers, dtype=dtype, space_from=where)
    if checkout is None:
        return res
    res.chosen = (choose or choose_config)(res) or {}
    if not res.chosen:
        res.commit_note = ("no config chosen, no commit: speed needs a GPU (configs were only checked for correctness)"
                           if res.device != "cuda" else
                           "no config chosen, no commit: no correct config was timed on every shape")
    else:
        r = commit_config(checkout, load_entry(Path(entry_dir)), res, opportunity_id, aside=aside)
        res.commit_note, res.candidate = r.reason, r.candidate
    _save(res, run_dir)
    return res


# --------------------------------------------------------------------------------------------------
# the chosen config -> a candidate commit


def choose_config(res: VariantResult) -> dict | None:
    """The one config a commit carries (the engine has one default, not one per shape): correct,
    timed on every shape, smallest sum of median times, so the large shapes where the step spends
    its time weigh most. None without GPU timings: a CPU run has no speed verdict."""
    if res.device != "cuda" or not res.timings:
        return None
    correct = {r["label"]: r["config"] for r in res.rows if r["correct"]}
    shapes = list(res.timings)
    totals = {lb: t for lb in correct if (t := _total_ms(res, lb)) is not None}
    if not totals:
        return None
    label = min(totals, key=totals.get)
    return {"label": label, "config": correct[label], "total_ms": totals[label],
            "by": f"smallest sum of median times over {len(shapes)} shape{'s' if len(shapes) != 1 else ''}",
            "per_shape_ms": {s: res.timings[s][label]["median_ms"] for s in shapes},
            "reference_ms": {s: res.timings[s]["reference"]["median_ms"] for s in shapes
                             if isinstance(res.timings[s].get("reference"), dict)}}


@dataclass
class ConfigSite:
    """Where a config lives in a kernel source: the defaults of the function's config parameters."""
    function: str
    lineno: int  # first line of the def (its first decorator, if any): the comment goes above it
    indent: str
    spans: dict[str, tuple[int, int, int, int]]  # key -> (line, col, end line, end col) of its default (ast: utf-8 cols)
    defaults: dict[str, str]  # key -> the default's source text


def config_site(source: str, keys: list[str] | set[str], where: str = "kernel source") -> ConfigSite:
    """The function whose parameters include every config key, each with a default: the same
    function the variant_bench worker drives (a public one is preferred when several qualify)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        pos = a.posonlyargs + a.args
        defaults = dict(zip([x.arg for x in pos[len(pos) - len(a.defaults):]], a.defaults))
        defaults.update({x.arg: d for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
        if set(keys) <= set(defaults):
            found.append((node, {k: defaults[k] for k in keys}))
    if len(found) > 1:
        found = [f for f in found if not f[0].name.startswith("_")]
    if len(found) != 1:
        raise OptbotError(f"{where}: {len(found) or 'no'} functions have every config key {sorted(keys)} as a "
                          f"defaulted parameter; the config needs exactly one place to go")
    node, defaults = found[0]
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    line = source.splitlines()[first - 1]
    return ConfigSite(node.name, first, line[:len(line) - len(line.lstrip())],
                      {k: (d.lineno, d.col_offset, d.end_lineno, d.end_col_offset) for k, d in defaults.items()},
                      {k: ast.get_source_segment(source, d) for k, d in defaults.items()})


def write_config(source: str, site: ConfigSite, config: dict, comment: str = "") -> str:
    """source with the site's defaults replaced by the config's values (and a comment above the
    def): nothing else in the file changes, so the diff reads as the config and only the config."""
    lines = source.splitlines(keepends=True)

    def offset(line: int, col: int) -> int:  # ast columns count utf-8 bytes
        return sum(len(x) for x in lines[:line - 1]) + len(lines[line - 1].encode()[:col].decode())

    out = source
    for key in sorted(site.spans, key=lambda k: site.spans[k], reverse=True):  # from the end: offsets stay valid
        l0, c0, l1, c1 = site.spans[key]
        out = out[:offset(l0, c0)] + repr(config[key]) + out[offset(l1, c1):]
    if comment:
        new = out.splitlines(keepends=True)
        new.insert(site.lineno - 1, f"{site.indent}# {comment}\n")
        out = "".join(new)
    return out


def _config_text(config: dict) -> str:
    return ", ".join(f"{k}={config[k]!r}" for k in sorted(config))


def commit_config(checkout: EngineCheckout, entry: Entry, res: VariantResult, opportunity_id: str = "",
                  name: str | None = None, aside: tuple[str, str] | None = None) -> ReplayResult:
    """The entry's patch replayed in its own worktree plus res.chosen written into the engine's copy
    of the kernel source, as one commit with the Optbot-* trailers (generator variant-search).
    Nothing is committed ("unchanged", res.kept = the entry's own config) when the entry's own
    config is the chosen one or within MIN_TUNE_GAIN_PCT of it."""
    config = res.chosen["config"]
    keys = sorted(config)
    sites = []
    for k in entry.kernel_files():
        try:
            sites.append((k, config_site(k.read_text(), keys, str(k))))
        except OptbotError:
            continue
    if len(sites) != 1:
        return ReplayResult(entry.id, opportunity_id, "error",
                            f"variant search {entry.id}: {len(sites) or 'no'} kernel sources have the config "
                            f"keys {keys} as defaulted parameters; nothing committed")
    kfile, site = sites[0]
    own = _label({k: _literal(site.defaults[k]) for k in keys})
    if all(site.defaults[k] == repr(config[k]) for k in keys):
        res.kept = own
        return ReplayResult(entry.id, opportunity_id, "unchanged",
                            f"the entry's own defaults ({_config_text(config)}) are the fastest config; nothing to commit")
    own_ms = _total_ms(res, own)
    if own_ms is not None and res.chosen["total_ms"] > own_ms * (1 - MIN_TUNE_GAIN_PCT / 100):
        res.kept = own
        return ReplayResult(entry.id, opportunity_id, "unchanged",
                            f"the entry's own config ({own}, {own_ms:.4f} ms) is within {MIN_TUNE_GAIN_PCT:g}% of the "
                            f"fastest ({res.chosen['label']}, {res.chosen['total_ms']:.4f} ms); nothing to commit")
    patch = entry.patch_path.read_text()
    targets = [p for p in patch_added_files(patch) if added_file_content(patch, p) == kfile.read_text()] \
        or [p for p in patch_added_files(patch) if Path(p).name == kfile.name]
    if len(targets) != 1:
        return ReplayResult(entry.id, opportunity_id, "error",
                            f"variant search {entry.id}: the patch adds {len(targets) or 'no'} copies of {kfile.name}")
    # the tuned config keeps the replay's choice under torch.compile (replay.under_compile)
    r = apply_entry(checkout, entry, opportunity_id, name=name or f"variant-{entry.id}",
                    aside=aside or under_compile(entry, hardware_name(res.device, res.device_name)))
    if r.candidate is None:
        return r
    wt = Path(r.worktree)
    engine_file = wt / targets[0]
    text = engine_file.read_text()
    site = config_site(text, keys, str(engine_file))  # the engine's copy: apply --3way may have moved lines
    device = res.device_name or res.device
    engine_file.write_text(write_config(text, site, config, comment=(
        f"{', '.join(keys)}: chosen by optbot variant search on {device} (kernel_store/{entry.id} config_space)")))
    was = ", ".join(f"{k}={site.defaults[k]}" for k in keys)
    body = [f"kernel_store/{entry.id} replayed with the launch config that variant search found fastest on {device}:",
            f"  {site.function}({_config_text(config)}) in {targets[0]} (the entry's defaults: {was})", "",
            f"Variant search: {len(res.rows)} config{'s' if len(res.rows) != 1 else ''} from {res.space_from}, "
            f"{sum(r['correct'] for r in res.rows)} correct, timed on {res.device} ({device}), {res.workers} "
            f"worker{'s' if res.workers != 1 else ''}; chosen by {res.chosen['by']}:"]
    for shape, ms in res.chosen.get("per_shape_ms", {}).items():
        own_t = (res.timings.get(shape) or {}).get(own)
        ref = res.chosen.get("reference_ms", {}).get(shape)
        body.append(f"  shape {shape}: {ms:.4f} ms"
                    + (f", entry's config {own_t['median_ms']:.4f} ms" if isinstance(own_t, dict) else "")
                    + (f", torch reference {ref:.4f} ms" if ref is not None else ""))
    body += ["", f"Config: {_config_text(config)}", "", entry.description]
    if r.under_compile == "reference":  # the replay's note, which this amended message replaces
        body += ["", aside_note(r.under_compile_why)]
    trailers = {**make_trailers(opportunity_id, entry.pattern, list(entry.adds_kernels), list(entry.removes_kernels),
                                entry.id, generator="variant-search"),
                "Optbot-Config": _label(config)}
    title = f"{entry.title} ({_label(config)})"
    sha, err = commit_all(wt, commit_message(f"optbot: {title}", "\n".join(body), trailers), amend=True)
    if not sha:
        return ReplayResult(entry.id, opportunity_id, "error", err, worktree=str(wt))
    r.reason = f"{_label(config)} committed at {r.candidate.base_sha[:12]} as {sha[:12]}"
    r.candidate = Candidate(
        id=f"variant-{entry.id}", opportunity_id=opportunity_id, kind=entry.pattern, generator="variant-search",
        worktree=str(wt), commit_sha=sha, base_sha=r.candidate.base_sha, entry_id=entry.id,
        adds_kernels=list(entry.adds_kernels), removes_kernels=list(entry.removes_kernels), trailers=trailers, title=title)
    return r


def _total_ms(res: VariantResult, label: str) -> float | None:
    """A config's sum of median times over every timed shape (choose_config's measure), None when it
    was not timed on all of them."""
    if not res.timings:
        return None
    got = [(res.timings[s] or {}).get(label) for s in res.timings]
    return sum(t["median_ms"] for t in got) if all(isinstance(t, dict) for t in got) else None


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except ValueError:
        return text
