"""Where optbot keeps its data.

OPTBOT_HOME (default: $XDG_CACHE_HOME/optbot, else ~/.cache/optbot) holds materialized engine
repositories, their worktrees and downloaded source distributions. Run directories live under
.optbot/runs/ in the current directory (override with OPTBOT_RUNS_DIR) because they belong to the
project being optimized, not to the machine.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def optbot_home() -> Path:
    if os.environ.get("OPTBOT_HOME"):
        return Path(os.environ["OPTBOT_HOME"]).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser().resolve() / "optbot"


def runs_dir() -> Path:
    return Path(os.environ.get("OPTBOT_RUNS_DIR", ".optbot/runs")).resolve()


def new_run_dir(kind: str) -> Path:
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{kind}-" + uuid.uuid4().hex[:6]
    d = runs_dir() / run_id
    d.mkdir(parents=True, exist_ok=False)
    return d
