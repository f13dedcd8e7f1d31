"""THE validator (DESIGN decision 6): the CLI, `store check`, the agent's tools and `optimize` all call
``validate(target, candidate)`` and get a typed Verdict (bot/validate/verdict.py). docs/validate.md has the rules.

Order of checks, each in its own runner process with a timeout (bot/jobs.run_job):
  1. candidate side validate_step job in the candidate worktree, FIRST (the reference for these fresh
                    seeds and weights exists nowhere yet): every (shape, seed) under poison, outputs
                    saved; profile histogram; first timed run.
                    crash / fault / OOM -> rejected "crashed"; hang -> "timeout" (log tail kept;
                    after a GPU fault a health probe runs before anything else)
  2. base side      the same job in the base worktree                     (a broken base is an error)
  3. compare        a clean process loads both sides' .pt files: NaN/Inf, rel L2, atol+rtol per
                    element (or bit-exact), inputs unmodified            -> "correctness"
  4. kernels        each kernel the candidate names (trailers) vs its reference, M=1 and odd M
                                                                          -> "correctness"
  5. engagement     declared kernels present / removed ones gone; else the op histogram must differ
                                                                          -> "not-engaged"
  6. speed          process-level interleave cand, base, cand, base (eager, and CUDA graph on GPU);
                    A/A noise from the two base processes (and the two candidate ones)
                    -> "slower" / "no-change" (GPU); on CPU speed is reported, labelled cpu, and
                    does not gate (DESIGN decision 7); > 10x or under the roofline floor -> held.
"""
from __future__ import annotations

import fnmatch

import json
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from bot.validate.resolve import Candidate, resolve_base, resolve_candidate
from bot.engine import add_worktree
from bot.errors import OptbotError, RunnerError
from bot.jobs import JobOutcome, run_job
from bot.paths import REPO_ROOT, new_run_dir
from bot.target import Target
from bot.validate.verdict import Correctness, Engagement, OutputCheck, Speed, Verdict
from runner.job import Job

IMPLAUSIBLE_SPEEDUP = 10.0
# Added lines that reach for the validator's own machinery: held for a person (docs/validate.md).
TAMPER_RE = re.compile(r"(import\s+runner\b|from\s+runner[\s.]|\brunner\.(timing|harness|kinds|poison|job|profiler)\b"
                       r"|sys\.modules\[.runner|time_interleaved|_one_trial|write_result|\.result\.json|\bbot\.jobs\b)")
DEFAULT_TIMEOUT_S = 1800.0  # a candidate job, when no base time is known yet
NOISE_FLOOR_PCT = {"cuda": 0.5, "cpu": 2.0}  # never call a difference smaller than this a change
# A speed verdict that would reject (no-change, slower) inside a noise band wider than this is not
# trusted: another candidate/base pair of timing processes runs (Options.retimes, docs/timing.md).
RETIME_NOISE_PCT = {"cuda": 2.0, "cpu": 10.0}


@dataclass
class Options:
    seeds: list[int] | None = None  # default: 3 fresh random seeds (never 0, never fixed)
    weight_seed: int | None = None  # default: fresh random (same for both sides)
    speed: bool = True  # end-to-end timing (process-level interleave)
    graph: bool | None = None  # CUDA-graph timing too; default: on CUDA
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


def _shape_json(s) -> dict:
    return {"resolution": list(s.resolution), "text_tokens": s.text_tokens, "batch": s.batch}


def _label(shape: dict) -> str:
    r = shape["resolution"]
    return f"{r[0]}x{r[1]}/txt{shape['text_tokens']}/b{shape['batch']}"


@dataclass
class _Ctx:
    target: Target
    opts: Options
    run_dir: Path
    seeds: list[int]
    weight_seed: int
    shapes: list[dict]
    is_cuda: bool
    warmup: int
    iters: int
    notes: list[str] = field(default_factory=list)

    def say(self, msg: str) -> None:
        if self.opts.log:
            self.opts.log(msg)

    def job(self, kind: str, worktree: Path, sha: str, name: str, params: dict, *, seeds=None, shapes=None) -> Job:
        t = self.target
        return Job(kind=kind, workload=t.workload.to_json(), preset=t.preset, device=t.device, dtype=t.dtype,
                   engine_root=t.engine_root(worktree), engine_sha=sha, model_class=t.model_class,
                   shapes=shapes or self.shapes, seeds=seeds or self.seeds, weight_seed=self.weight_seed,
                   warmup=self.warmup, iters=self.iters, out_dir=str(self.run_dir / name), params=params)


