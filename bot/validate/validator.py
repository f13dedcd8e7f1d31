"""THE validator (DESIGN decision 6): the CLI, `store check`, the agent's tools and `optimize` all call
``validate(target, candidate)`` and get a typed Verdict (bot/validate/verdict.py). docs/validate.md has the rules.

Order of checks, each in its own runner process with a timeout (bot/jobs.run_job):
  1. candidate side validate_step job in the candidate worktree, FIRST (the reference for these fresh
                    seeds and weights exists nowhere yet): every (shape, seed) under poison, outputs
                    saved; profile histogram; first timed run.
                    crash / fault / OOM -> rejected "crashed"; hang -> "timeout" (log tail kept;
                    after a GPU fault a health probe runs before anything else)
  2. base side      the same job in the base worktree                     (a broken base is an error)
     (quantized)    the base again at the unquantized precision (eager, no timing): the reference
                    for check 3's second condition
  3. compare        a clean process loads both sides' .pt files: NaN/Inf, rel L2, atol+rtol per
                    element (or bit-exact), inputs unmodified; at a quantized precision each output
                    also no farther from the unquantized model than the base's  -> "correctness"
  4. kernels        each kernel the candidate names (trailers) vs its reference, M=1 and odd M
                                                                          -> "correctness"
  5. engagement     declared kernels present / removed ones gone; else the op histogram must differ
                                                                          -> "not-engaged"
  6. speed          process-level interleave cand, base, cand, base, in every production mode
                    (eager, CUDA graph, torch.compile, compile + CUDA graph on GPU; eager on CPU);
                    A/A noise from the two base processes (and the two candidate ones)
                    -> "slower" in any mode / "no-change" in every mode (GPU); on CPU speed is
                    reported, labelled cpu, and does not gate (DESIGN decision 7), so there the
                    correctness processes' timings are all that is measured; > 10x or under
                    the roofline floor -> held.
A mode that fails for the candidate and runs for the base (a compile graph break that errors, a
fault under CUDA-graph capture) rejects it "crashed" with the mode and the error, on any device;
each non-eager mode's outputs are compared with the base's in that mode (check 3).
Before any of them, a stack whose added lines reach for the runner's own machinery is held (tamper_lines).
With a run directory that holds an earlier attempt at the same candidate and base (Options.run_dir), the
validation keeps that attempt's seeds and each runner process it finished (bot/validate/attempt.py): a
validation cut from outside goes on where it stopped.

The checks live in their own modules (context.py holds what they share): correctness.py (3, 4),
engagement.py (5), speed.py (6); this module orders them and turns a crash into its verdict.
"""
from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bot.engine import add_worktree
from bot.errors import OptbotError
from bot.jobs import JobOutcome, run_job
from bot.paths import new_run_dir
from bot.target import Target
from bot.validate.attempt import begin, tree_of
from bot.validate.context import Context
from bot.validate.correctness import check_kernels, check_outputs, correctness_summary
from bot.validate.engagement import check_engagement, enabled_modes
from bot.validate.resolve import Revision, resolve_base, resolve_candidate
from bot.validate.speed import implausible, measure_speed, mode_failures, speed_line, speed_rejection
from bot.validate.verdict import Speed, Verdict
from runner.job import split_precision

# Added lines that reach for the validator's own machinery: held for a person (docs/validate.md).
TAMPER_RE = re.compile(r"(import\s+runner\b|from\s+runner[\s.]|\brunner\.(timing|harness|kinds|poison|job|profiler|channel|sandbox)\b"
                       r"|sys\.modules\[.runner|time_interleaved|_one_trial|channel\.finish|\bbot\.jobs\b)")
DEFAULT_TIMEOUT_S = 1800.0  # a candidate job, when no base time is known yet


