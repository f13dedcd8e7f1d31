"""Speed, check 6 of docs/validate.md (the noise rules are docs/timing.md).

Candidate and base in alternating processes (candidate, base, candidate, base): the two
correctness processes, then one more of each that only times (on the CPU without speed gates, the
default there, the correctness processes' timings alone: the numbers are informational); in every production mode the context
names (Context.modes: eager, graph, compile, compile+graph on GPU). Per side and mode the estimate
is the median of the process medians; the A/A spread of a side's processes and the spread inside
each process set the noise band (speed_outcome). The verdict (speed_rejection): a mode that fails
for the candidate and not for the base rejects ("crashed under compile+graph: ..."); a mode that
fails for the base and runs for the candidate is timed against what a user of the base runs instead
(base_fallbacks: the same step without the graph, else without compile), and a gain there is the
candidate's ("enabled": Qwen-Image's forward copies a pageable host tensor, so only a candidate that
hoists it captures; SGLang's FP8 quantization kernel does not compile under inductor, so only a
candidate that fixes it runs compiled); with speed gating, a mode that is slower rejects (a user who runs
that mode would lose), and so does no mode being faster or enabled. A rejection inside a wide band
is measured again (Options.retimes). Over 10x, or under the roofline floor: implausible (held).
"""
from __future__ import annotations

import statistics
from pathlib import Path

from bot.jobs import JobOutcome
from bot.validate.context import Context
from bot.validate.resolve import Revision
from bot.validate.verdict import Speed, vs_base
from runner.job import parse_mode

IMPLAUSIBLE_SPEEDUP = 10.0
NOISE_FLOOR_PCT = {"cuda": 0.5, "cpu": 2.0}  # never call a difference smaller than this a change
# A speed verdict that would reject (no-change, slower) inside a noise band wider than this is not
# trusted: another candidate/base pair of timing processes runs (Options.retimes, docs/timing.md).
RETIME_NOISE_PCT = {"cuda": 2.0, "cpu": 10.0}


def _median(t) -> float | None:
    return t["median_ms"] if isinstance(t, dict) else None


def measure_speed(ctx: Context, rev: Revision, base_sha: str, base_wt: Path, base1: dict,
                  cand1: dict, base_timed_here: bool = True) -> tuple[list[Speed], JobOutcome | None]:
    """(speed per mode, None), or ([], the candidate timing job that did not finish: a crashed verdict).

    base1 and cand1 are the correctness processes' results, the first process of each side. Where
    base1 was not run by this validation (`base_timed_here` False: the run's shared base outcome,
    bot/validate/validator._base_cache), its timings are another candidate's window and are not
    used: a base process that only times runs first, right after the candidate's correctness
    process, so each side still has two processes, interleaved. When the speed would reject the
    candidate (no-change, slower) but the noise band is wide (RETIME_NOISE_PCT), the measurement is
    not trusted: up to `retimes` more (candidate, base) pairs run, and the outcome is taken over all
    processes, a disturbed one set aside (speed_outcome). A base timing job that fails is an error."""
    params = {"correctness": False, "timing": ctx.timing_params()}
    if not ctx.gates and not ctx.is_cuda:
        # On the CPU without speed gates (the default: DESIGN decision 7) the numbers are reported
        # and decide nothing; a second pair of processes would only narrow an informational band, at
        # the price of a whole candidate process (under TRITON_INTERPRET=1, a third of a validation).
        return _speeds(ctx, {"base": [base1], "candidate": [cand1]}, base1.get("passes", 1), "cpu"), None
    runs = {"base": [base1] if base_timed_here else [], "candidate": [cand1]}
    retimes = max(0, ctx.opts.retimes if ctx.opts.retimes is not None else (2 if ctx.gates else 0))
    dev = "cuda" if ctx.is_cuda else "cpu"
    for round_ in range(retimes + 1):
        suffix = "" if round_ == 0 else f"-{round_ + 1}"
        pair = [("candidate", rev.worktree, rev.sha, f"candidate-timing{suffix}"),
                ("base", base_wt, base_sha, f"base-timing{suffix}")]
        order = pair if round_ or base_timed_here else [("base", base_wt, base_sha, "base-timing-0"), *pair]
        for side, wt, sha, name in order:
            job = ctx.job("validate_step", wt, sha, name, params, seeds=ctx.seeds[:1], shapes=ctx.shapes[:1])
            ctx.say(f"{side}: timed process {len(runs[side]) + 1}")
            out = ctx.run_job(job, Path(job.out_dir), ctx.opts.timeout_s or 1800, name,
                              f"{side}: timed process {len(runs[side]) + 1}")
            if not out.ok:
                if side == "candidate":
                    return [], out
                raise out.error("the base timing job")
            runs[side].append(out.result)
        speeds = _speeds(ctx, runs, base1.get("passes", 1), dev)
        rej = speed_rejection(speeds) if ctx.gates else None
        noisy = [s for s in speeds if rej and rej[0] in ("slower", "no-change") and s.outcome in ("slower", "no-change")
                 and s.noise_pct is not None and s.noise_pct > RETIME_NOISE_PCT[dev]]
        if not noisy or round_ == retimes:
            return speeds, None
        ctx.say(f"speed: {noisy[0].mode} {noisy[0].outcome} inside a {noisy[0].noise_pct:.1f}% noise band: timing "
                f"another candidate/base pair ({round_ + 1} of {retimes})")
    raise AssertionError("unreachable: the last round returns")