def validate(target: Target, candidate: str, base: str | None = None, opts: Options | None = None) -> Verdict:
    """Validate `candidate` (engine commit/branch, or a patch file) against `base` (default: the target's)."""
    opts = opts or Options()
    t0 = time.monotonic()
    base_sha = resolve_base(target.checkout, base)
    cand = resolve_candidate(target.checkout, candidate, base_sha)
    base_wt = add_worktree(target.checkout, f"base-{base_sha[:12]}", base_sha)
    is_cuda = target.device.startswith("cuda")
    preset = target.workload.preset(target.preset)
    seeds = list(opts.seeds) if opts.seeds else fresh_seeds(3)
    if len(set(seeds)) < 2:
        raise OptbotError(f"validation needs at least 2 different seeds, got {seeds}")
    ctx = _Ctx(target=target, opts=opts, run_dir=opts.run_dir or new_run_dir("validate"), seeds=seeds,
               weight_seed=opts.weight_seed if opts.weight_seed is not None else fresh_seeds(1)[0],
               shapes=[_shape_json(s) for s in (preset.shapes, *preset.extra_shapes)], is_cuda=is_cuda,
               warmup=opts.warmup if opts.warmup is not None else (3 if is_cuda else 1),
               iters=opts.iters if opts.iters is not None else (10 if is_cuda else 5))
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    if len(ctx.shapes) < 2:
        ctx.notes.append(f"preset {target.preset} declares no extra_shapes: correctness ran on one shape only")
    verdict = _run(ctx, cand, base_sha, base_wt)
    verdict.seconds = time.monotonic() - t0
    verdict.run_dir = str(ctx.run_dir)
    (ctx.run_dir / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=2, default=str))
    return verdict


def _new_verdict(ctx: _Ctx, cand: Candidate, status: str, reason: str | None, summary: str, **kw) -> Verdict:
    t = ctx.target
    return Verdict(status=status, reason=reason, summary=summary, workload=t.workload.name, preset=t.preset,
                   device=t.device, dtype=t.dtype, base_sha=cand.base_sha, candidate_sha=cand.sha,
                   candidate=cand.spec, trailers=cand.trailers, notes=ctx.notes, **kw)


def _side_params(ctx: _Ctx, side: str = "candidate") -> dict:
    return {"correctness": True, "profile": ctx.opts.engagement,
            "timing": {"eager": ctx.opts.speed, "graph": bool(ctx.opts.speed and (ctx.opts.graph if ctx.opts.graph
                                                                                  is not None else ctx.is_cuda))},
            "flops": bool(ctx.opts.speed and ctx.is_cuda and side == "candidate")}  # the roofline floor


def _base_cache(ctx: _Ctx, base_sha: str) -> Path | None:
    if ctx.opts.cache_dir is None or ctx.opts.speed:
        return None
    key = f"{base_sha[:12]}-{ctx.target.workload.name}-{ctx.target.preset}-{ctx.target.device}-" \
          f"w{ctx.weight_seed}-s{'_'.join(map(str, ctx.seeds))}-{int(ctx.opts.engagement)}"
    return Path(ctx.opts.cache_dir) / key / "outcome.json"


def _cached_base(cache: Path | None) -> JobOutcome | None:
    if cache is None or not cache.is_file():
        return None
    d = json.loads(cache.read_text())
    if not all(Path(r["file"]).is_file() for r in d["result"].get("runs", [])):
        return None
    return JobOutcome(**d)