@dataclass
class Options:
    seeds: list[int] | None = None  # default: 3 fresh random seeds (never 0, never fixed)
    weight_seed: int | None = None  # default: fresh random (same for both sides)
    speed: bool = True  # end-to-end timing (process-level interleave)
    # production modes timed and checked (runner/modes.py); default: all four on CUDA, eager on CPU
    modes: tuple[str, ...] | None = None
    compile_backend: str = "inductor"  # the compile modes' torch.compile backend (tests: aot_eager)
    speed_gates: bool | None = None  # slower/no-change reject; default: on CUDA only
    retimes: int | None = None  # extra candidate/base timing pairs for a noisy rejection; default 2 when gating
    engagement: bool = True
    kernels: bool = True
    warmup: int | None = None
    iters: int | None = None
    timeout_s: float | None = None  # candidate jobs; default: adaptive from the base job's time
    base_timeout_s: float = 1800
    cache_dir: Path | None = None  # reuse the base side's correctness outputs (same seeds and sha)
    run_dir: Path | None = None
    log: object = None  # callable(str) for progress lines
    kernel_store: Path | None = None  # where Optbot-Entry kernel tests are; default: bot.knowledge.location's


def fresh_seeds(n: int = 3) -> list[int]:
    rng = random.SystemRandom()
    seeds: set[int] = set()
    while len(seeds) < n:
        seeds.add(rng.randrange(1, 2**31 - 1))
    return sorted(seeds)


def shared_seeds(folder: Path) -> tuple[list[int], int]:
    """Fresh random seeds and weight seed drawn once for every validation under `folder` (an optimize
    run's `validate/`, a store check's run directory) and kept there, so that they share one base
    outcome (Options.cache_dir) and a resumed run keeps them."""
    f = folder / "seeds.json"
    if not f.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".seeds-{os.getpid()}-{threading.get_ident()}.json"
        tmp.write_text(json.dumps({"seeds": fresh_seeds(3), "weight_seed": fresh_seeds(1)[0]}))
        try:
            os.link(tmp, f)  # whole, and only if absent: lanes starting at once all read the first one's
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    d = json.loads(f.read_text())
    return d["seeds"], d["weight_seed"]


def validate(target: Target, candidate: str, base: str | None = None, opts: Options | None = None) -> Verdict:
    """Validate `candidate` (engine commit/branch, or a patch file) against `base` (default: the target's)."""
    opts = opts or Options()
    t0 = time.monotonic()
    base_sha = resolve_base(target.checkout, base)
    rev = resolve_candidate(target.checkout, candidate, base_sha)
    base_wt = add_worktree(target.checkout, f"base-{base_sha[:12]}", base_sha)
    is_cuda = target.device.startswith("cuda")
    preset = target.workload.preset(target.preset)
    if opts.seeds and len(set(opts.seeds)) < 2:
        raise OptbotError(f"validation needs at least 2 different seeds, got {list(opts.seeds)}")
    run_dir = opts.run_dir or new_run_dir("validate")
    repo = target.checkout.repo
    ident = {"candidate_tree": tree_of(repo, rev.sha), "base_tree": tree_of(repo, base_sha),
             "workload": target.workload.name, "preset": target.preset, "device": target.device, "dtype": target.dtype}
    seeds, weight_seed, resumed = begin(run_dir, ident, opts.seeds, opts.weight_seed, fresh_seeds)
    ctx = Context(target=target, opts=opts, run_dir=run_dir, seeds=seeds, weight_seed=weight_seed,
                  shapes=[preset.shapes, *preset.extra_shapes], is_cuda=is_cuda,
                  warmup=opts.warmup if opts.warmup is not None else (3 if is_cuda else 1),
                  iters=opts.iters if opts.iters is not None else (10 if is_cuda else 5))
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    if resumed:
        ctx.say(f"resuming the validation in {run_dir}: its seeds, and the runner processes it finished")
    if len(ctx.shapes) < 2:
        ctx.notes.append(f"preset {target.preset} declares no extra_shapes: correctness ran on one shape only")
    verdict = _run(ctx, rev, base_sha, base_wt)
    verdict.seconds = time.monotonic() - t0
    verdict.run_dir = str(ctx.run_dir)
    (ctx.run_dir / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=2, default=str))
    return verdict


def _new_verdict(ctx: Context, rev: Revision, status: str, reason: str | None, summary: str, **kw) -> Verdict:
    t = ctx.target
    return Verdict(status=status, reason=reason, summary=summary, workload=t.workload.name, preset=t.preset,
                   device=t.device, dtype=t.dtype, base_sha=rev.base_sha, candidate_sha=rev.sha,
                   candidate=rev.spec, trailers=rev.trailers, notes=ctx.notes, **kw)


