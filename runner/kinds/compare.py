"""Compare saved outputs of the base and the candidate, in a clean process of its own.

Neither side's engine is imported here: this process loads the two .pt files and does arithmetic
(in float64). The bot never imports torch; this is where the numbers come from.

job.params:
  pairs      [{"label": "256x256/txt32/b1 seed 123", "base": PATH, "candidate": PATH}, ...]; a pair may
             carry its own "tolerance" (outputs of two different modes: bot/tolerance.py across_modes)
  tolerance  {"rel_l2": x, "atol": y, "rtol": z}, or null when bit_exact (null and not bit_exact:
             the differences are measured, ok is null)
  bit_exact  bool
A pair with a "reference" (the unquantized model's output for the same inputs; a quantized precision)
and "no_farther" (a factor) asks another question: is the candidate no farther from the reference than
the base is, within that factor (`farther`)?
Result: {"ok": true, "checks": [{label, output, ok, reason, max_abs, at, rel_l2, violations, ...}]}.
An output passes when it has the same shape, is finite everywhere (NaN/Inf fail), and
  bit_exact: every element equal; else: ||c - b|| / ||b|| <= rel_l2 AND |c - b| <= atol + rtol*|b|
  for every element.
"""
from __future__ import annotations

import torch


def _at(flat_index: int, shape) -> list[int]:
    return [int(i) for i in torch.unravel_index(torch.tensor(flat_index), tuple(shape))]


def check(name: str, base: torch.Tensor, cand: torch.Tensor, tol: dict | None, bit_exact: bool) -> dict:
    r: dict = {"output": name, "shape": list(base.shape), "dtype": str(base.dtype).replace("torch.", "")}
    if not isinstance(cand, torch.Tensor):
        return {**r, "ok": False, "reason": f"{name}: candidate output is {type(cand).__name__}, not a tensor"}
    if cand.shape != base.shape:
        return {**r, "ok": False, "reason": f"{name}: shape {list(cand.shape)} != base {list(base.shape)}"}
    b, c = base.double().flatten(), cand.double().flatten()
    nonfinite = ~torch.isfinite(c)
    r["nonfinite"] = int(nonfinite.sum())
    diff = (c - b).abs()
    if r["nonfinite"]:
        i = int(nonfinite.nonzero()[0])
        r.update(ok=False, at=_at(i, base.shape), candidate_value=float(c[i]), base_value=float(b[i]),
                 reason=f"{name}: {r['nonfinite']} of {c.numel()} elements are NaN/Inf (first at "
                        f"{_at(i, base.shape)}: {float(c[i])})")
        return r
    if not bool(torch.isfinite(b).all()):
        return {**r, "ok": False, "reason": f"{name}: the BASE output is not finite; nothing to compare against"}
    i = int(diff.argmax())
    bn = float(b.norm())
    r.update(max_abs=float(diff[i]), at=_at(i, base.shape), base_value=float(b[i]), candidate_value=float(c[i]),
             rel_l2=float((c - b).norm()) / bn if bn > 0 else float((c - b).norm()),
             numel=c.numel())
    if bit_exact:
        bad = int((diff != 0).sum())
        r.update(violations=bad, ok=bad == 0,
                 reason=(f"{name}: bit-exact" if bad == 0 else
                         f"{name}: {bad} elements differ (bit-exact required); max abs {r['max_abs']:.3g} at {r['at']}"))
        return r
    if tol is None:  # measured only (bench's rows at a precision the workload sets no tolerance for)
        r.update(ok=None, reason=f"{name}: rel L2 {r['rel_l2']:.3g}, max abs {r['max_abs']:.3g} (no tolerance: not judged)")
        return r
    bound = tol["atol"] + tol["rtol"] * b.abs()
    excess = diff - bound
    bad = excess > 0
    r["violations"] = int(bad.sum())
    j = int(excess.argmax())
    r.update(worst_excess_at=_at(j, base.shape), worst_excess=float(excess[j]),
             worst_ratio=float(diff[j] / bound[j]) if float(bound[j]) > 0 else float("inf"))
    fails = []
    if r["rel_l2"] > tol["rel_l2"]:
        fails.append(f"rel L2 {r['rel_l2']:.3g} > {tol['rel_l2']:.3g}")
    if r["violations"]:
        fails.append(f"{r['violations']} of {r['numel']} elements exceed atol {tol['atol']:.3g} + rtol "
                     f"{tol['rtol']:.3g}*|ref| (worst at {r['worst_excess_at']}: |{float(c[j]):.6g} - "
                     f"{float(b[j]):.6g}| = {float(diff[j]):.3g})")
    r["ok"] = not fails
    r["reason"] = (f"{name}: max abs {r['max_abs']:.3g} at {r['at']}, rel L2 {r['rel_l2']:.3g}"
                   + ("" if not fails else "; FAIL: " + "; ".join(fails)))
    return r