def _run_base(ctx: _Ctx, base_sha: str, base_wt: Path, cache: Path | None) -> JobOutcome:
    job = ctx.job("validate_step", base_wt, base_sha, "base", _side_params(ctx, "base"))
    if cache is not None:
        job.out_dir = str(cache.parent)
    ctx.say(f"base {base_sha[:12]}: {len(ctx.shapes)} shapes x {len(ctx.seeds)} seeds, in a runner process")
    out = run_job(job, Path(job.out_dir), timeout_s=ctx.opts.base_timeout_s, name="base")
    if not out.ok:
        raise RunnerError(f"the BASE engine failed to run ({out.reason()}), so nothing can be validated; "
                          f"log: {out.log_path}\n{out.log_tail[-1500:]}")
    if cache is not None:
        cache.write_text(json.dumps(out.__dict__, default=str))
    return out


def _crash_verdict(ctx: _Ctx, cand: Candidate, out: JobOutcome, what: str) -> Verdict:
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
    v = _new_verdict(ctx, cand, "rejected", reason, summary,
                     crash={"job": what, "status": out.status, "returncode": out.returncode, "log": out.log_path,
                            "log_tail": tail[-3000:], "seconds": round(out.seconds, 1)})
    if ctx.is_cuda:
        v.health = _health_probe(ctx, cand)
    return v


def _health_probe(ctx: _Ctx, cand: Candidate) -> str:
    job = ctx.job("health", cand.worktree, cand.sha, "health", {})
    out = run_job(job, ctx.run_dir / "health", timeout_s=300, name="health")
    if out.ok:
        return "device healthy after the fault"
    return f"DEVICE UNHEALTHY after the fault ({out.reason()}); later jobs on it cannot be trusted"


def _cand_timeout(ctx: _Ctx, base_out: JobOutcome | None) -> float:
    if ctx.opts.timeout_s is not None:
        return ctx.opts.timeout_s
    if base_out is None:
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


def _run(ctx: _Ctx, cand: Candidate, base_sha: str, base_wt: Path) -> Verdict:
    tamper = tamper_lines(ctx.target.checkout.repo, base_sha, cand.sha)
    if tamper:
        why = f"the diff reaches for the validator's own machinery: {tamper[0]}"
        return _new_verdict(ctx, cand, "held", "implausible", why + " (held for a person to review)", implausible=why)
    # The candidate runs FIRST: while it runs, the base's outputs for these fresh seeds and weights
    # exist nowhere (not in its memory, not on disk), so there is no reference to copy. Only a
    # caller-provided base cache (batch callers, tests) breaks that; docs/validate.md says so.
    cache = _base_cache(ctx, base_sha)
    base_out = _cached_base(cache)
    if base_out is not None:
        ctx.say(f"base: reusing {cache.parent}")
    cand_job = ctx.job("validate_step", cand.worktree, cand.sha, "candidate", _side_params(ctx))
    ctx.say(f"candidate {cand.sha[:12]}: {len(ctx.shapes)} shapes x {len(ctx.seeds)} seeds, in its own process")
    cand_out = run_job(cand_job, Path(cand_job.out_dir), timeout_s=_cand_timeout(ctx, base_out), name="candidate")
    if not cand_out.ok:
        return _crash_verdict(ctx, cand, cand_out, "candidate step")
    if base_out is None:
        base_out = _run_base(ctx, base_sha, base_wt, cache)
    env = cand_out.result.get("env", {})

    corr = _correctness(ctx, base_out.result, cand_out.result)
    if corr.ok and ctx.opts.kernels:
        crash = _kernel_checks(ctx, cand, corr)
        if crash is not None:
            crash.correctness = corr
            return crash
    if not corr.ok:
        return _new_verdict(ctx, cand, "rejected", "correctness", _corr_summary(corr), correctness=corr, env=env)

    eng = _engagement(cand, base_out.result.get("profile"), cand_out.result.get("profile")) if ctx.opts.engagement else None
    if eng is not None and not eng.ok:
        return _new_verdict(ctx, cand, "rejected", "not-engaged", eng.reason, correctness=corr, engagement=eng, env=env)

    speed: list[Speed] = []
    implausible = ""
    if ctx.opts.speed:
        speed, crash = _speed(ctx, cand, base_sha, base_wt, base_out.result, cand_out.result)
        if crash is not None:
            crash.correctness, crash.engagement = corr, eng
            return crash
        implausible = _implausible(speed, cand_out.result.get("flops"))
    gates = ctx.opts.speed_gates if ctx.opts.speed_gates is not None else ctx.is_cuda
    kw = dict(correctness=corr, engagement=eng, speed=speed, env=env)
    if implausible:
        return _new_verdict(ctx, cand, "held", "implausible", implausible + " (held for a person to review)",
                            implausible=implausible, **kw)
    eager = next((s for s in speed if s.mode == "eager"), None)
    desc = _speed_line(speed)
    if gates and eager is not None and eager.outcome in ("slower", "no-change"):
        graph = next((s for s in speed if s.mode == "graph" and s.outcome == "faster"), None)
        if graph is None:
            return _new_verdict(ctx, cand, "rejected", eager.outcome, f"correct and engaged, but {desc}", **kw)
    if not gates and speed:
        ctx.notes.append(f"speed measured on {eager.device if eager else 'cpu'} is informational and does not gate "
                         f"the verdict; a GPU validation decides speed (DESIGN decision 7)")
    worst = corr.worst()
    summary = "correct" + (f" (worst {worst.output} rel L2 {worst.rel_l2:.2g})" if worst and worst.rel_l2 is not None else "")
    summary += ", engaged" if eng is not None else ""
    summary += f", {desc}" if desc else ""
    return _new_verdict(ctx, cand, "accepted", None, summary, **kw)