def _speeds(ctx: Context, runs: dict, passes: int, dev: str) -> list[Speed]:
    speeds = []
    for mode in ctx.modes:
        bs = [r["timing"].get(mode) for r in runs["base"]]
        cs = [r["timing"].get(mode) for r in runs["candidate"]]
        if all(x is None for x in bs + cs):
            continue
        s = Speed(mode=mode, device=dev, passes=passes, n=ctx.iters)
        fails = [x for x in bs + cs if isinstance(x, str)]
        if fails:
            s.note = failure_note(bs, cs)  # e.g. a capture failure, reported
            s.base_ms = [_median(x) for x in bs if _median(x) is not None]
            s.candidate_ms = [_median(x) for x in cs if _median(x) is not None]
            # the base ran this mode in every process and the candidate did not: the candidate broke it
            s.outcome = "failed" if all(isinstance(x, dict) for x in bs) else "n/a"
            if all(isinstance(x, str) for x in bs) and all(isinstance(x, dict) for x in cs):
                _enabled(s, runs["base"], cs, dev)
            speeds.append(s)
            continue
        s.note = "; ".join(filter(None, [_compare(s, bs, cs, dev), added_breaks(mode, bs[0], cs[0]),
                                         "cpu clock, informational" if dev == "cpu" else ""]))
        speeds.append(s)
    return speeds


def added_breaks(mode: str, base: dict, cand: dict) -> str:
    """A compiled mode where the candidate's step has more graph breaks than the base's
    (runner/modes.compile_report): inductor fuses nothing across a break, so a kernel dynamo cannot
    trace costs the fusions around it, whatever it saves itself. Reported, not judged (speed is)."""
    b, c = base.get("graphs") or {}, cand.get("graphs") or {}
    if not b or not c or (c.get("breaks") or 0) <= (b.get("breaks") or 0):
        return ""
    first = (c.get("top") or [{}])[0]
    where = f"; most at {first['at']}: {first['why'][:160]}" if first.get("at") else ""
    return f"the candidate adds graph breaks under {mode} (base {b['breaks']}, candidate {c['breaks']}{where})"


def _compare(s: Speed, bs: list[dict], cs: list[dict], dev: str) -> str:
    """s's per-process medians, speedup, noise band and outcome from the base's and the candidate's
    timings (speed_outcome); returns the note on a process set aside, or ""."""
    s.base_ms = [round(_median(x), 4) for x in bs]
    s.candidate_ms = [round(_median(x), 4) for x in cs]
    s.speedup, s.noise_pct, s.outcome, aside = speed_outcome(
        s.base_ms, s.candidate_ms, [_rel_iqr(x) for x in bs], [_rel_iqr(x) for x in cs], dev)
    return f"farthest from the others, set aside: {', '.join(aside)}" if aside else ""


