"""Step 6, validate: every candidate through THE validator (bot/validate/), in parallel over the
run's GPUs, each side in its own runner process. Run state keeps each Verdict itself.

A candidate whose entry has a recorded GPU verdict that applies unchanged (generate's `known`) gets
that verdict back, labelled where it came from (Verdict.reused_from); a resumed run takes the
verdicts it reached before the stop from their checkpoints (bot/run/resume.py).

A tuned variant goes before its entry's plain replay (the same patch but for the kernel's config
defaults): when the variant is accepted, the replay is not validated at all (`Result.superseded`),
since combine would drop it for the variant anyway (combine._prefer_tuned); when the variant is
rejected, the replay is validated as usual. On the H100 of 2026-12-07 a Qwen-Image validation on
the full preset was ~200 GPU-s; three replays with variants are a tenth of that run.
"""
from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bot.generate.candidate import Candidate
from bot.knowledge.known import KnownVerdict
from bot.lanes import map_on_lanes
from bot.run.context import RunContext
from bot.run.resume import load_checkpoint, save_checkpoint
from bot.trailers import parse_trailer_lists
from bot.validate.verdict import Correctness, OutputCheck, Speed, Verdict


@dataclass
class Result:
    status: str
    reason: str
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # candidate id -> its verdict
    # replay id -> its tuned variant's id, accepted: the replay was not validated (its variant stands for it)
    superseded: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        return self.reason


def run(ctx: RunContext) -> Result:
    gen = ctx.results.generate
    cands = gen.candidates if gen else []
    if not cands:
        return Result("skipped", "no candidates to validate")
    verdicts, superseded = validate_candidates(ctx, cands)
    n_ok = sum(v.accepted for v in verdicts.values())
    skipped = f"; {len(superseded)} replay(s) not validated, their tuned variants accepted" if superseded else ""
    return Result("done", f"{n_ok} of {len(verdicts)} accepted{skipped}", verdicts, superseded)


def tuned_variants(cands: list[Candidate]) -> dict[str, Candidate]:
    """Replay id -> the variant-search candidate of the same store entry, among `cands`."""
    tuned = {c.trailers.get("Optbot-Entry"): c for c in cands if c.generator == "variant-search"}
    return {c.id: tuned[c.trailers.get("Optbot-Entry")] for c in cands
            if c.generator == "replay" and c.trailers.get("Optbot-Entry") in tuned}


def validate_candidates(ctx: RunContext, cands: list[Candidate]) -> tuple[dict[str, Verdict], dict[str, str]]:
    """(candidate id -> its verdict, replay id -> the accepted variant that superseded it). Each
    measured verdict is checkpointed as soon as it is reached. Replays with a tuned variant among
    `cands` wait for the variants' verdicts and are validated only where the variant was not
    accepted. The step runs it over all the run's candidates; a fan-out shard over its own
    (bot/run/fanout.py)."""
    gen = ctx.results.generate
    t = ctx.target
    gpus = max(1, ctx.options.gpus)
    devices = [f"cuda:{i}" for i in range(gpus)] if ctx.on_cuda and gpus > 1 else [t.device]

    variant_of = tuned_variants(cands)
    progress = _Progress(len(cands), len(devices), undecided=len(variant_of))

    def one(c: Candidate, device: str) -> Verdict:
        known = gen.known.get(c.id)
        if known is not None and known.status == "accepted":
            progress.settle()
            return reused_verdict(ctx, c, known)
        done = load_checkpoint(ctx.run_dir, c.id, c.commit_sha)
        if done is not None:  # a resumed run (or merged shards): this candidate's verdict was reached before
            progress.settle()
            return done
        if ctx.budget.exhausted():
            return dataclasses.replace(_blank(ctx, c), summary="wall-time budget spent before this candidate was "
                                                               "validated")
        ctx.check_pause(f"validating {c.id}")  # the lanes' validations in flight finish and are kept
        ctx.log(progress.starting(c.id))
        t0 = time.monotonic()
        v = verdict_of(ctx, c.commit_sha, c.id, device)
        save_checkpoint(ctx.run_dir, c.id, c.commit_sha, v)
        ctx.log(progress.finished(c.id, v, time.monotonic() - t0))
        return v

    first = [c for c in cands if c.id not in variant_of]
    verdicts = dict(zip((c.id for c in first), map_on_lanes(one, first, devices)))
    superseded = {cid: v.id for cid, v in variant_of.items() if verdicts[v.id].accepted}
    progress.settle(len(superseded), undecided=0)
    then = [c for c in cands if c.id in variant_of and c.id not in superseded]
    verdicts.update(zip((c.id for c in then), map_on_lanes(one, then, devices)))
    if superseded:
        ctx.log("not validated, their tuned variants accepted: "
                + ", ".join(f"{cid} (by {vid})" for cid, vid in superseded.items()))
    return {c.id: verdicts[c.id] for c in cands if c.id in verdicts}, superseded


