"""Compare saved step outputs with a reference, in a clean process that ran no candidate code.

params:
  reference  path of the reference .pt (a dict name -> tensor)
  others     {label: path of a .pt to compare}
  tolerance  {"rel_l2": r, "atol": a, "rtol": t} or null for bit-exact
Result: {label: {output name: {ok, rel_l2, max_abs, max_rel, where, reason}}}
"""
from __future__ import annotations

import torch


def compare_tensors(out: torch.Tensor, ref: torch.Tensor, tol: dict | None) -> dict:
    if out.shape != ref.shape:
        return {"ok": False, "reason": f"shape {list(out.shape)} != reference {list(ref.shape)}"}
    o, r = out.double(), ref.double()
    finite = torch.isfinite(o)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[0].tolist()
        return {"ok": False, "reason": f"{int((~finite).sum())} non-finite values, first at {bad}"}
    diff = (o - r).abs()
    idx = list(divmod_index(int(diff.argmax()), list(diff.shape)))
    rel_l2 = float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-30))
    res = {"rel_l2": rel_l2, "max_abs": float(diff.max()), "where": idx,
           "max_rel": float((diff / r.abs().clamp_min(1e-6)).max())}
    if tol is None:
        res["ok"] = bool(torch.equal(out, ref))
        res["reason"] = "bit-exact" if res["ok"] else f"not bit-exact: max abs diff {res['max_abs']:.3g} at {idx}"
        return res
    within = diff <= tol["atol"] + tol["rtol"] * r.abs()
    res["ok"] = rel_l2 <= tol["rel_l2"] and bool(within.all())
    if rel_l2 > tol["rel_l2"]:
        res["reason"] = f"rel L2 error {rel_l2:.3g} > {tol['rel_l2']:.3g}"
    elif not bool(within.all()):
        n = int((~within).sum())
        res["reason"] = f"{n} elements outside atol {tol['atol']:.3g} + rtol {tol['rtol']:.3g}; max abs diff {res['max_abs']:.3g} at {idx}"
    else:
        res["reason"] = f"rel L2 {rel_l2:.3g}, max abs {res['max_abs']:.3g}"
    return res


def divmod_index(flat: int, shape: list[int]) -> list[int]:
    idx = []
    for s in reversed(shape):
        flat, i = divmod(flat, s)
        idx.append(i)
    return idx[::-1]


def run(job) -> dict:
    p = job.params
    ref = torch.load(p["reference"], map_location="cpu")
    out = {}
    for label, path in p["others"].items():
        other = torch.load(path, map_location="cpu")
        out[label] = {name: (compare_tensors(other[name], t, p.get("tolerance")) if name in other
                             else {"ok": False, "reason": "output missing"}) for name, t in ref.items()}
    return {"ok": True, "comparisons": out}