def base_fallbacks(mode: str) -> list[str]:
    """The modes a user of the base runs when `mode` fails for it, in the order they would try them:
    the same step uncaptured when capture is what failed (compile+graph -> compile), then without
    compile (compile+graph -> graph; compile -> eager), then eager. [] for eager: nothing to fall
    back to."""
    recipe, graph = parse_mode(mode)
    out = []
    if graph and recipe is not None:
        out += [mode[:-len("+graph")], "graph"]
    if mode != "eager":
        out.append("eager")
    return out


def _enabled(s: Speed, base: list[dict], cand: list, dev: str) -> None:
    """The candidate runs a mode that fails for the base in every process: timed against the first
    of base_fallbacks the base ran in every process, which base_mode names and base_ms then holds.
    Faster beyond the noise band is outcome "enabled" (a gain: speed_rejection counts it as a faster
    mode); otherwise "n/a" with the ratio kept: a user loses nothing by the candidate running a mode
    the base cannot."""
    fallback = next((m for m in base_fallbacks(s.mode)
                     if all(isinstance((r.get("timing") or {}).get(m), dict) for r in base)), None)
    if fallback is None:
        return
    base_fallback = [r["timing"][fallback] for r in base]
    failures, aside = s.note, _compare(s, base_fallback, cand, dev)
    s.base_mode, gain = fallback, s.outcome == "faster"
    s.outcome = "enabled" if gain else "n/a"
    s.note = "; ".join(filter(None, [f"{s.mode} runs for the candidate only; against the base's {fallback}"
                                     + ("" if gain else ": no gain beyond the noise band"), aside, failures]))


def failure_note(base: list, cand: list) -> str:
    """One mode's failures, each error once with who had it: "base and candidate: RuntimeError: ..."
    when the engine itself cannot run the mode (Qwen-Image's host copy under CUDA-graph capture),
    else each side's own. The runner already bounds an error to its first line (300 characters)."""
    who: dict[str, list[str]] = {}
    for side, xs in (("base", base), ("candidate", cand)):
        for x in xs:
            if isinstance(x, str) and side not in who.setdefault(x, []):
                who[x].append(side)
    return "; ".join(f"{' and '.join(sides)}: {err}" for err, sides in who.items())


def mode_failures(base: dict, cand: dict) -> list[tuple[str, str]]:
    """(mode, the candidate's error) for each mode that ran for the base and failed for the candidate,
    from one process of each side (validate_step results)."""
    bt, ct = base.get("timing") or {}, cand.get("timing") or {}
    return [(m, err) for m, err in ct.items() if isinstance(err, str) and isinstance(bt.get(m), dict)]


def speed_rejection(speeds: list[Speed]) -> tuple[str, str] | None:
    """(reason, why) when the speeds reject the candidate, else None: a mode that failed for the
    candidate only ("crashed"); a mode that is slower ("slower": a user running that mode loses);
    no mode faster or enabled ("no-change"). Modes that did not run for the base decide nothing,
    except one the candidate enabled with a gain (outcome "enabled"), which counts as faster."""
    failed = [s for s in speeds if s.outcome == "failed"]
    if failed:
        return "crashed", f"crashed under {failed[0].mode}: {failed[0].note}"
    slower = [s for s in speeds if s.outcome == "slower"]
    if slower:
        return "slower", "slower under " + ", ".join(f"{s.mode} ({s.speedup:.3f}x)" for s in slower)
    measured = [s for s in speeds if s.outcome in ("faster", "no-change", "enabled")]
    if measured and not any(s.outcome in ("faster", "enabled") for s in measured):
        return "no-change", "faster in no mode"
    return None