class _Progress:
    """The validate step's progress lines for people: which candidate is measured, how many of the
    step's candidates are settled, and, once one was measured, about how long the rest takes at
    this run's pace (a superseded replay is counted when it is decided: it is never measured)."""

    def __init__(self, total: int, lanes: int, undecided: int = 0):
        self.total, self.lanes, self.settled, self.took = total, lanes, 0, []
        self.undecided = undecided  # replays waiting on their tuned variants' verdicts
        self._lock = threading.Lock()

    def settle(self, n: int = 1, undecided: int | None = None) -> None:
        """`n` candidates settled without a measurement (reused, checkpointed, superseded)."""
        with self._lock:
            self.settled += n
            if undecided is not None:
                self.undecided = undecided

    def starting(self, cid: str) -> str:
        with self._lock:
            return f"validating {cid} ({self.settled + 1} of {self.total})"

    def finished(self, cid: str, v: Verdict, seconds: float) -> str:
        with self._lock:
            self.settled += 1
            self.took.append(seconds)
            left = self.total - self.settled
            eta = (f"; about {statistics.mean(self.took) * left / self.lanes / 60:.0f} min for the {left} left at "
                   f"this pace" + (" (fewer if tuned variants are accepted)" if self.undecided else "")
                   if left else "")
            return f"{cid}: {v.status}{f' ({v.reason})' if v.reason else ''} in {seconds:.0f} s{eta}"


def verdict_of(ctx: RunContext, ref: str, cid: str, device: str, speed: bool = True) -> Verdict:
    """THE validator on `ref` against the run's base, on `device`; `speed=False`: correctness and
    engagement only (on CUDA in every production mode: combine's stack checks)."""
    from bot.validate import Options

    t = ctx.target
    if device != t.device:
        t = dataclasses.replace(t, device=device)
    # One set of fresh seeds per run, and the base's correctness outcome (its outputs in every mode,
    # its profile) made once for them and shared by every candidate of the run, the stack's included:
    # one base correctness process a run, not one a candidate (and at a quantized precision one
    # unquantized reference). The sandbox hides it from every candidate process (bot/sandbox.py), and
    # each candidate is still timed against base processes run beside it (speed.measure_speed).
    seeds, weight_seed = run_seeds(ctx.run_dir)
    kw = dict(seeds=seeds, weight_seed=weight_seed, cache_dir=ctx.run_dir / "validate" / "base-cache", speed=speed)
    if not device.startswith("cuda"):
        # DESIGN decision 7: on CPU a candidate gets a correctness (and engagement) verdict only,
        # "speed needs a GPU". The candidate's timeout is explicit: the adaptive one (5x the cached
        # base job) is too short for a stack whose Triton kernels all run in the interpreter.
        kw.update(speed=False, timeout_s=900)
    # an Optbot-Entry's kernel tests come from the run's knowledge (bot/knowledge/location.py)
    opts = Options(run_dir=ctx.run_dir / "validate" / cid, log=ctx.log, kernel_store=ctx.knowledge().kernel_store,
                   **kw)
    return ctx.validate(t, ref, t.checkout.base_sha, opts)


def run_seeds(run_dir: Path) -> tuple[list[int], int]:
    """The run's seeds, drawn once and kept in the run directory (a resumed run reuses them, so its
    shared base outcome stays valid; a fan-out plan draws them, so that every shard and the stack use
    the same)."""
    from bot.validate import shared_seeds

    return shared_seeds(run_dir / "validate")


def _blank(ctx: RunContext, c: Candidate) -> Verdict:
    t = ctx.target
    return Verdict(status="held", reason=None, summary="", workload=t.workload.name, preset=t.preset, device=t.device,
                   dtype=t.dtype, base_sha=t.checkout.base_sha, candidate_sha=c.commit_sha, candidate=c.id,
                   trailers=parse_trailer_lists(c.description))


def reused_verdict(ctx: RunContext, c: Candidate, known: KnownVerdict) -> Verdict:
    """A candidate's verdict taken from the store (bot/knowledge/known.py): the recorded numbers,
    labelled with where they came from. Nothing is re-measured or recomputed here."""
    w = known.numbers
    speed = [Speed(mode=mode, device=sp.get("device") or "cuda", base_ms=list(sp.get("base_process_ms") or []),
                   candidate_ms=list(sp.get("patched_process_ms") or []), speedup=sp.get("speedup"),
                   noise_pct=sp.get("noise_pct"), outcome=sp.get("outcome") or "n/a", note=sp.get("note") or "",
                   base_mode=sp.get("base_mode") or "",
                   n=int(sp.get("trials_per_process") or 0), passes=int(sp.get("passes") or 1))
             for mode, sp in (w.get("speed") or {}).items()]
    worst = w.get("worst_output") or {}
    checks = [OutputCheck(label=worst.get("label") or "", output=worst.get("output") or "", ok=True,
                          reason="the recorded verdict's worst output", max_abs=worst.get("max_abs"),
                          rel_l2=worst.get("rel_l2"))] if worst else []
    recorded = f"store verdict of {known.entry_id} recorded {known.recorded_at or '?'} by `{known.command or '?'}`"
    return dataclasses.replace(
        _blank(ctx, c), status=known.status, reason=known.reason, speed=speed, env=w.get("env") or {},
        summary=f"reused: {known.summary or w.get('summary', '')} ({recorded}; same patch, base, workload, preset, "
                f"dtype, hardware, torch and triton)",
        correctness=Correctness(ok=True, seeds=list(w.get("seeds") or []), shapes=list(w.get("shapes") or []),
                                rule=w.get("rule") or "", checks=checks),
        reused_from=recorded)
