"""The one Candidate: what every generator (store replay, variant search, agent, compile region) hands
to validation, and what the run state keeps for each candidate. A candidate IS an engine commit in
its own worktree (DESIGN decision 5); its metadata lives in git trailers of the commit message so
reviewers see it and the engine tree stays clean.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

# Trailer keys, in the order they are written (DESIGN decision 5).
TRAILER_KEYS = ("Optbot-Opportunity", "Optbot-Kind", "Optbot-Adds-Kernels", "Optbot-Removes-Kernels", "Optbot-Entry")
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9-]*")


@dataclass
class Candidate:
    id: str  # unique within a run, e.g. "replay-<entry>-<opportunity>"
    opportunity_id: str  # Opportunity.id it acts on ("" when none, e.g. store check)
    kind: str  # opportunity kind from the vocabulary (merge-siblings, fuse-norm-consumer, ...)
    generator: str  # replay | variant-search | agent | compile-region
    worktree: str  # absolute path of the candidate's engine worktree
    commit_sha: str  # the candidate commit (on top of the base sha)
    base_sha: str = ""
    entry_id: str = ""  # kernel_store entry it came from / became ("" when none)
    adds_kernels: list[str] = field(default_factory=list)
    removes_kernels: list[str] = field(default_factory=list)
    trailers: dict[str, str] = field(default_factory=dict)
    title: str = ""
    description: str = ""  # the whole commit message (the report and the stack's commits quote it)
    estimated_gain_ms: float | None = None  # the profile's estimate (analyze): the opportunity's, or the sum of the places a candidate fixes

    def to_json(self) -> dict:
        return asdict(self)



def make_trailers(opportunity_id: str, kind: str, adds: list[str], removes: list[str], entry_id: str = "", *,
                  generator: str = "", run_id: str = "", kernel_tests: list[str] = ()) -> dict[str, str]:
    """The five DESIGN trailers, plus the kernel tests the validator's kernel check runs
    (Optbot-Kernel-Tests: paths in the engine repository), who generated the candidate
    (Optbot-Generator) in which run (Optbot-Run), when given."""
    trailers = {
        "Optbot-Opportunity": opportunity_id or "none",
        "Optbot-Kind": kind,
        "Optbot-Adds-Kernels": ", ".join(adds) or "none",
        "Optbot-Removes-Kernels": ", ".join(removes) or "none",
        "Optbot-Entry": entry_id or "none",
    }
    if kernel_tests:
        trailers["Optbot-Kernel-Tests"] = ", ".join(kernel_tests)
    if generator:
        trailers["Optbot-Generator"] = generator
    if run_id:
        trailers["Optbot-Run"] = run_id
    return trailers


def commit_message(title: str, body: str, trailers: dict[str, str]) -> str:
    """Title, blank line, body, blank line, trailers (git interpret-trailers format): the one writer of
    Optbot-* trailers. A value is folded onto one line, so it cannot end the trailer block early."""
    lines = [title.strip(), ""]
    if body.strip():
        lines += [body.strip(), ""]
    for k, v in trailers.items():
        if not _KEY.fullmatch(k):
            raise ValueError(f"bad trailer key {k!r}")
        lines.append(f"{k}: {' '.join(str(v).split())}")
    return "\n".join(lines) + "\n"