# ------------------------------------------------------------------------------------------------
# correctness


def _correctness(ctx: _Ctx, base: dict, cand: dict) -> Correctness:
    wl = ctx.target.workload
    tol = wl.tolerance.get(ctx.target.dtype)
    rule = "bit-exact" if wl.bit_exact else (f"rel_l2 <= {tol.rel_l2:g} and |d| <= {tol.atol:g} + {tol.rtol:g}*|ref| "
                                            f"({ctx.target.dtype})")
    corr = Correctness(ok=True, seeds=ctx.seeds, shapes=[_label(s) for s in ctx.shapes], rule=rule)
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
    job = ctx.job("compare", ctx.run_dir, "", "compare", {
        "pairs": pairs, "bit_exact": wl.bit_exact,
        "tolerance": None if wl.bit_exact else {"rel_l2": tol.rel_l2, "atol": tol.atol, "rtol": tol.rtol}})
    job.engine_root = str(REPO_ROOT)  # no engine in the comparing process
    job.model_class = ""
    ctx.say("compare: outputs in a clean process")
    out = run_job(job, ctx.run_dir / "compare", timeout_s=600, name="compare")
    if not out.ok:
        raise RunnerError(f"the compare job failed ({out.reason()}); log {out.log_path}\n{out.log_tail[-1500:]}")
    for c in out.result["checks"]:
        corr.checks.append(OutputCheck(label=c["label"], output=c["output"], ok=c["ok"], reason=c["reason"],
                                       max_abs=c.get("max_abs"), at=c.get("at"), rel_l2=c.get("rel_l2"),
                                       violations=c.get("violations"), nonfinite=c.get("nonfinite")))
    corr.ok = not corr.inputs_modified and all(c.ok for c in corr.checks) and bool(corr.checks)
    return corr


def _corr_summary(corr: Correctness) -> str:
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


def kernel_tests_for(cand: Candidate, kernel_store: Path) -> list[str]:
    """Kernel test modules a candidate names: Optbot-Kernel-Tests paths (in the engine repo) and the
    test_*.py files of its Optbot-Entry entries in `kernel_store`."""
    tests = []
    for rel in cand.trailers.get("Optbot-Kernel-Tests", []):
        p = (cand.worktree / rel).resolve()
        if not str(p).startswith(str(cand.worktree.resolve())) or not p.is_file():
            raise OptbotError(f"trailer Optbot-Kernel-Tests: {rel!r} is not a file inside the candidate's worktree")
        tests.append(str(p))
    for entry in cand.trailers.get("Optbot-Entry", []):
        tests += [str(p) for p in sorted((Path(kernel_store) / entry).glob("test_*.py"))]
    return sorted(set(tests))


