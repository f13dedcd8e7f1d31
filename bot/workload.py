"""Workload files: what to optimize, at which shapes, with which tolerance.

A workload YAML is parsed into frozen dataclasses here, once. Every error names the file, the key
(as a dotted path), the value found and what was expected, and is raised as ConfigError so the CLI
prints it and exits 2 without a traceback.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bot.errors import ConfigError, OptbotError
from bot.paths import REPO_ROOT
from bot.tolerance import Tolerance, parse_tolerances
from runner import input_spec
from runner.input_spec import InputSpec
from runner.job import FLOAT_DTYPES, precision

PRESETS = ("full", "tiny")
DTYPES = FLOAT_DTYPES
CFG_MODES = ("none", "true-cfg")
COMBINES = ("passes", "guided")
# How the runner builds and calls an engine's model: runner/engines/<adapter>.py. "plain" is a
# diffusers-style class (cls(**config), model(**inputs)[0]); "sglang" does SGLang's own set-up.
ADAPTERS = ("plain", "sglang")


@dataclass(frozen=True)
class Shape:
    resolution: tuple[int, int]  # pixels (height, width)
    text_tokens: int
    batch: int
    frames: int = 1  # video frames (pixel space); 1 for an image model

    def image_tokens(self, downsample: int) -> int:
        return (self.resolution[0] // downsample) * (self.resolution[1] // downsample)

    def label(self) -> str:
        f = f"x{self.frames}f" if self.frames != 1 else ""
        return f"{self.resolution[0]}x{self.resolution[1]}{f}/txt{self.text_tokens}/b{self.batch}"

    def to_json(self) -> dict:
        """A job's shape (runner/job.py), as the runner reads it and echoes it in its results."""
        d = {"resolution": list(self.resolution), "text_tokens": self.text_tokens, "batch": self.batch}
        if self.frames != 1:
            d["frames"] = self.frames
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Shape":
        return cls(tuple(d["resolution"]), d["text_tokens"], d["batch"], d.get("frames", 1))


@dataclass(frozen=True)
class Preset:
    name: str
    config: dict[str, Any]
    weights: str  # "seeded" or a checkpoint path
    shapes: Shape
    extra_shapes: tuple[Shape, ...] = ()


@dataclass(frozen=True)
class EngineSpec:
    name: str
    source: str  # "pypi-sdist:PKG==VER", "pypi-wheel:PKG==VER", a git URL, or a local path
    import_root: str  # folder inside the repo that goes first on PYTHONPATH
    model_class: str  # dotted import path inside the engine
    ref: str | None = None  # None: the repo's HEAD (for sdist engines: the materialized commit)
    adapter: str = "plain"  # runner/engines/<adapter>.py: how the runner builds and calls the model


@dataclass(frozen=True)
class Step:
    cfg: str
    timestep: float  # the fraction of the schedule, in [0, 1]
    timestep_scale: float = 1.0  # forward takes timestep * timestep_scale (1000 for 0-1000 models)
    guidance: float | None = None  # what a guidance-distilled model takes as an input
    combine: str = "passes"  # passes: judge each pass's output | guided: uncond + scale * (cond - uncond)
    guidance_scale: float | None = None  # true-CFG scale, for combine: guided

    @property
    def passes(self) -> int:
        return 2 if self.cfg == "true-cfg" else 1