def _base_cache(ctx: Context, base_sha: str) -> Path | None:
    """Where the base's correctness outcome for these seeds and weights is shared by the validations
    of one run (Options.cache_dir; shared_seeds draws the run's seeds). Its timings
    are never reused: measure_speed times the base afresh beside each candidate."""
    if ctx.opts.cache_dir is None:
        return None
    key = f"{base_sha[:12]}-{ctx.target.workload.name}-{ctx.target.preset}-{ctx.target.device}-{ctx.target.dtype}-" \
          f"w{ctx.weight_seed}-s{'_'.join(map(str, ctx.seeds))}-{int(ctx.opts.engagement)}"
    if ctx.checks_modes:  # its outputs in each mode are part of the outcome: another set of modes is another base
        key += "-" + "_".join(m.replace("+", "p").replace(":", "-") for m in ctx.modes)
    return Path(ctx.opts.cache_dir) / key / "outcome.json"


# What must match for a shared base outcome to stand for this candidate's base: a run resumed on
# another GPU, driver or software (a device call on another machine) runs its base again.
SAME_MACHINE = ("device_kind", "device_name", "driver", "cuda", "torch", "triton")


def _cached_base(cache: Path | None) -> JobOutcome | None:
    if cache is None or not cache.is_file():
        return None
    d = json.loads(cache.read_text())
    files = [r["file"] for r in d["result"].get("runs", [])] + list((d["result"].get("mode_outputs") or {}).values())
    if not all(Path(f).is_file() for f in files):
        return None
    return JobOutcome(**d)


def _machine_differs(shared: JobOutcome | None, cand: JobOutcome) -> str:
    """Why a shared base outcome cannot stand beside this candidate's process ("" when it can)."""
    if shared is None:
        return ""
    a, b = shared.result.get("env") or {}, cand.result.get("env") or {}
    diff = [f"{k} {a.get(k)} -> {b.get(k)}" for k in SAME_MACHINE if a.get(k) != b.get(k)]
    return ", ".join(diff)


def _write_cache(cache: Path, out: JobOutcome) -> None:
    tmp = cache.with_name(f".{cache.name}.tmp")  # whole or absent: a validation stopped while writing
    tmp.write_text(json.dumps(out.__dict__, default=str))
    tmp.replace(cache)


def _run_base(ctx: Context, base_sha: str, base_wt: Path, cache: Path | None) -> JobOutcome:
    job = ctx.job("validate_step", base_wt, base_sha, "base", ctx.side_params("base"))
    if cache is not None:
        job.out_dir = str(cache.parent)
    ctx.say(f"base {base_sha[:12]}: {len(ctx.shapes)} shapes x {len(ctx.seeds)} seeds, in a runner process")
    out = ctx.run_job(job, Path(job.out_dir), ctx.opts.base_timeout_s, "base", f"base {base_sha[:12]}")
    if not out.ok:
        raise out.error("the BASE engine failed to run, so nothing can be validated: its validate_step job")
    if cache is not None:
        _write_cache(cache, out)
    return out


def _run_reference(ctx: Context, base_sha: str, base_wt: Path, cache: Path | None,
                   cand_out: JobOutcome) -> JobOutcome | None:
    """At a quantized precision, the base at the unquantized one on the same seeds, weights and shapes
    (eager, outputs only): what "no farther from the unquantized model" measures from. None otherwise.
    Shared by the run's validations like the base's outcome (one process a run, not one a candidate)."""
    dtype, recipe = split_precision(ctx.target.dtype)
    if not recipe or ctx.target.workload.bit_exact:
        return None
    ref_cache = cache.parent.with_name(cache.parent.name + f"-{dtype}") / "outcome.json" if cache else None
    cached = _cached_base(ref_cache)
    if cached is not None and not _machine_differs(cached, cand_out):
        ctx.say(f"reference: reusing {ref_cache.parent}")
        return cached
    job = replace(ctx.job("validate_step", base_wt, base_sha, "reference", {"correctness": True, "profile": False,
                                                                              "timing": {}, "flops": False}), dtype=dtype)
    if ref_cache is not None:
        ref_cache.parent.mkdir(parents=True, exist_ok=True)
        job.out_dir = str(ref_cache.parent)
    ctx.say(f"reference: the base at {dtype}, unquantized, for the {recipe} outputs' distance from it")
    out = ctx.run_job(job, Path(job.out_dir), ctx.opts.base_timeout_s, "reference", "reference")
    if not out.ok:
        raise out.error(f"the BASE engine failed to run unquantized ({dtype}), so the {recipe} outputs have no "
                        f"reference: its validate_step job")
    if ref_cache is not None:
        _write_cache(ref_cache, out)
    return out


