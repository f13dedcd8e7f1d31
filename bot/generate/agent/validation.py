"""The agent's one way into validation: ``check_candidate`` (the single adapter).

DESIGN decision 6 says the CLI, the agent's tools, `store check` and `optimize` all go through one
validator. When bot/validate/validator.py (branch `validate`: ``validate(target, candidate, base, opts) ->
Verdict``) is importable and the context carries the Target, that validator is called and its Verdict
mapped to a Check (``_via_validator``). Otherwise this module uses a clearly labelled FALLBACK built
on the runner's `step` job (bot/jobs.run_job):
- correctness: the base and the candidate run the same shapes (the preset's shape and its extra
  shapes) and seeds in separate runner processes; their output digests must be equal and finite.
  That is a bit-exact rule, stricter than the workload's tolerance, because the bot process cannot
  load tensors (no torch in bot/). A candidate that only reorders floating-point work fails it.
- speed: the step job's own timing (runner/timing.time_fn) of base and candidate, each in its own
  process, so NOT interleaved; reported with the device that measured it, never used to accept.
Every Check says which of the two produced it (`by`).
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bot.jobs import run_job
from runner.job import Job

FALLBACK = "fallback: runner step job, bit-exact output digests (the validator is not wired yet)"
VALIDATOR = "validator (bot/validate/validator.py)"
_validator_lock = threading.Lock()  # the validator adds shared base worktrees: one validation at a time


@dataclass
class Check:
    status: str  # accepted | rejected | held | error
    reason: str
    numbers: dict = field(default_factory=dict)
    device: str = ""
    by: str = FALLBACK
    mode: str = "correctness"  # correctness | speed | full

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    def score(self) -> tuple:
        """Ordering for 'the strongest candidate': accepted, then held, then the rest; then speedup."""
        rank = {"accepted": 2, "held": 1}.get(self.status, 0)
        return (rank, float(self.numbers.get("speedup") or 0.0))

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class ValidationContext:
    """What a validation needs to know about the target (built from bot/target.Target)."""
    workload: dict  # Workload.to_json()
    preset: str
    device: str
    dtype: str
    model_class: str
    import_root: str  # inside the engine repository, e.g. "src"
    base_worktree: Path
    base_sha: str
    work_dir: Path
    seeds: tuple[int, ...] = (101, 202, 303)
    timeout_s: float = 900.0
    target: object = None  # bot.target.Target: when set and bot/validate/validator.py exists, the real validator runs
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _base: dict | None = field(default=None, repr=False)
    _by_tree: dict = field(default_factory=dict, repr=False)  # tree sha -> JobOutcome of its correctness run
    _checks: dict = field(default_factory=dict, repr=False)  # (tree sha, mode) -> Check

    @classmethod
    def from_target(cls, target, base_worktree: Path, work_dir: Path, **kw) -> "ValidationContext":
        return cls(workload=target.workload.to_json(), preset=target.preset, device=target.device, dtype=target.dtype,
                   model_class=target.model_class, import_root=target.checkout.import_root,
                   base_worktree=Path(base_worktree), base_sha=target.checkout.base_sha, work_dir=Path(work_dir),
                   target=target, **kw)

    def shapes(self) -> list[dict]:
        pr = self.workload["presets"][self.preset]
        return [_shape(pr["shapes"]), *(_shape(s) for s in pr.get("extra_shapes") or [])]

    def job(self, worktree: Path, sha: str, out_dir: Path, iters: int) -> Job:
        return Job(kind="step", workload=self.workload, preset=self.preset, device=self.device, dtype=self.dtype,
                   engine_root=str((Path(worktree) / self.import_root).resolve()), engine_sha=sha,
                   model_class=self.model_class, shapes=self.shapes() if iters == 0 else self.shapes()[:1],
                   seeds=list(self.seeds) if iters == 0 else [self.seeds[0]], weight_seed=0,
                   warmup=1 if iters else 0, iters=iters, out_dir=str(out_dir), save_outputs=False)


def _shape(s: dict) -> dict:
    return {"resolution": list(s["resolution"]), "text_tokens": s["text_tokens"], "batch": s["batch"]}


def check_candidate(ctx: ValidationContext, worktree: Path, sha: str, mode: str = "correctness") -> Check:
    """THE adapter: validate commit `sha` (checked out in `worktree`) against the base.

    mode: "correctness", "speed" or "full" (correctness, then speed when correct). Results are kept
    per (tree, mode) for the run: a snapshot and the final commit of the same files share one verdict.
    """
    key = (_tree(worktree, sha), mode)
    with ctx._lock:
        hit = ctx._checks.get(key)
    if hit is not None:
        # the numbers' "commit" stays the commit that was validated (same files as `sha`)
        return Check(**{**hit.to_json(), "numbers": {**hit.numbers, "reused_for": sha}})
    validator = _validator_api() if ctx.target is not None else None
    chk = _via_validator(validator, ctx, sha, mode) if validator else _fallback(ctx, Path(worktree), sha, mode)
    chk.numbers.setdefault("commit", sha)
    with ctx._lock:
        ctx._checks[key] = chk
    return chk


def _validator_api():
    try:
        import bot.validate as v  # branch `validate`
    except ImportError:
        return None
    # Only the validator of this same checkout: its runner job kinds live in this checkout's runner/
    # (an editable install can resolve bot.validate to another tree whose runner differs).
    from bot.paths import REPO_ROOT
    if not Path(v.__file__).resolve().is_relative_to(REPO_ROOT):
        return None
    return v if hasattr(v, "validate") and hasattr(v, "Options") else None


def _via_validator(v, ctx: ValidationContext, sha: str, mode: str) -> Check:
    from bot.errors import OptbotError

    opts = v.Options(speed=mode != "correctness", run_dir=ctx.work_dir / "validation" / f"{mode}-{sha[:12]}",
                     cache_dir=ctx.work_dir / "validation" / "base-cache")
    try:
        with _validator_lock:
            verdict = v.validate(ctx.target, sha, base=ctx.base_sha, opts=opts)
    except OptbotError as e:
        return Check("error", f"validator error: {e}", device=ctx.device, by=VALIDATOR, mode=mode)
    return check_from_verdict(verdict, mode)


def check_from_verdict(verdict, mode: str = "full") -> Check:
    """A bot/verdict.Verdict as the agent's Check (reason first, then the validator's summary)."""
    numbers: dict = {"candidate_sha": verdict.candidate_sha, "run_dir": verdict.run_dir}
    c = verdict.correctness
    if c is not None:
        worst = c.worst()
        numbers.update({"seeds": c.seeds, "shapes": c.shapes, "rule": c.rule,
                        "failures": [f"{ch.label}: {ch.reason}" for ch in c.checks if not ch.ok] + list(c.inputs_modified)})
        if worst is not None:
            numbers.update({"worst_rel_l2": worst.rel_l2, "worst_max_abs": worst.max_abs})
    if verdict.engagement is not None:
        numbers["engagement"] = verdict.engagement.reason
    for sp in verdict.speed:
        suffix = "" if sp.mode == "eager" else f"_{sp.mode}"
        numbers[f"speedup{suffix}"] = sp.speedup
        numbers[f"speed_outcome{suffix}"] = f"{sp.outcome} ({sp.device})"
        numbers[f"noise_pct{suffix}"] = sp.noise_pct
    if verdict.implausible:
        numbers["implausible"] = verdict.implausible
    reason = (f"{verdict.reason.replace('-', ' ')}: " if verdict.reason else "") + verdict.summary
    return Check(verdict.status, reason, numbers, verdict.device, VALIDATOR, mode)


# ----------------------------------------------------------------------------------------------
# fallback (runner step job)


def _run(ctx: ValidationContext, worktree: Path, sha: str, name: str, iters: int):
    d = ctx.work_dir / "validation" / name
    return run_job(ctx.job(worktree, sha, d, iters), d, timeout_s=ctx.timeout_s, name="step")


def _tree(worktree: Path, sha: str) -> str:
    import git
    return git.Repo(worktree).commit(sha).tree.hexsha


def _run_cached(ctx: ValidationContext, worktree: Path, sha: str, name: str, iters: int):
    """Correctness runs keyed by the commit's tree: the same files give the same outputs, so a snapshot
    and the final commit of the same edits share one run. Timing runs are never reused."""
    if iters:
        return _run(ctx, worktree, sha, name, iters)
    key = _tree(worktree, sha)
    with ctx._lock:
        hit = ctx._by_tree.get(key)
    if hit is None:
        hit = _run(ctx, worktree, sha, name, iters)
        with ctx._lock:
            ctx._by_tree[key] = hit
    return hit


def _base_outputs(ctx: ValidationContext):
    with ctx._lock:  # agents in threads share one base run
        if ctx._base is None:
            out = _run(ctx, ctx.base_worktree, ctx.base_sha, f"base-{ctx.base_sha[:12]}", 0)
            ctx._base = {"outcome": out}
        return ctx._base["outcome"]


def _digests(result: dict) -> dict[tuple, dict]:
    out = {}
    for rec in result.get("outputs", []):
        s = rec["shape"]
        key = (f"{s['resolution'][0]}x{s['resolution'][1]}/txt{s['text_tokens']}/b{s['batch']}", rec["seed"])
        out[key] = rec["tensors"]
    return out


def _fallback(ctx: ValidationContext, worktree: Path, sha: str, mode: str) -> Check:
    if mode in ("correctness", "full"):
        chk = _fallback_correctness(ctx, worktree, sha)
        if mode == "correctness" or not chk.accepted:
            return chk
        speed = _fallback_speed(ctx, worktree, sha)
        chk.numbers.update(speed.numbers)
        chk.mode = "full"
        chk.reason += "; " + speed.reason
        return chk
    return _fallback_speed(ctx, worktree, sha)


def _fallback_correctness(ctx: ValidationContext, worktree: Path, sha: str) -> Check:
    base = _base_outputs(ctx)
    if not base.ok:
        return Check("error", f"the base engine itself failed: {base.reason()}", device=ctx.device)
    cand = _run_cached(ctx, worktree, sha, f"cand-{sha[:12]}", 0)
    if cand.status == "timeout":
        return Check("rejected", f"timeout: {cand.reason()}", {"log_tail": cand.log_tail[-800:]}, ctx.device)
    if not cand.ok:
        return Check("rejected", f"crashed: {cand.reason()}", {"log_tail": cand.log_tail[-1500:]}, ctx.device)
    b, c = _digests(base.result), _digests(cand.result)
    compared, failures = 0, []
    for key, tensors in b.items():
        ct = c.get(key)
        if ct is None:
            failures.append(f"no output for shape {key[0]} seed {key[1]}")
            continue
        for name, t in tensors.items():
            compared += 1
            got = ct.get(name)
            if got is None:
                failures.append(f"output {name!r} missing at shape {key[0]} seed {key[1]}")
            elif not got["finite"]:
                failures.append(f"output {name!r} has NaN/Inf at shape {key[0]} seed {key[1]}")
            elif got["shape"] != t["shape"] or got["dtype"] != t["dtype"]:
                failures.append(f"output {name!r} is {got['dtype']}{got['shape']}, base {t['dtype']}{t['shape']} "
                                f"(shape {key[0]} seed {key[1]})")
            elif got["digest"] != t["digest"]:
                failures.append(f"output {name!r} differs from the base at shape {key[0]} seed {key[1]} "
                                f"(digest {got['digest']} vs {t['digest']}; bit-exact rule)")
    numbers = {"outputs_compared": compared, "shapes": sorted({k[0] for k in b}), "seeds": list(ctx.seeds),
               "rule": "bit-exact digests", "failures": failures[:20]}
    if failures:
        return Check("rejected", f"correctness: {failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""),
                     numbers, ctx.device)
    return Check("accepted", f"correct: {compared} outputs bit-identical to the base over {len(numbers['shapes'])} "
                 f"shapes x {len(ctx.seeds)} seeds", numbers, ctx.device)


def _fallback_speed(ctx: ValidationContext, worktree: Path, sha: str) -> Check:
    iters = 10 if ctx.device.startswith("cuda") else 3
    base = _run(ctx, ctx.base_worktree, ctx.base_sha, f"base-time-{ctx.base_sha[:12]}", iters)
    cand = _run(ctx, worktree, sha, f"cand-time-{sha[:12]}", iters)
    if not (base.ok and cand.ok):
        bad = base if not base.ok else cand
        return Check("rejected" if bad is cand else "error", f"timing run failed: {bad.reason()}", device=ctx.device, mode="speed")
    bl, cl = base.result["latency"], cand.result["latency"]
    dev = bl["device"]
    speedup = bl["median_ms"] / cl["median_ms"] if cl["median_ms"] > 0 else 0.0
    numbers = {"base_ms": bl["median_ms"], "candidate_ms": cl["median_ms"], "speedup": round(speedup, 4),
               "base_stdev_ms": bl["stdev_ms"], "candidate_stdev_ms": cl["stdev_ms"], "n": cl["n"],
               "timing_device": dev, "interleaved": False}
    return Check("measured", f"per-step {cl['median_ms']:.3f} ms vs base {bl['median_ms']:.3f} ms "
                 f"(x{speedup:.3f}, measured on {dev}, separate processes, not interleaved)", numbers, ctx.device, mode="speed")