@dataclass(frozen=True)
class Workload:
    name: str
    file: str
    engines: dict[str, EngineSpec]
    default_engine: str
    step: Step
    latent_downsample: int
    presets: dict[str, Preset]
    dtype: dict[str, str]  # device kind -> dtype name
    bit_exact: bool
    tolerance: dict[str, Tolerance]
    inputs: InputSpec  # the forward's inputs (runner/input_spec.py; docs/workloads.md)
    # the modes production runs this model in (runner/modes.py): what the validator checks and
    # times on CUDA; key `production_modes`, default all four
    production_modes: tuple[str, ...] = ("eager", "graph", "compile", "compile+graph")

    def engine(self, name: str | None) -> EngineSpec:
        name = name or self.default_engine
        if name not in self.engines:
            raise OptbotError(
                f"{self.file}: key 'engines': no engine named {name!r}; "
                f"this workload defines {sorted(self.engines)} (or pass a git URL or path)"
            )
        return self.engines[name]

    def preset(self, name: str) -> Preset:
        if name not in self.presets:
            raise ConfigError(self.file, "presets", name, f"one of {sorted(self.presets)}")
        return self.presets[name]

    def dtype_for(self, device: str) -> str:
        kind = "cuda" if device.startswith("cuda") else "cpu"
        if kind not in self.dtype:
            raise ConfigError(self.file, "dtype", self.dtype, f"a dtype for device kind '{kind}'")
        return self.dtype[kind]

    def tolerance_for(self, precision: str, engine: str = "") -> "Tolerance | None":
        """The bound a candidate's outputs are judged by at `precision`: for a quantized precision, the
        engine's own (its FP8 baseline is its own path, with its own error) where the file gives one."""
        tol = self.tolerance.get(precision)
        return tol.engines.get(engine, tol) if tol is not None else None

    def precision_for(self, device: str, quant: str | None = None) -> str:
        """The device's dtype, with +RECIPE when the linear layers run quantized (runner/job.py); a
        quantized precision needs its own tolerance in the file (correctness.tolerance."bfloat16+fp8")."""
        base = self.dtype_for(device)
        dt = precision(base, quant)
        if quant and not self.bit_exact and dt not in self.tolerance:
            raise ConfigError(self.file, f"correctness.tolerance.{dt}", None,
                              f"a tolerance for {dt}, derived from the {quant} recipe's own error against "
                              f"{base} (optbot bench {self.name} --quant {quant} measures it), "
                              "with its evidence (docs/fp8.md)")
        return dt

    def to_json(self) -> dict:
        """What a runner job carries (runner/job.py): the inputs as declared, expressions as text."""
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "inputs":
                d[f.name] = v.to_json()
            elif isinstance(v, dict):
                d[f.name] = {k: dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x for k, x in v.items()}
            else:
                d[f.name] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
        return d


# --------------------------------------------------------------------------------------------
# lookup


def workloads_dirs() -> list[Path]:
    """Where workload names are looked up: ./workloads first, then the ones shipped with optbot."""
    dirs = [Path.cwd() / "workloads", REPO_ROOT / "workloads"]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in out:
            out.append(d.resolve())
    return out


def available_workloads() -> list[str]:
    names = set()
    for d in workloads_dirs():
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def resolve_workload_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise OptbotError(f"workload file {p} does not exist")
        return p.resolve()
    for d in workloads_dirs():
        cand = d / f"{name_or_path}.yaml"
        if cand.is_file():
            return cand
    raise OptbotError(
        f"unknown workload {name_or_path!r}; known workloads: {', '.join(available_workloads()) or 'none'} "
        f"(looked in {', '.join(str(d) for d in workloads_dirs())}), or pass a path to a .yaml file"
    )


def load_workload(name_or_path: str) -> Workload:
    return parse_workload_file(resolve_workload_path(name_or_path))


# --------------------------------------------------------------------------------------------
# parsing


class _Reader:
    """Typed access to a YAML mapping that reports file + dotted key on every mistake."""

    def __init__(self, file: Path):
        self.file = file

    def get(self, d: dict, key: str, path: str, typ, *, default=..., choices=None):
        full = f"{path}.{key}" if path else key
        if not isinstance(d, dict):
            raise ConfigError(self.file, path or "<top level>", d, "a mapping")
        if key not in d:
            if default is ...:
                raise ConfigError(self.file, full, None, f"a value ({_tname(typ)}); the key is missing")
            return default
        v = d[key]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if typ is not None and not isinstance(v, typ) or (typ in (int, float) and isinstance(v, bool)):
            raise ConfigError(self.file, full, v, _tname(typ))
        if choices is not None and v not in choices:
            raise ConfigError(self.file, full, v, f"one of {list(choices)}")
        return v

    def shape(self, d, path: str) -> Shape:
        if not isinstance(d, dict):
            raise ConfigError(self.file, path, d, "a mapping with resolution, text_tokens, batch")
        res = self.get(d, "resolution", path, list)
        if len(res) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in res):
            raise ConfigError(self.file, f"{path}.resolution", res, "[height, width], two positive integers")
        tt = self.get(d, "text_tokens", path, int)
        b = self.get(d, "batch", path, int, default=1)
        frames = self.get(d, "frames", path, int, default=1)
        for k, v in (("text_tokens", tt), ("batch", b), ("frames", frames)):
            if v < 1:
                raise ConfigError(self.file, f"{path}.{k}", v, "a positive integer")
        for k in d:
            if k not in ("resolution", "text_tokens", "batch", "frames"):
                raise ConfigError(self.file, f"{path}.{k}", d[k], "one of the keys resolution, frames, text_tokens, batch")
        return Shape((res[0], res[1]), tt, b, frames)