def _kernel_checks(ctx: _Ctx, cand: Candidate, corr: Correctness) -> Verdict | None:
    """Fills corr.kernels (and clears corr.ok on a failure); a crashed check comes back as a verdict."""
    from bot.knowledge.location import locate
    tests = kernel_tests_for(cand, ctx.opts.kernel_store or locate().kernel_store)
    if not tests:
        return None
    tolmap = {k: {"atol": v.atol, "rtol": v.rtol} for k, v in ctx.target.workload.tolerance.items()}
    job = ctx.job("kernel_check", cand.worktree, cand.sha, "kernels", {"tests": tests, "tolerance": tolmap})
    ctx.say(f"kernels: {len(tests)} test module(s) vs their references")
    out = run_job(job, ctx.run_dir / "kernels", timeout_s=ctx.opts.timeout_s or 900, name="kernels")
    if not out.ok:
        corr.ok = False
        return _crash_verdict(ctx, cand, out, "kernel check")
    corr.kernels = out.result["tests"]
    if not all(k["ok"] for k in corr.kernels):
        corr.ok = False
    return None


# ------------------------------------------------------------------------------------------------
# engagement


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


def _engagement(cand: Candidate, base_prof: dict | None, cand_prof: dict | None) -> Engagement:
    adds = cand.trailers.get("Optbot-Adds-Kernels", [])
    removes = cand.trailers.get("Optbot-Removes-Kernels", [])
    if not base_prof or not cand_prof:
        return Engagement(ok=False, reason="no profile of the step was taken", declared_adds=adds, declared_removes=removes)
    hb = {tuple(r[:3]): r[3] for r in base_prof["histogram"]}
    hc = {tuple(r[:3]): r[3] for r in cand_prof["histogram"]}
    changed = []
    for k in sorted(set(hb) | set(hc)):
        if hb.get(k, 0) != hc.get(k, 0):
            changed.append(f"{k[0]} @ {k[2] or '(top)'}: {hb.get(k, 0)} -> {hc.get(k, 0)}")
    missing = [a for a in adds if not any(declared_matches(a, k) for k in hc)]
    present = [r for r in removes if any(declared_matches(r, k) for k in hc)]
    e = Engagement(ok=True, reason="", declared_adds=adds, declared_removes=removes, missing=missing,
                   still_present=present, changed_ops=changed[:20])
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
    elif not changed:
        e.ok = False
        e.reason = ("the candidate's op histogram is identical to the base's (same ops, same modules, same counts): "
                    "the change never runs in the step")
    else:
        e.reason = f"{len(changed)} op/module counts differ from the base (e.g. {changed[0]})"
    return e


# ------------------------------------------------------------------------------------------------
# speed


def _median(t) -> float | None:
    return t["median_ms"] if isinstance(t, dict) else None


def _speed(ctx: _Ctx, cand: Candidate, base_sha: str, base_wt: Path, base1: dict, cand1: dict):
    """Candidate and base in alternating processes (cand, base, cand, base): the first two are the
    correctness processes, then one more of each, timing only. When the speed would reject the
    candidate (no-change, slower) but the noise band is wide (RETIME_NOISE_PCT), the measurement is
    not trusted: up to `retimes` more (candidate, base) pairs run, and the outcome is taken over all
    processes, a disturbed one set aside (speed_outcome)."""
    params = {"correctness": False, "timing": _side_params(ctx)["timing"]}
    runs = {"base": [base1], "candidate": [cand1]}
    gates = ctx.opts.speed_gates if ctx.opts.speed_gates is not None else ctx.is_cuda
    retimes = max(0, ctx.opts.retimes if ctx.opts.retimes is not None else (2 if gates else 0))
    dev = "cuda" if ctx.is_cuda else "cpu"
    for round_ in range(retimes + 1):
        suffix = "" if round_ == 0 else f"-{round_ + 1}"
        for side, wt, sha in (("candidate", cand.worktree, cand.sha), ("base", base_wt, base_sha)):
            name = f"{side}-timing{suffix}"
            job = ctx.job("validate_step", wt, sha, name, params, seeds=ctx.seeds[:1], shapes=ctx.shapes[:1])
            ctx.say(f"{side}: timed process {len(runs[side]) + 1}")
            out = run_job(job, Path(job.out_dir), timeout_s=ctx.opts.timeout_s or 1800, name=name)
            if not out.ok:
                if side == "candidate":
                    return [], _crash_verdict(ctx, cand, out, "candidate timing")
                raise RunnerError(f"the base timing job failed ({out.reason()}); log {out.log_path}")
            runs[side].append(out.result)
        speeds = _speeds(ctx, runs, base1.get("passes", 1), dev)
        eager = next((s for s in speeds if s.mode == "eager"), None)
        if (eager is None or eager.outcome not in ("no-change", "slower") or eager.noise_pct is None
                or eager.noise_pct <= RETIME_NOISE_PCT[dev] or round_ == retimes):
            return speeds, None
        ctx.say(f"speed: eager {eager.outcome} inside a {eager.noise_pct:.1f}% noise band: timing another "
                f"candidate/base pair ({round_ + 1} of {retimes})")
    raise AssertionError("unreachable: the last round returns")


