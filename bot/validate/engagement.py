"""Engagement, check 5 of docs/validate.md: does the change run in the step?

Declared added kernels (Optbot-Adds-Kernels) must appear in the candidate's profiled step and
declared removed ones (Optbot-Removes-Kernels) must be gone; with no declaration, the candidate's
histogram of (kernel/op, module, calls) must differ from the base's, or the candidate must run a
production mode that fails for the base (a fix that acts only there: SGLang's FP8 quantization
kernel that inductor could not build leaves the eager histogram as it was).
"""
from __future__ import annotations

import fnmatch

from bot.validate.resolve import Revision
from bot.validate.speed import mode_failures
from bot.validate.verdict import Engagement


def declared_matches(item: str, entry: tuple[str, str, str]) -> bool:
    """Does a declared kernel (trailer value) match a histogram entry (kernel name, aten op, module)?
    A substring of the kernel name (GPU kernel names are long: "triton_red_fused_rms_norm_..."),
    the aten op exactly ("aten::addmm"), or the module path exactly or as a dotted suffix
    ("attn.to_qkv" matches transformer_blocks.*.attn.to_qkv, not ...attn.to_qkv_mlp_proj).
    ``KERNEL@GLOB`` scopes a declaration to modules whose path matches the fnmatch GLOB
    ("aten::silu@*gate_fn": the SiLU inside SwiGLU is gone, the one in the modulation MLP stays)."""
    name, op, module = entry
    if "@" in item:
        what, _, glob = item.partition("@")
        return (what in name or what == op) and fnmatch.fnmatchcase(module, glob)
    return item in name or item == op or module == item or module.endswith("." + item)


def enabled_modes(base: dict, cand: dict) -> list[str]:
    """The modes the candidate's first process ran and the base's failed (validate_step results):
    speed.mode_failures with the sides swapped."""
    return [m for m, _ in mode_failures(cand, base)]


def _rounded(categories: dict | None) -> dict[str, float]:
    return {k: round(float(v), 4) for k, v in (categories or {}).items()}


def check_engagement(rev: Revision, base_prof: dict | None, cand_prof: dict | None,
                     enabled: list[str] | None = None) -> Engagement:
    """The revision's declarations (trailers) against both sides' profiled op histograms; `enabled`:
    the modes only the candidate runs (enabled_modes)."""
    adds = rev.trailers.get("Optbot-Adds-Kernels", [])
    removes = rev.trailers.get("Optbot-Removes-Kernels", [])
    if not base_prof or not cand_prof:
        return Engagement(ok=False, reason="no profile of the step was taken", declared_adds=adds, declared_removes=removes)
    hb = {tuple(r[:3]): r[3] for r in base_prof["histogram"]}
    hc = {tuple(r[:3]): r[3] for r in cand_prof["histogram"]}
    changed, modules = [], set()
    for k in sorted(set(hb) | set(hc)):
        if hb.get(k, 0) != hc.get(k, 0):
            changed.append(f"{k[0]} @ {k[2] or '(top)'}: {hb.get(k, 0)} -> {hc.get(k, 0)}")
            modules.add(k[2])
    missing = [a for a in adds if not any(declared_matches(a, k) for k in hc)]
    present = [r for r in removes if any(declared_matches(r, k) for k in hc)]
    e = Engagement(ok=True, reason="", declared_adds=adds, declared_removes=removes, missing=missing,
                   still_present=present, changed_ops=changed[:20],
                   base_categories=_rounded(base_prof.get("categories")), candidate_categories=_rounded(cand_prof.get("categories")),
                   changed_modules=sorted(modules))
    if missing or present:
        e.ok = False
        parts = []
        if missing:
            parts.append(f"declared kernels {missing} do not run in the step")
        if present:
            parts.append(f"kernels declared removed {present} still run")
        e.reason = "; ".join(parts)
    elif adds or removes:
        e.reason = (f"declared kernels seen in the step: adds {adds or '-'}, removes gone {removes or '-'}; "
                    f"{len(changed)} op/module counts changed")
    elif not changed and enabled:
        e.reason = (f"the eager op histogram is the base's, and the candidate runs {', '.join(enabled)}, "
                    "where the base fails: the change acts there")
    elif not changed:
        e.ok = False
        e.reason = ("the candidate's op histogram is identical to the base's (same ops, same modules, same counts): "
                    "the change never runs in the step")
    else:
        e.reason = f"{len(changed)} op/module counts differ from the base (e.g. {changed[0]})"
    return e