def _tname(typ) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "true or false"}.get(typ, str(typ))


def parse_workload_file(path: Path) -> Workload:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise OptbotError(f"cannot read workload file {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise OptbotError(f"{path}: malformed YAML{where}: {problem}") from None
    return parse_workload(data, path)


def parse_workload(data: Any, file: Path) -> Workload:
    r = _Reader(file)
    if not isinstance(data, dict):
        raise ConfigError(file, "<top level>", type(data).__name__, "a mapping of workload keys")
    name = r.get(data, "name", "", str)
    if "family" in data:
        raise ConfigError(file, "family", data["family"],
                          "no `family` key: a workload declares its model's forward inputs under `inputs:` "
                          "(docs/workloads.md; workloads/flux2.yaml is an example)")

    engines_raw = r.get(data, "engines", "", dict)
    if not engines_raw:
        raise ConfigError(file, "engines", engines_raw, "at least one engine")
    engines = {}
    for ename, e in engines_raw.items():
        p = f"engines.{ename}"
        engines[ename] = EngineSpec(
            name=str(ename),
            source=r.get(e, "source", p, str),
            import_root=r.get(e, "import_root", p, str, default="."),
            model_class=r.get(e, "model_class", p, str),
            ref=r.get(e, "ref", p, str, default=None),
            adapter=r.get(e, "adapter", p, str, default="plain"),
        )
        if engines[ename].adapter not in ADAPTERS:
            raise ConfigError(file, f"{p}.adapter", engines[ename].adapter,
                              f"one of {list(ADAPTERS)} (a module of runner/engines/)")
        if "." not in engines[ename].model_class:
            raise ConfigError(file, f"{p}.model_class", engines[ename].model_class, "a dotted path like pkg.module.Class")
    default_engine = r.get(data, "default_engine", "", str, default=next(iter(engines)))
    if default_engine not in engines:
        raise ConfigError(file, "default_engine", default_engine, f"one of {sorted(engines)}")

    s = r.get(data, "step", "", dict)
    step = Step(
        cfg=r.get(s, "cfg", "step", str, choices=CFG_MODES),
        timestep=r.get(s, "timestep", "step", float),
        timestep_scale=r.get(s, "timestep_scale", "step", float, default=1.0),
        guidance=r.get(s, "guidance", "step", float, default=None),
        combine=r.get(s, "combine", "step", str, default="passes", choices=COMBINES),
        guidance_scale=r.get(s, "guidance_scale", "step", float, default=None),
    )
    if not 0.0 <= step.timestep <= 1.0:
        raise ConfigError(file, "step.timestep", step.timestep,
                          "a number in [0, 1], the fraction of the schedule (for a model whose forward takes "
                          "0-1000, set step.timestep_scale: 1000)")
    if step.timestep_scale <= 0:
        raise ConfigError(file, "step.timestep_scale", step.timestep_scale, "a positive number")
    if step.combine == "guided" and (step.cfg != "true-cfg" or step.guidance_scale is None):
        raise ConfigError(file, "step.combine", step.combine,
                          "combine: guided only with cfg: true-cfg and a step.guidance_scale")
    for k in s:
        if k not in {f.name for f in dataclasses.fields(Step)}:
            raise ConfigError(file, f"step.{k}", s[k], f"one of the keys {sorted(f.name for f in dataclasses.fields(Step))}")

    latent_downsample = r.get(data, "latent_downsample", "", int)
    if latent_downsample < 1:
        raise ConfigError(file, "latent_downsample", latent_downsample, "a positive integer")

    presets_raw = r.get(data, "presets", "", dict)
    presets = {}
    for pname, pr in presets_raw.items():
        p = f"presets.{pname}"
        if pname not in PRESETS:
            raise ConfigError(file, p, pname, f"a preset named one of {list(PRESETS)}")
        shapes = r.shape(r.get(pr, "shapes", p, dict), f"{p}.shapes")
        extra = tuple(r.shape(x, f"{p}.extra_shapes[{i}]") for i, x in enumerate(r.get(pr, "extra_shapes", p, list, default=[])))
        for i, sh in enumerate((shapes,) + extra):
            for side in sh.resolution:
                if side % latent_downsample:
                    key = f"{p}.shapes" if i == 0 else f"{p}.extra_shapes[{i - 1}]"
                    raise ConfigError(file, f"{key}.resolution", list(sh.resolution),
                                      f"multiples of latent_downsample={latent_downsample}")
        presets[pname] = Preset(
            name=pname,
            config=dict(r.get(pr, "config", p, dict)),
            weights=r.get(pr, "weights", p, str, default="seeded"),
            shapes=shapes,
            extra_shapes=extra,
        )
    if not presets:
        raise ConfigError(file, "presets", presets_raw, f"at least one of {list(PRESETS)}")

    dtype = r.get(data, "dtype", "", dict)
    for k, v in dtype.items():
        if k not in ("cpu", "cuda"):
            raise ConfigError(file, f"dtype.{k}", k, "device kinds 'cpu' and 'cuda'")
        if v not in DTYPES:
            raise ConfigError(file, f"dtype.{k}", v, f"one of {list(DTYPES)}")

    c = r.get(data, "correctness", "", dict)
    bit_exact = r.get(c, "bit_exact", "correctness", bool, default=False)
    tolerance = parse_tolerances(r, r.get(c, "tolerance", "correctness", dict, default={}), file)
    if not bit_exact:
        for dev, dt in dtype.items():
            if dt not in tolerance:
                raise ConfigError(file, f"correctness.tolerance.{dt}", None,
                                  f"a tolerance for {dt} (used on {dev}), or bit_exact: true")

    from runner.job import MODES, parse_mode

    modes = r.get(data, "production_modes", "", list, default=list(MODES))
    for i, m in enumerate(modes):
        try:
            parse_mode(str(m))
        except ValueError as e:
            raise ConfigError(file, f"production_modes[{i}]", m, str(e).split(": ", 1)[1]) from None
    if "eager" not in modes:
        raise ConfigError(file, "production_modes", modes, "a list that includes eager (the reference mode)")

    inputs = _parse_inputs(r, data, file, step, presets)

    known = {"name", "engines", "default_engine", "step", "latent_downsample", "presets", "dtype", "correctness",
             "production_modes", "inputs", "hooks"}
    for k in data:
        if k not in known:
            raise ConfigError(file, str(k), data[k], f"one of the known keys {sorted(known)}")

    return Workload(
        name=name, file=str(file), engines=engines, default_engine=default_engine,
        step=step, latent_downsample=latent_downsample, presets=presets, dtype=dict(dtype),
        bit_exact=bit_exact, tolerance=tolerance, inputs=inputs, production_modes=tuple(str(m) for m in modes),
    )


def _parse_inputs(r: _Reader, data: dict, file: Path, step: Step, presets: dict[str, Preset]) -> InputSpec:
    """`inputs:` (and `hooks:`), checked by evaluating every expression at every preset's shapes,
    so a mistake is named here, before any runner starts."""
    raw = r.get(data, "inputs", "", dict)
    hooks = r.get(data, "hooks", "", str, default="")
    if hooks:
        hp = (Path(file).parent / hooks).resolve()
        if not hp.is_file():
            raise ConfigError(file, "hooks", hooks, f"a Python file next to the workload ({hp} does not exist)")
        hooks = str(hp)
    try:
        spec = input_spec.parse(raw, hooks)
    except input_spec.SpecError as e:
        raise ConfigError(file, e.key, e.value, e.expected) from None
    step_d = dataclasses.asdict(step)
    for pname, pr in presets.items():
        for sh in (pr.shapes,) + pr.extra_shapes:
            try:
                spec.check(sh.to_json(), pr.config, step_d)
            except input_spec.SpecError as e:
                raise ConfigError(file, e.key, e.value, f"{e.expected} [preset {pname}, shape {sh.label()}]") from None
    differ = [d for d in spec.forward if d.cfg != "same"]
    if step.cfg == "true-cfg" and not differ:
        raise ConfigError(file, "step.cfg", step.cfg,
                          "true-cfg with an input that differs in the unconditional pass: mark the prompt's inputs "
                          "`cfg: redraw` (or `cfg: zeros`) under inputs.forward; otherwise both passes are the same")
    if step.cfg != "true-cfg" and differ:
        raise ConfigError(file, f"inputs.forward.{differ[0].name}.cfg", differ[0].cfg,
                          f"cfg: same (step.cfg is {step.cfg!r}: there is no unconditional pass)")
    return spec
