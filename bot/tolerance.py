"""Output tolerances (a workload file's `correctness.tolerance`): how far a candidate's outputs may be
from the base's at each precision, and for a quantized precision how that bound follows from the
recipe's own error (its evidence), per engine where an engine's quantized baseline is its own path, and
the bound for two outputs made in different modes (`across_modes`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bot.errors import ConfigError
from runner.job import FLOAT_DTYPES, PRECISIONS, QUANT_RECIPES, split_precision


# A quantized precision's second condition (docs/fp8.md, "The gate"): each output of the candidate may be
# at most this factor farther from the unquantized model than the quantized base's. Within it: every
# rewrite measured so far, which land at 0.96-1.002x (Qwen-Image's seven-entry FP8 stack 0.0951 against
# the base's 0.0950, inductor's compile of the same model 0.0915; benchmarks/results/h100-qwen-fp8-20261206/).
NO_FARTHER = 1.05
NO_FARTHER_WORDS = "no farther from the unquantized model"  # in a verdict's rule: judged by it


@dataclass(frozen=True)
class Tolerance:
    rel_l2: float
    atol: float
    rtol: float
    # for a quantized precision ("bfloat16+fp8"): how the bound was derived from the recipe's own
    # error against the unquantized model (a measurement, with its command), never a number picked to pass
    evidence: str = ""
    # an engine whose FP8 baseline is its own path (SGLang's ModelOpt FP8), with its own error: the
    # bound derived from that error (`engines: {sglang: {...}}` under the precision; bot/workload.py Workload.tolerance_for)
    engines: dict[str, "Tolerance"] = field(default_factory=dict)
    # for a pair whose two sides ran in different modes (a candidate's compiled step against the
    # base's eager one where the base cannot compile; bench's compiled rows against the eager
    # reference): at least the distance inductor's compile of the same model lands from its eager step
    # (the trusted rewrite), measured; None: the same bound as within a mode
    across_modes: "Tolerance | None" = None

    def bound(self, across_modes: bool = False) -> dict[str, float]:
        """The numbers a comparison applies (runner/kinds/compare.py's `tolerance`); `across_modes`: for
        outputs made in two different modes."""
        t = self.across_modes if across_modes and self.across_modes else self
        return {"rel_l2": t.rel_l2, "atol": t.atol, "rtol": t.rtol}

    def rule(self, precision: str) -> str:
        """The rule as a verdict and a report state it: the bound within a mode, and the one across modes
        where there is one."""
        text = f"rel_l2 <= {self.rel_l2:g} and |d| <= {self.atol:g} + {self.rtol:g}*|ref| ({precision})"
        if self.across_modes:
            a = self.across_modes
            text += (f"; a compiled output against the base's uncompiled one: rel_l2 <= {a.rel_l2:g} and "
                     f"|d| <= {a.atol:g} + {a.rtol:g}*|ref|")
        if split_precision(precision)[1]:
            text += f"; and {NO_FARTHER_WORDS} than {NO_FARTHER:g}x the quantized base"
        return text


def parse_tolerances(r, raw: dict, file: Path) -> dict[str, Tolerance]:
    """{precision: Tolerance} from `correctness.tolerance` (r: the workload reader, whose errors name
    the file and the dotted key)."""
    tolerance = {}
    for dt, t in raw.items():
        p = f"correctness.tolerance.{dt}"
        if dt not in PRECISIONS:
            raise ConfigError(file, p, dt, f"a dtype, one of {list(FLOAT_DTYPES)}, optionally with +RECIPE for a "
                                           f"quantized precision ({', '.join(QUANT_RECIPES)}), e.g. bfloat16+fp8")
        base, recipe = split_precision(dt)
        evidence = r.get(t, "evidence", p, str, default="") if recipe else ""
        if recipe and not evidence.strip():
            raise ConfigError(file, f"{p}.evidence", None, "how this bound follows from the recipe's own error against "
                                                           f"{base} (measure it: optbot bench WL --quant {recipe}), "
                                                           "with the command and the device")
        by_engine = {}
        for eng, et in r.get(t, "engines", p, dict, default={}).items() if recipe else ():
            ep = f"{p}.engines.{eng}"
            if not isinstance(et, dict):
                raise ConfigError(file, ep, et, "a mapping {rel_l2, atol, rtol, evidence}")
            ev = r.get(et, "evidence", ep, str, default="")
            if not ev.strip():
                raise ConfigError(file, f"{ep}.evidence", None, f"how this bound follows from {eng}'s own {recipe} "
                                                                f"path's error against {base}, with the command and the device")
            by_engine[str(eng)] = _tolerance(r, et, ep, file, ev)
        tolerance[dt] = _tolerance(r, t, p, file, evidence, by_engine)
    return tolerance


def _tolerance(r, t: dict, p: str, file: Path, evidence: str, engines: dict | None = None) -> Tolerance:
    across = r.get(t, "across_modes", p, dict, default=None)
    if across is not None:
        ap = f"{p}.across_modes"
        ev = r.get(across, "evidence", ap, str, default="")
        if not ev.strip():
            raise ConfigError(file, f"{ap}.evidence", None, "the measured distance of the trusted rewrite (inductor's "
                                                            "compile of the same model from its eager step) this bound "
                                                            "covers, with the command and the device")
        if "across_modes" in across:
            raise ConfigError(file, f"{ap}.across_modes", across["across_modes"], "no key here: one bound across modes")
        across = _tolerance(r, across, ap, file, ev)
    tol = Tolerance(*(r.get(t, k, p, float) for k in ("rel_l2", "atol", "rtol")), evidence=evidence,
                    engines=engines or {}, across_modes=across)
    for k in ("rel_l2", "atol", "rtol"):
        if getattr(tol, k) < 0:
            raise ConfigError(file, f"{p}.{k}", getattr(tol, k), "a non-negative number")
    if across is not None and across.rel_l2 < tol.rel_l2:
        raise ConfigError(file, f"{p}.across_modes.rel_l2", across.rel_l2, f"at least the bound within a mode "
                                                                          f"({tol.rel_l2:g}): outputs of two modes "
                                                                          "differ by more, never less")
    return tol
