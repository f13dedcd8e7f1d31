"""Scratch git repositories for tests: a folder of files as one base commit on `main`, with a
committer identity and fixed dates, so every test that needs an engine or knowledge repository
makes it the same way."""
from __future__ import annotations

from pathlib import Path

import git

FIXED_DATE = "2001-01-01T00:00:00Z"


def init_repo(path: Path, files: dict[str, str]) -> git.Repo:
    path.mkdir(parents=True)
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "test")
        cw.set_value("user", "email", "test@localhost")
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    repo.git.add("-A")
    repo.git.commit("-qm", "base", env={"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE})
    return repo
