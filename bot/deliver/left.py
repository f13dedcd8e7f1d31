"""The report's "What is left" section (issue 20: where a target is missed, say what remains and what
limits it, from the profile, not guesses): the branch against the compute floor, the time by category
of base and branch, and the analyzer's opportunities the branch does not touch, each with why.
"""
from __future__ import annotations

from bot.deliver.blocks import H, P, Table, fmt_ms as _ms
from bot.steps.baseline import measurements


LEFT_ROWS = 8  # opportunities shown in "What is left"; the rest are counted


def _roofline(prof) -> dict:
    """The baseline profile's roofline (runner/roofline.py), or {} when its file is not on this machine."""
    try:
        return (prof.load().get("roofline") or {}) if prof else {}
    except (OSError, ValueError):
        return {}


def _why_left(o, cands: list, verdicts: dict, stacked: set[str], delivered: bool) -> str:
    """Why an opportunity has no commit on the branch: stand-in code, no candidate, or what its candidates got."""
    if o.stand_in:
        return f"stand-in code, reported and never optimized ({o.stand_in})"
    if not cands:
        return f"no candidate was made for it (its generator: {o.generator})"
    why = []
    for c in cands:
        v = verdicts.get(c.id)
        if v is None:
            why.append(f"{c.id}: not validated")
        elif v.accepted and c.id in stacked:
            why.append(f"{c.id}: on the branch, and it changes no op count at this module" if delivered
                       else f"{c.id}: accepted alone, not delivered (the stack was refused)")
        elif v.accepted:
            why.append(f"{c.id}: accepted alone, left out of the stack")
        else:
            why.append(f"{c.id}: {v.status} ({v.reason}: {v.summary[:120]})")
    return "; ".join(why)


def _acts_on(pattern: str, changed: list[str]) -> bool:
    """Does the branch change op counts at the opportunity's module or inside it?"""
    return any(m == pattern or m.startswith(pattern + ".") for m in changed)


def what_is_left(results) -> list:
    """Where the branch stands against the compute floor, which kinds of work the step still spends its
    time on (one eager step of base and branch under the profiler, from the stack's engagement check),
    and the analyzer's opportunities at modules the branch leaves unchanged (or, for a verdict recorded
    before the changed modules were kept, that no delivered commit names), each with why: a missed
    target is explained from the profile, not guessed at."""
    comb, prof, ana, gen, val = results.combine, results.profile, results.analyze, results.generate, results.validate
    blocks: list = [H(3, "What is left")]
    sv = comb.stack_verdict if comb and not comb.refused else None
    m = measurements(sv) if sv else {}
    best = min((v for k, v in m.items() if k.startswith("cand_") and v), key=lambda x: x.median_ms, default=None)
    if best is None:  # nothing delivered: what is left is the base
        best = min((v for v in (results.baseline.eager, results.baseline.graph) if v), key=lambda x: x.median_ms,
                   default=None) if results.baseline else None
    roof = _roofline(prof)
    floor = roof.get("compute_floor_ms")
    lines = []
    if best is not None:
        what = "the branch" if sv else "the base (nothing delivered)"
        lines.append(f"Fastest production mode of {what}: {best.mode}, {_ms(best.median_ms)} ms/step, measured on "
                     f"{best.device}{' (' + best.device_name + ')' if best.device_name else ''}.")
        if floor:
            gap = best.median_ms - floor
            lines.append(f"Compute floor {_ms(floor)} ms ({roof.get('compute_floor_basis', 'FLOPs at the ceilings measured')}; "
                         f"{prof.device}): {_ms(gap)} ms, {100 * gap / best.median_ms:.1f}% of the step, above it.")
    rates = [f"{k} at {roof[f'{k}_pct_of_peak']:.1f}% of its ceiling" for k in ("gemm", "attention")
             if roof.get(f"{k}_pct_of_peak") is not None]
    if rates:
        lines.append(f"In the baseline profile ({prof.device}): " + ", ".join(rates) + ".")
    blocks.append(P(" ".join(lines) or "No timing of the branch or the base to compare with a floor."))

    eng = sv.engagement if sv else None
    # on the CPU a branch's Triton kernels run in the interpreter: its times by category would say where the
    # kernels run, not what they cost (DESIGN decision 7), so only the base's are shown there
    interpreted = bool(sv and not sv.device.startswith("cuda"))
    after = eng.candidate_categories if eng and not interpreted else {}
    before = (eng.base_categories if eng and eng.base_categories else (prof.categories if prof else {})) or {}
    if before:
        dev = sv.device if after else (prof.device if prof else "?")
        rows = [[k, _ms(before.get(k)), _ms(after.get(k)) if after else "n/a",
                 _ms(after.get(k, 0.0) - before.get(k, 0.0)) if after else "n/a", dev]
                for k in sorted(set(before) | set(after), key=lambda k: -max(before.get(k, 0.0), after.get(k, 0.0)))]
        blocks.append(Table(["category", "base ms", "branch ms", "change ms", "one eager step under the profiler, on"],
                            rows))
        if not after:
            blocks.append(P("Branch column: " + (
                f"not shown on {sv.device}, where the branch's Triton kernels run in the interpreter, whose times say "
                "nothing about them (DESIGN decision 7); a GPU run gives it" if interpreted else
                "no profile of the stack in this run (" + ("nothing delivered" if sv is None else
                                                          "its engagement check was not run") + ")") + "."))

    opps = ana.opportunities if ana else []
    if opps:
        cands = gen.candidates if gen else []
        stacked = {c.candidate_id for c in comb.commits} if comb else set()
        touched = eng.changed_modules if eng else None
        if sv and touched is not None:  # measured: where the stack's op counts differ from the base's
            done = {o.id for o in opps if _acts_on(o.location.module_pattern, touched)}
        else:  # an earlier verdict without that record: the opportunities the commits name
            done = {c.opportunity_id for c in cands if c.id in stacked} if sv else set()
        left = sorted((o for o in opps if o.id not in done), key=lambda o: -o.gain_ms)
        verdicts = val.verdicts if val else {}
        rows = []
        for o in left[:LEFT_ROWS]:
            loc = o.location
            rows.append([o.kind, loc.module_pattern, f"{loc.engine_file}:{loc.engine_line}" if loc.engine_file else "",
                         _ms(o.gain_ms), _why_left(o, [c for c in cands if c.opportunity_id == o.id], verdicts, stacked,
                                   sv is not None)])
        if rows:
            rest = left[LEFT_ROWS:]
            blocks.append(Table(["opportunity", "module", "engine file:line", "estimated gain ms", "why not on the branch"],
                                rows))
            how = ("whose modules' op counts the branch leaves as the base's (the stack's engagement profile, one "
                   f"eager step on {sv.device})" if sv and touched is not None else "that no delivered commit names")
            blocks.append(P(f"The analyzer's opportunities {how}, largest first (estimates from the baseline profile on "
                            f"{prof.device if prof else '?'}; they overlap each other)"
                            + (f"; {len(rest)} more, {_ms(sum(o.gain_ms for o in rest))} ms estimated" if rest else "")
                            + "."))
        else:
            blocks.append(P("The branch acts on every opportunity the analyzer found."))
    return blocks