def _speeds(ctx: _Ctx, runs: dict, passes: int, dev: str) -> list[Speed]:
    speeds = []
    for mode in ("eager", "graph"):
        bs = [r["timing"].get(mode) for r in runs["base"]]
        cs = [r["timing"].get(mode) for r in runs["candidate"]]
        if all(x is None for x in bs + cs):
            continue
        s = Speed(mode=mode, device=dev, passes=passes, n=ctx.iters)
        fails = [x for x in bs + cs if isinstance(x, str)]
        if fails:
            who = [("base" if i < len(bs) else "candidate", x) for i, x in enumerate(bs + cs) if isinstance(x, str)]
            s.note = "; ".join(sorted({f"{w}: {x[:200]}" for w, x in who}))  # e.g. a capture failure, reported
            s.base_ms = [_median(x) for x in bs if _median(x) is not None]
            s.candidate_ms = [_median(x) for x in cs if _median(x) is not None]
            s.outcome = "n/a"
            speeds.append(s)
            continue
        s.base_ms = [round(_median(x), 4) for x in bs]
        s.candidate_ms = [round(_median(x), 4) for x in cs]
        s.speedup, s.noise_pct, s.outcome, aside = speed_outcome(
            s.base_ms, s.candidate_ms, [_rel_iqr(x) for x in bs], [_rel_iqr(x) for x in cs], dev)
        notes = ([f"farthest from the others, set aside: {', '.join(aside)}"] if aside else []) + (
            ["cpu clock, informational"] if dev == "cpu" else [])
        s.note = "; ".join(notes)
        speeds.append(s)
    return speeds


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


def _speed_line(speed: list[Speed]) -> str:
    parts = []
    for s in speed:
        if s.speedup is None:
            parts.append(f"{s.mode}: {s.note or 'n/a'}")
        else:
            parts.append(f"{s.mode} {s.speedup:.3f}x on {s.device} ({s.outcome}, noise {s.noise_pct:.2f}%)")
    return "; ".join(parts)


def _implausible(speed: list[Speed], flops: dict | None) -> str:
    for s in speed:
        if s.speedup is not None and s.speedup > IMPLAUSIBLE_SPEEDUP:
            return f"{s.mode} speedup {s.speedup:.1f}x is over {IMPLAUSIBLE_SPEEDUP:.0f}x"
        floor = (flops or {}).get("compute_floor_ms")
        if floor and s.candidate_ms and min(s.candidate_ms) < floor:
            return (f"{s.mode} step {min(s.candidate_ms):.3f} ms is under the roofline floor {floor:.3f} ms "
                    f"({(flops['linear'] + flops['attention']) / 1e12:.2f} TFLOP at the measured "
                    f"{flops['peaks']['matmul_tflops']} TFLOP/s)")
    return ""


def validate_workload(workload: str, candidate: str, *, base: str | None = None, engine: str | None = None,
                      ref: str | None = None, preset: str | None = None, device: str | None = None,
                      **options) -> Verdict:
    """Convenience for callers that hold names rather than a Target (store check, agent tools):
    ``validate_workload("flux2", "x.patch", preset="tiny", device="cpu", speed=False)``."""
    from bot.target import resolve_target

    return validate(resolve_target(workload, engine, ref, preset, device), candidate, base, Options(**options))