def farther(name: str, ref: torch.Tensor, base: torch.Tensor, cand: torch.Tensor, factor: float) -> dict:
    """Quantized precisions: the candidate's distance from the unquantized model (rel L2) may be at most
    `factor` times the quantized base's own. Two outputs that are each correct for the recipe may be far
    apart (FP8 turns bf16-level differences into different e4m3 codes), so the distance from the
    base alone cannot tell a rewrite from a candidate that adds error of its own; this can."""
    r: dict = {"output": name, "shape": list(ref.shape), "dtype": str(ref.dtype).replace("torch.", "")}
    if not isinstance(cand, torch.Tensor) or cand.shape != ref.shape or base.shape != ref.shape:
        return {**r, "ok": False, "reason": f"{name}: shapes differ from the unquantized model's {list(ref.shape)}"}
    f, b, c = ref.double().flatten(), base.double().flatten(), cand.double().flatten()
    if not (bool(torch.isfinite(c).all()) and bool(torch.isfinite(f).all()) and bool(torch.isfinite(b).all())):
        return {**r, "ok": False, "reason": f"{name}: an output is not finite; nothing to measure against"}
    fn = float(f.norm()) or 1.0
    dc, db = float((c - f).norm()) / fn, float((b - f).norm()) / fn
    diff = (c - f).abs()
    i = int(diff.argmax())
    ok = dc <= db * factor + 1e-12
    r.update(ok=ok, rel_l2=dc, base_rel_l2=db, max_abs=float(diff[i]), at=_at(i, ref.shape), numel=c.numel(),
             violations=0 if ok else 1,
             reason=f"{name}: rel L2 from the unquantized model {dc:.4g}, the quantized base's {db:.4g}"
                    + ("" if ok else f"; FAIL: more than {factor:g}x the base's (the candidate adds error of its own)"))
    return r


def run(job) -> dict:
    p = job.params
    checks = []
    for pair in p["pairs"]:
        base = torch.load(pair["base"], map_location="cpu", weights_only=True)
        cand = torch.load(pair["candidate"], map_location="cpu", weights_only=True)
        ref = torch.load(pair["reference"], map_location="cpu", weights_only=True) if "reference" in pair else None
        for name in base:
            if name not in cand:
                checks.append({"label": pair["label"], "output": name, "ok": False,
                               "reason": f"{name}: missing from the candidate's outputs"})
                continue
            if ref is not None and name not in ref:
                checks.append({"label": pair["label"], "against": "unquantized", "output": name, "ok": False,
                               "reason": f"{name}: missing from the unquantized model's outputs"})
                continue
            if ref is not None:
                checks.append({"label": pair["label"], "against": "unquantized",
                               **farther(name, ref[name], base[name], cand[name], float(pair["no_farther"]))})
                continue
            tol = pair["tolerance"] if "tolerance" in pair else p.get("tolerance")  # a pair's own bound (two modes)
            checks.append({"label": pair["label"], **check(name, base[name], cand[name], tol,
                                                            bool(p.get("bit_exact")))})
    return {"ok": True, "checks": checks}
