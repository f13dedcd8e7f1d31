"""Correctness, checks 3 and 4 of docs/validate.md.

  check_outputs     both sides' saved outputs compared in a clean process that imports no engine
                    (runner/kinds/compare.py): NaN/Inf, rel L2, atol+rtol per element (or bit-exact);
                    and the candidate's inputs unmodified; every (shape, seed) in eager, and the first
                    one in each other production mode against the base in that mode; at a quantized
                    precision also every (shape, seed) against the unquantized model (`reference`):
                    no farther from it than the quantized base (bot/tolerance.py NO_FARTHER)
  check_kernels     every kernel test the candidate names (kernel_tests_for) against its reference
                    (runner/kinds/kernel_check.py), with M=1 and odd-M shapes added
"""
from __future__ import annotations

import json
from pathlib import Path

from bot.errors import OptbotError, RunnerError
from bot.jobs import JobOutcome
from bot.tolerance import NO_FARTHER
from bot.validate.context import Context
from bot.validate.resolve import Revision
from bot.validate.speed import base_fallbacks
from bot.validate.verdict import Correctness, OutputCheck
from bot.workload import Shape
from runner.job import parse_mode


def _label(shape: dict) -> str:
    return Shape.from_json(shape).label()


def check_outputs(ctx: Context, base: dict, cand: dict, reference: dict | None = None) -> Correctness:
    """Both sides' validate_step results -> Correctness (ok only when every output check passes and
    no input was modified). `reference`: the base's validate_step result at the unquantized precision
    (a quantized run), for the "no farther from the unquantized model" pairs."""
    wl = ctx.target.workload
    tol = wl.tolerance_for(ctx.target.dtype, ctx.target.engine_name)
    rule = "bit-exact" if wl.bit_exact else tol.rule(ctx.target.dtype)
    corr = Correctness(ok=True, seeds=ctx.seeds, shapes=[s.label() for s in ctx.shapes], rule=rule)
    poison = (cand.get("runs") or [{}])[0].get("poison", {})
    corr.poison = poison.get("how", "") + (f"; {poison.get('empty_tensors_nan_filled')} empty tensors NaN-filled"
                                           if poison else "")
    pairs = []
    brun = {(json.dumps(r["shape"], sort_keys=True), r["seed"]): r for r in base["runs"]}
    for r in cand["runs"]:
        label = f"{_label(r['shape'])} seed {r['seed']}"
        for ch in r.get("inputs_modified", []):
            corr.inputs_modified.append(f"{label}: {ch['input']} " + (
                ch.get("what") or f"changed in place: {ch['changed']} of {ch['numel']} elements, max abs "
                                  f"{ch['max_abs']:.3g} at {ch['at']} ({ch['was']:.4g} -> {ch['now']:.4g})"))
        b = brun.get((json.dumps(r["shape"], sort_keys=True), r["seed"]))
        if b is None:
            raise RunnerError(f"internal: no base run for {label}")
        pairs.append({"label": label, "base": b["file"], "candidate": r["file"]})
    if reference is not None:
        refs = {(json.dumps(r["shape"], sort_keys=True), r["seed"]): r for r in reference["runs"]}
        for r in cand["runs"]:
            key = (json.dumps(r["shape"], sort_keys=True), r["seed"])
            if key not in refs:
                raise RunnerError(f"internal: no unquantized run for {_label(r['shape'])} seed {r['seed']}")
            pairs.append({"label": f"{_label(r['shape'])} seed {r['seed']} [vs unquantized]", "reference":
                          refs[key]["file"], "base": brun[key]["file"], "candidate": r["file"], "no_farther": NO_FARTHER})
    if cand.get("runs"):
        r0 = cand["runs"][0]
        b0 = brun[(json.dumps(r0["shape"], sort_keys=True), r0["seed"])]
        across = None if wl.bit_exact or tol.across_modes is None else tol.bound(across_modes=True)
        label0 = f"{_label(r0['shape'])} seed {r0['seed']}"
        base_modes, cand_modes = base.get("mode_outputs") or {}, cand.get("mode_outputs") or {}
        pairs += mode_pairs(label0, b0["file"], base_modes, cand_modes, across)
        if reference is not None:  # added error is judged in every mode, not only eager's
            ref0 = refs[(json.dumps(r0["shape"], sort_keys=True), r0["seed"])]
            pairs += mode_farther_pairs(label0, ref0["file"], base_modes, cand_modes)
    job = ctx.job("compare", None, "", "compare", {  # no engine in the comparing process
        "pairs": pairs, "bit_exact": wl.bit_exact,
        "tolerance": None if wl.bit_exact else tol.bound()})
    ctx.say("compare: outputs in a clean process")
    out = ctx.run_job(job, ctx.run_dir / "compare", 600, "compare", "compare")
    if not out.ok:
        raise out.error("the compare job")
    for c in out.result["checks"]:
        corr.checks.append(OutputCheck(label=c["label"], output=c["output"], ok=c["ok"], reason=c["reason"],
                                       max_abs=c.get("max_abs"), at=c.get("at"), rel_l2=c.get("rel_l2"),
                                       violations=c.get("violations"), nonfinite=c.get("nonfinite"),
                                       against=c.get("against", ""), base_rel_l2=c.get("base_rel_l2")))
    corr.ok = not corr.inputs_modified and all(c.ok for c in corr.checks) and bool(corr.checks)
    return corr


