"""What a forge published (a pull request, a branch, a reply), and the marker that finds a run's
reply again. The forges (local.py, github.py) and the deliver step share these; the choice of
forge (forge.py) sits above them, so nothing here imports a forge."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PullRequestRef:
    action: str  # opened | updated | closed-by-person | merged | local | none | skipped | failed (the dashboard)
    number: int | None = None
    url: str = ""
    note: str = ""


def marker(run_id: str) -> str:
    """The hidden line that finds this run's reply on the triggering PR again (no second reply)."""
    return f"<!-- optbot-run: {run_id} -->"
