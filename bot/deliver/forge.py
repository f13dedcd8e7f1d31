"""Where a run's results are published: the forge, GitHub through PyGithub or the local forge.
What a forge published is bot/deliver/pull_request.py (the forges import it, not this module)."""
from __future__ import annotations

import os


def github_token() -> str | None:
    return os.environ.get("OPTBOT_GITHUB_TOKEN") or os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")


def make_forge(options, run_id: str, run_dir, log=print):
    """GitHub when a token is set and the run is not --dry-run; else the local forge, saying why."""
    from bot.deliver.local import LocalForge

    if options.dry_run:
        return LocalForge(run_dir, "--dry-run: no pushes, no pull requests")
    token = github_token()
    if not token:
        return LocalForge(run_dir, "no GitHub token (OPTBOT_GITHUB_TOKEN / GITHUB_TOKEN) is set")
    from bot.deliver.github import GitHubForge
    return GitHubForge(token, options, run_id, log=log)