def mode_pairs(label0: str, base_eager: str, base_modes: dict[str, str], cand_modes: dict[str, str],
               across: dict | None = None) -> list[dict]:
    """The output pairs of each production mode (the first shape and seed's outputs, made after the
    correctness runs of every shape): the candidate's in that mode against the base's in the same
    mode (compile's own rounding is on both sides; a kernel that is wrong only when compiled or
    replayed is not). Eager's too: a model that compiles itself in __init__ runs its eager mode under
    graphs recompiled for the later shapes (adversarial wrong_on_a_shape_seen_again.patch); a base
    outcome kept from before eager's were saved has its correctness output. Where the base could not
    run a mode, against the run a user of the base makes instead (without the graph, else without
    compile: speed.base_fallbacks) and the one the speed check times such a mode against;
    a candidate credited with a mode it "enabled" is checked in it (adversarial
    gpu_graph_only_wrong.patch), under `across` where the workload gives a bound for outputs of two
    modes (the precision's across_modes: compile's own rounding is on one side only)."""
    pairs = []
    for mode, file in cand_modes.items():
        if mode in base_modes or (mode == "eager" and base_eager):
            pairs.append({"label": f"{label0} [{mode}]", "base": base_modes.get(mode) or base_eager, "candidate": file})
            continue
        avail = dict(base_modes, eager=base_eager) if base_eager else base_modes
        ref = next((m for m in base_fallbacks(mode) if avail.get(m)), None)
        if ref:
            pair = {"label": f"{label0} [{mode}; base {ref}]", "base": avail[ref], "candidate": file}
            if across is not None and parse_mode(mode)[0] != parse_mode(ref)[0]:  # inductor's rewrite on one side
                pair["tolerance"] = across
            pairs.append(pair)
    return pairs


def mode_farther_pairs(label0: str, reference: str, base_modes: dict[str, str], cand_modes: dict[str, str]) -> list[dict]:
    """A quantized precision's second condition in each production mode but eager: the candidate's output
    in that mode no farther from the unquantized model (its eager output, `reference`) than the base's in
    the same mode, within NO_FARTHER. Both sides carry that mode's own rewrite (inductor's rounding), so
    the ratio measures what the candidate adds; without it a kernel that adds error only when compiled
    is judged by the within-precision bound alone (docs/validate.md, check 3; docs/fp8.md, "FLUX.2's FP8
    entry at the gate")."""
    return [{"label": f"{label0} [{mode}] [vs unquantized]", "reference": reference, "base": base_modes[mode],
             "candidate": file, "no_farther": NO_FARTHER} for mode, file in cand_modes.items() if mode in base_modes]


def correctness_summary(corr: Correctness) -> str:
    """The one line a correctness rejection says: the first modified input, else the first failing check."""
    if corr.inputs_modified:
        return f"modified its inputs in place: {corr.inputs_modified[0]}"
    bad = [c for c in corr.checks if not c.ok]
    if bad:
        shapes = sorted({c.label.split(' seed')[0] for c in bad})
        return (f"{len(bad)} of {len(corr.checks)} output checks fail (shapes {', '.join(shapes)}); "
                f"first: {bad[0].label}: {bad[0].reason}")
    bad_k = [k for k in corr.kernels if not k.get("ok")]
    if bad_k:
        case = next(c for c in bad_k[0]["cases"] if not c["ok"])
        return f"kernel {bad_k[0]['name']} differs from its reference at shape {case['shape']} seed {case['seed']}: {case['reason']}"
    return "no outputs to compare"


def kernel_tests_for(rev: Revision, kernel_store: Path) -> list[str]:
    """Kernel test modules a revision names: Optbot-Kernel-Tests paths (in the engine repo) and the
    test_*.py files of its Optbot-Entry entries in `kernel_store`."""
    tests = []
    for rel in rev.trailers.get("Optbot-Kernel-Tests", []):
        p = (rev.worktree / rel).resolve()
        if not str(p).startswith(str(rev.worktree.resolve())) or not p.is_file():
            raise OptbotError(f"trailer Optbot-Kernel-Tests: {rel!r} is not a file inside the candidate's worktree")
        tests.append(str(p))
    for entry in rev.trailers.get("Optbot-Entry", []):
        tests += [str(p) for p in sorted((Path(kernel_store) / entry).glob("test_*.py"))]
    return sorted(set(tests))


def check_kernels(ctx: Context, rev: Revision, corr: Correctness) -> JobOutcome | None:
    """Fills corr.kernels and clears corr.ok on a failure. A kernel check job that did not finish
    comes back (the validator makes it a crashed verdict); else None."""
    from bot.knowledge.location import locate
    tests = kernel_tests_for(rev, ctx.opts.kernel_store or locate().kernel_store)
    if not tests:
        return None
    wl, engine = ctx.target.workload, ctx.target.engine_name
    tolmap = {k: {"atol": t.atol, "rtol": t.rtol} for k in wl.tolerance for t in (wl.tolerance_for(k, engine),)}
    job = ctx.job("kernel_check", rev.worktree, rev.sha, "kernels", {"tests": tests, "tolerance": tolmap})
    ctx.say(f"kernels: {len(tests)} test module(s) vs their references")
    out = ctx.run_job(job, ctx.run_dir / "kernels", ctx.opts.timeout_s or 900, "kernels", "kernels")
    if not out.ok:
        corr.ok = False
        return out
    corr.kernels = out.result["tests"]
    if not all(k["ok"] for k in corr.kernels):
        corr.ok = False
    return None