def _typical(xs: list[float], within: list[float]) -> tuple[float, float, float, str]:
    """(estimate, A/A spread relative to it, largest half relative IQR, the process set aside) of one
    side's per-process medians. With three or more processes the one farthest from their median is
    set aside (a process that a co-tenant or a clock change slowed): interference makes a process
    slower, so a lone outlier is not the code's speed."""
    idx = list(range(len(xs)))
    aside = ""
    if len(xs) >= 3:
        mid = statistics.median(xs)
        far = max(idx, key=lambda i: abs(xs[i] - mid))
        aside = f"process {far + 1} ({xs[far]:.4g} ms)"
        idx.remove(far)
    kept = [xs[i] for i in idx]
    est = statistics.median(kept)
    spread = (max(kept) - min(kept)) / est if len(kept) > 1 and est > 0 else 0.0
    half_iqr = max([within[i] / 2 for i in idx if i < len(within)] + [0.0])
    return est, spread, half_iqr, aside


def speed_outcome(base_ms: list[float], cand_ms: list[float], base_within: list[float], cand_within: list[float],
                  device: str):
    """(speedup, noise %, outcome, processes set aside) from the per-process medians of base and
    candidate (and each process's relative interquartile range, in the same order).

    Per side the estimate is the median of the process medians (two processes: their mean), with
    a lone outlier set aside once there are three or more (_typical). noise = the larger of: the
    A/A spread of the kept processes (base vs base, candidate vs candidate) relative to their
    estimate, half the relative interquartile range inside any kept process, and a floor
    (NOISE_FLOOR_PCT). A speedup whose gain is inside the noise is "no-change"."""
    bm, b_aa, b_in, b_aside = _typical(base_ms, base_within)
    cm, c_aa, c_in, c_aside = _typical(cand_ms, cand_within)
    aside = [f"base {b_aside}"] * bool(b_aside) + [f"candidate {c_aside}"] * bool(c_aside)
    speedup = round(bm / cm, 4) if cm > 0 else None
    noise = max(round(100 * max(b_aa, c_aa, b_in, c_in), 3), NOISE_FLOOR_PCT[device])
    if speedup is None:
        return None, noise, "n/a", aside
    if 100 * (bm / cm - 1) > noise:
        return speedup, noise, "faster", aside
    if 100 * (cm / bm - 1) > noise:
        return speedup, noise, "slower", aside
    return speedup, noise, "no-change", aside


def _rel_iqr(t: dict) -> float:
    xs = sorted(t.get("samples_ms") or [t["median_ms"]])
    if len(xs) < 4:
        return (xs[-1] - xs[0]) / t["median_ms"] if t["median_ms"] else 0.0
    q1, q3 = xs[len(xs) // 4], xs[(3 * len(xs)) // 4]
    return (q3 - q1) / t["median_ms"] if t["median_ms"] else 0.0


def speed_line(speed: list[Speed]) -> str:
    """One line per verdict summary: each mode's speedup, device, outcome and noise."""
    parts = []
    for s in speed:
        if s.speedup is None:
            parts.append(f"{s.mode}: {s.note or 'n/a'}")
        else:
            parts.append(f"{s.mode} {s.speedup:.3f}x{vs_base(s.base_mode)} on {s.device} ({s.outcome}, noise {s.noise_pct:.2f}%)")
    return "; ".join(parts)


def implausible(speed: list[Speed], flops: dict | None) -> str:
    """Why these numbers cannot be believed (a person decides), or "" when they can."""
    for s in speed:
        if s.speedup is not None and s.speedup > IMPLAUSIBLE_SPEEDUP:
            return f"{s.mode} speedup {s.speedup:.1f}x is over {IMPLAUSIBLE_SPEEDUP:.0f}x"
        floor = (flops or {}).get("compute_floor_ms")
        if floor and s.candidate_ms and min(s.candidate_ms) < floor:
            return (f"{s.mode} step {min(s.candidate_ms):.3f} ms is under the roofline floor {floor:.3f} ms "
                    f"({flops.get('compute_floor_basis', 'counted FLOPs at the ceilings measured in the job')})")
    return ""