def _crash_verdict(ctx: Context, rev: Revision, out: JobOutcome, what: str) -> Verdict:
    """The verdict of a candidate job that did not end well: rejected (crashed, timeout), or held when
    its timings contradict the bot's own clock (bot/jobs.clock_check): forged, a person decides."""
    crash = {"job": what, "status": out.status, "returncode": out.returncode, "log": out.log_path,
             "log_tail": out.log_tail[-3000:], "seconds": round(out.seconds, 1)}
    if out.status == "implausible":
        why = f"{what}: {out.problem}"
        return _new_verdict(ctx, rev, "held", "implausible", why + " (held for a person to review)", implausible=why,
                            crash=crash)
    reason = "timeout" if out.status == "timeout" else "crashed"
    if out.status == "failed":
        err = out.result.get("error", {})
        msg = err.get("message", "")
        summary = f"{what} raised {msg[:300]}"
        if "OutOfMemory" in msg or "out of memory" in msg:
            summary = f"{what} ran out of memory: {msg[:300]}"
        tail = (err.get("traceback") or "")[-2000:] or out.log_tail
    else:
        summary = f"{what} {out.reason()}"
        tail = out.log_tail
    v = _new_verdict(ctx, rev, "rejected", reason, summary, crash={**crash, "log_tail": tail[-3000:]})
    if ctx.is_cuda:
        v.health = _health_probe(ctx, rev)
    return v


def _health_probe(ctx: Context, rev: Revision) -> str:
    job = ctx.job("health", rev.worktree, rev.sha, "health", {})
    out = run_job(job, ctx.run_dir / "health", timeout_s=300, name="health")
    if out.ok:
        return "device healthy after the fault"
    return f"DEVICE UNHEALTHY after the fault ({out.reason()}); later jobs on it cannot be trusted"


def _cand_timeout(ctx: Context, base_out: JobOutcome | None) -> float:
    if ctx.opts.timeout_s is not None:
        return ctx.opts.timeout_s
    if base_out is None or ctx.is_cuda:
        # on a GPU the shared base's time says little of a candidate's: its compile cache may be cold
        # where the base's was warm (an FP8 compile of minutes), and a candidate cut there is lost
        return DEFAULT_TIMEOUT_S
    # A candidate may be slower, but not by an order of magnitude: 5x the base's time, at least 2 min.
    return max(120.0, 5.0 * base_out.seconds)


def tamper_lines(repo, base_sha: str, cand_sha: str) -> list[str]:
    """Added lines of the stack's diff that reference optbot's runner, timing or result files."""
    diff = repo.git.diff(base_sha, cand_sha, "--unified=0", "--no-color")
    hits, path = [], ""
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else line[4:]
        elif line.startswith("+") and TAMPER_RE.search(line):
            hits.append(f"{path}: {line[1:].strip()[:160]}")
    return hits


