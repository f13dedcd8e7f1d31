"""What every step of a run is given: the run's options, its budget, the typed results of the steps
before it, and the measuring pieces (the validator and the ablation) a step calls.

Steps import this module only, never the orchestrator or the state file, so a step is a plain
function of its context: ``run(ctx) -> Result`` (bot/steps/).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from bot.knowledge.location import Knowledge
    from bot.knowledge.recall import RunKey
    from bot.run.state import Results
    from bot.target import Target

GENERATORS = ("replay", "template", "variants", "compile-region", "agent")
# what runs without --generators
DEFAULT_GENERATORS = GENERATORS  # all of them; each says in the notes why it did nothing (no GPU, no key)


@dataclass
class Budget:
    wall_s: float | None = None
    cost_usd: float | None = None
    started: float = field(default_factory=time.time)

    def remaining_s(self) -> float | None:
        return None if self.wall_s is None else self.wall_s - (time.time() - self.started)

    def exhausted(self) -> bool:
        r = self.remaining_s()
        return r is not None and r <= 0


@dataclass
class RunOptions:
    """The options of `optbot optimize`, kept in state.json so a resumed run has the same ones."""
    workload: str
    engine: str | None = None
    ref: str | None = None
    preset: str | None = None
    device: str | None = None
    quant: str | None = None  # a quantization recipe: the run's precision is DTYPE+RECIPE (runner/job.py)
    gpus: int = 1
    budget_wall_s: float | None = None
    budget_cost_usd: float | None = None
    dry_run: bool = False
    repo: str | None = None  # GitHub OWNER/NAME of the engine (and of the triggering PR)
    trigger_pr: int | None = None
    trigger_comment: int | None = None
    knowledge_repo: str | None = None  # GitHub OWNER/NAME of the bot's repository
    knowledge_path: str | None = None  # local git repository holding kernel_store/ and lessons/
    engine_remote: str | None = None
    knowledge_remote: str | None = None
    github_api_url: str | None = None
    iters: int | None = None
    command: str = ""
    generators: tuple[str, ...] = DEFAULT_GENERATORS
    revalidate: bool = False  # ignore the store's recorded GPU verdicts: validate every candidate
    ablation_rounds: int = 2  # leave-one-out rounds of the stack on a GPU; 0 = no ablation


class Paused(BaseException):
    """Raised at a safe point once the attempt's --pause-after time has passed: before a step, before
    a candidate's validation, before the stack's validation or its ablation. Everything reached so
    far is kept (step records, verdict checkpoints), so `--resume` continues without redoing it.
    A BaseException, so that no step's error handling takes it for a failure."""

    def __init__(self, before: str):
        super().__init__(before)
        self.before = before


def _validate(target, ref, base, opts):
    from bot.validate import validate
    return validate(target, ref, base, opts)


def _ablate(target, head, base, **kw):
    from bot.validate.ablate import ablate
    return ablate(target, head, base, **kw)


@dataclass
class RunContext:
    run_id: str
    run_dir: Path
    options: RunOptions
    budget: Budget
    results: "Results"  # the typed results of the steps done so far (bot/run/state.py)
    log: Callable[[str], None] = print
    forge: Any = None
    pause_at: float | None = None  # time.time() after which the attempt stops at its next safe point
    steps_done: list = field(default_factory=list)  # the StepRecords so far (the report lists them)
    # the measuring pieces: THE validator and the ablation (bot/validate/). Tests of orchestration
    # and delivery hand in doubles here; every real run uses these.
    validate: Callable = _validate
    ablate: Callable = _ablate
    _target: "Target | None" = None

    @property
    def target(self) -> "Target":
        """Resolved once per process; on resume the base sha recorded by checkout pins the ref, and
        candidate commits missing from this machine's engine repository come from the run's bundle."""
        if self._target is None:
            from bot.run.resume import fetch_candidates
            from bot.target import resolve_target

            o, co = self.options, self.results.checkout
            self._target = resolve_target(o.workload, o.engine, co.base_sha if co else o.ref,
                                          co.preset if co else o.preset, co.device if co else o.device, o.quant)
            fetch_candidates(self._target.checkout, self.run_dir, self.run_id, self.results)
        return self._target

    def check_pause(self, before: str) -> None:
        """Stop here (raise Paused) when the attempt's --pause-after time has passed: `before` names
        the work that would start next. Work in flight is never interrupted."""
        if self.pause_at is not None and time.time() >= self.pause_at:
            raise Paused(before)

    def jobs_dir(self) -> Path:
        d = self.run_dir / "jobs"
        d.mkdir(parents=True, exist_ok=True)
        return d

    @property
    def on_cuda(self) -> bool:
        return self.target.device.startswith("cuda")

    def iters(self) -> int:
        return self.options.iters or (20 if self.on_cuda else 5)

    @property
    def reuses_base(self) -> bool:
        """Whether an earlier run's profile and analysis of this very base may stand in for new
        ones (bot/run/base_cache.py): on a GPU, without --revalidate."""
        return self.on_cuda and not self.options.revalidate

    def base_key(self) -> str | None:
        """The base cache's key for this run (after baseline: it holds the machine's environment),
        or None where the base is always profiled and captured afresh."""
        if not self.reuses_base or not self.env():
            return None
        from bot.run.base_cache import key_of
        return key_of(self.target, self.env(), self.profile_iters())

    def profile_iters(self) -> int:
        return max(3, self.iters() // 2)

    def env(self) -> dict:
        """The baseline's environment (device name, torch, triton): what recorded results must match."""
        b = self.results.baseline
        return b.env if b else {}

    def hardware(self) -> str:
        from bot.hardware import hardware_name
        return hardware_name(self.target.device, self.env().get("device_name", ""))

    def knowledge(self) -> "Knowledge":
        """Where the run's knowledge is (bot/knowledge/location.py): the path the optimize command
        recorded in the options, so a resumed run uses the same one."""
        from bot.knowledge.location import knowledge_of
        return knowledge_of(self.options)

    def run_key(self) -> "RunKey":
        """What recorded GPU results must match to apply to this run (bot/knowledge/recall.py)."""
        from bot.knowledge.recall import RunKey
        t = self.target
        return RunKey(self.knowledge().kernel_store, t.workload.name, self.hardware(), t.checkout.base_sha, t.preset, t.dtype,
                      self.on_cuda, self.options.revalidate, self.env())
