"""What a generator is: given the run's inputs, it returns candidates plus notes.

A candidate is an engine commit in its own worktree, with Optbot-* trailers (DESIGN decision 5),
described by the one ``Candidate`` (bot/generate/candidate.py) and committed through
bot/generate/commits.py. A note is one line for the run's log and report: why a generator made
nothing, what it skipped, what it spent. Nothing a generator makes is judged here: every candidate
goes to THE validator (bot.validate) afterwards.

The four generators and their entry points today (each takes only the inputs it needs):

  replay          bot.generate.replay.replay(checkout, opportunities, engine, hardware, workload, store_root)
                  -> [ReplayResult]: each matching kernel_store entry applied as a commit (.candidate),
                  or a recorded conflict (a note)
  variant-search  bot.generate.variants.search_entry(entry_dir, device=, run_dir=, gpus=, checkout=, ...)
                  -> VariantResult: the fastest config of a replayed entry as a commit (.candidate), or
                  .commit_note saying why none was made (always on CPU: speed needs a GPU)
  compile-region  bot.generate.compile_region.generate(checkout, base_sha, profile, model_class,
                  import_root, run_id, opportunity=) -> Candidate | None (None: no hot repeated region)
  agent           bot.generate.agent.parallel.generate(task, cfg) -> AgentGeneration: the strongest
                  agent's candidate (.best.candidate), per-agent stops and spend (notes)

``Generator`` is the shape they share and ``GeneratorOutput`` the result they could return. The
generate step of `optimize` (bot/optimize/stages.py) still calls the entry points above directly and
collects candidates and notes from each; no generator implements the protocol yet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bot.generate.candidate import Candidate
from bot.target import Target


@dataclass
class GenerateInputs:
    """The run's inputs a generator may read."""
    target: Target  # workload, engine checkout (its base sha), model class, preset, device, dtype
    run_id: str
    run_dir: Path
    opportunities: list[dict] = field(default_factory=list)  # ranked, from bot/analyze
    profile: dict | None = None  # the base profile (kernels with their modules)
    hardware: str = "cpu"  # cpu | h200 | ... (bot/hardware.hardware_name)
    store_dir: Path | None = None  # kernel_store/ of the run's knowledge
    lessons_dir: Path | None = None  # lessons/ of the run's knowledge


@dataclass
class GeneratorOutput:
    candidates: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Generator(Protocol):
    """A generator: candidates plus notes from the run's inputs."""
    name: str  # replay | variant-search | compile-region | agent (the Optbot-Generator family)

    def __call__(self, inputs: GenerateInputs) -> GeneratorOutput: ...
