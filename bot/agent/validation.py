"""The agent's one way into validation: ``check_candidate`` (the single adapter).

DESIGN decision 6 says the CLI, the agent's tools, `store check` and `optimize` all go through one
validator. Until the validator (branch `validate`, bot/validate) is wired here, this module uses a
clearly labelled FALLBACK built on the runner's `step` job (bot/jobs.run_job):
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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _base: dict | None = field(default=None, repr=False)
    _by_tree: dict = field(default_factory=dict, repr=False)  # tree sha -> JobOutcome of its correctness run

    @classmethod
    def from_target(cls, target, base_worktree: Path, work_dir: Path, **kw) -> "ValidationContext":
        return cls(workload=target.workload.to_json(), preset=target.preset, device=target.device, dtype=target.dtype,
                   model_class=target.model_class, import_root=target.checkout.import_root,
                   base_worktree=Path(base_worktree), base_sha=target.checkout.base_sha, work_dir=Path(work_dir), **kw)

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

    mode: "correctness", "speed" or "full" (correctness, then speed when correct).
    LEAD: when bot/validate lands, call it here (one call) and map its Verdict to Check.
    """
    try:
        from bot import validate as _validator  # noqa: F401  (branch `validate`)
    except ImportError:
        _validator = None
    if _validator is not None and hasattr(_validator, "check_for_agent"):
        return _validator.check_for_agent(ctx, worktree, sha, mode)  # the validator's own adapter, if it offers one
    return _fallback(ctx, Path(worktree), sha, mode)


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