def _run(ctx: Context, rev: Revision, base_sha: str, base_wt: Path) -> Verdict:
    tamper = tamper_lines(ctx.target.checkout.repo, base_sha, rev.sha)
    if tamper:
        why = f"the diff reaches for the validator's own machinery: {tamper[0]}"
        return _new_verdict(ctx, rev, "held", "implausible", why + " (held for a person to review)", implausible=why)
    # The candidate runs FIRST: while it runs, the base's outputs for these fresh seeds and weights
    # exist nowhere (not in its memory, not on disk), so there is no reference to copy. Where the
    # run shares its base's outcome (Options.cache_dir: optimize does) they exist from the run's
    # first validation on, in the run directory the sandbox hides (docs/validate.md, "One base a run").
    cache = _base_cache(ctx, base_sha)
    base_out = _cached_base(cache)
    if base_out is not None:
        ctx.say(f"base: reusing {cache.parent}")
    cand_job = ctx.job("validate_step", rev.worktree, rev.sha, "candidate", ctx.side_params())
    ctx.say(f"candidate {rev.sha[:12]}: {len(ctx.shapes)} shapes x {len(ctx.seeds)} seeds, in its own process")
    cand_out = ctx.run_job(cand_job, Path(cand_job.out_dir), _cand_timeout(ctx, base_out), "candidate",
                           f"candidate {rev.sha[:12]}")
    if not cand_out.ok:
        return _crash_verdict(ctx, rev, cand_out, "candidate step")
    moved = _machine_differs(base_out, cand_out)
    if moved:
        ctx.say(f"base: the shared outcome came from another machine or software ({moved}): running the base again")
        base_out = None
    base_timed_here = base_out is None  # its process timed the base right after the candidate's
    if base_out is None:
        base_out = _run_base(ctx, base_sha, base_wt, cache)
    env = cand_out.result.get("env", {})
    broke = mode_failures(base_out.result, cand_out.result)
    if broke:
        mode, err = broke[0]
        v = _new_verdict(ctx, rev, "rejected", "crashed", f"crashed under {mode}: {err[:300]}", env=env,
                         crash={"job": "candidate step", "status": "mode failed", "mode": mode, "error": err,
                                "log": cand_out.log_path})
        if ctx.is_cuda:
            v.health = _health_probe(ctx, rev)
        return v

    ref_out = _run_reference(ctx, base_sha, base_wt, cache, cand_out)
    corr = check_outputs(ctx, base_out.result, cand_out.result, ref_out.result if ref_out else None)
    if corr.ok and ctx.opts.kernels:
        failed = check_kernels(ctx, rev, corr)
        if failed is not None:
            crash = _crash_verdict(ctx, rev, failed, "kernel check")
            crash.correctness = corr
            return crash
    if not corr.ok:
        return _new_verdict(ctx, rev, "rejected", "correctness", correctness_summary(corr), correctness=corr, env=env)

    eng = (check_engagement(rev, base_out.result.get("profile"), cand_out.result.get("profile"),
                            enabled_modes(base_out.result, cand_out.result))
           if ctx.opts.engagement else None)
    if eng is not None and not eng.ok:
        return _new_verdict(ctx, rev, "rejected", "not-engaged", eng.reason, correctness=corr, engagement=eng, env=env)

    speeds: list[Speed] = []
    held = ""
    if ctx.opts.speed:
        speeds, failed = measure_speed(ctx, rev, base_sha, base_wt, base_out.result, cand_out.result,
                                       base_timed_here=base_timed_here)
        if failed is not None:
            crash = _crash_verdict(ctx, rev, failed, "candidate timing")
            crash.correctness, crash.engagement = corr, eng
            return crash
        held = implausible(speeds, cand_out.result.get("flops"))
    kw = dict(correctness=corr, engagement=eng, speed=speeds, env=env)
    if held:
        return _new_verdict(ctx, rev, "held", "implausible", held + " (held for a person to review)",
                            implausible=held, **kw)
    eager = next((s for s in speeds if s.mode == "eager"), None)
    desc = speed_line(speeds)
    rej = speed_rejection(speeds)
    if rej is not None and (ctx.gates or rej[0] == "crashed"):
        return _new_verdict(ctx, rev, "rejected", rej[0], f"correct and engaged, but {rej[1]}: {desc}", **kw)
    if not ctx.gates and speeds:
        ctx.notes.append(f"speed measured on {eager.device if eager else 'cpu'} is informational and does not gate "
                         f"the verdict; a GPU validation decides speed (DESIGN decision 7)")
    worst = corr.worst()
    summary = "correct" + (f" (worst {worst.output} rel L2 {worst.rel_l2:.2g})" if worst and worst.rel_l2 is not None else "")
    summary += ", engaged" if eng is not None else ""
    summary += f", {desc}" if desc else ""
    return _new_verdict(ctx, rev, "accepted", None, summary, **kw)


def validate_workload(workload: str, candidate: str, *, base: str | None = None, engine: str | None = None,
                      ref: str | None = None, preset: str | None = None, device: str | None = None,
                      **options) -> Verdict:
    """Convenience for callers that hold names rather than a Target (store check, agent tools):
    ``validate_workload("flux2", "x.patch", preset="tiny", device="cpu", speed=False)``."""
    from bot.target import resolve_target

    return validate(resolve_target(workload, engine, ref, preset, device), candidate, base, Options(**options))
