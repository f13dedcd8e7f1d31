"""The knowledge side of delivery: kernel_store/ + lessons/ changes (and the latency chart) as one
commit on a branch of the knowledge repository, made without touching its working tree or index.

Which repository that is, is bot/knowledge/location.py's decision (Knowledge.repo). The branch is
``optbot/knowledge/<workload>/<base-sha12>``, rebuilt from the repository's HEAD on every run, so
a re-run or a resumed run force-updates the same branch instead of adding a second one.
"""
from __future__ import annotations

import tempfile
from io import BytesIO
from pathlib import Path

import git
from gitdb.base import IStream


def commit_files_to_branch(repo: git.Repo, branch: str, files: dict[str, bytes | None], message: str,
                           date: str) -> str:
    """One commit = HEAD's tree + ``files`` (path -> content; None removes the path), on ``branch``;
    returns its sha."""
    parent = repo.head.commit.hexsha
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"),
               "GIT_AUTHOR_NAME": "optbot", "GIT_AUTHOR_EMAIL": "optbot@localhost", "GIT_AUTHOR_DATE": date,
               "GIT_COMMITTER_NAME": "optbot", "GIT_COMMITTER_EMAIL": "optbot@localhost", "GIT_COMMITTER_DATE": date}
        repo.git.read_tree(parent, env=env)
        for path, data in sorted(files.items()):
            if data is None:
                repo.git.update_index("--force-remove", path, env=env)
                continue
            blob = repo.odb.store(IStream("blob", len(data), BytesIO(data))).hexsha.decode()
            repo.git.update_index("--add", "--cacheinfo", f"100644,{blob},{path}", env=env)
        tree = repo.git.write_tree(env=env)
        msg_file = Path(tmp) / "msg"
        msg_file.write_text(message)
        sha = repo.git.commit_tree(tree, "-p", parent, "-F", str(msg_file), env=env).strip()
    repo.git.update_ref(f"refs/heads/{branch}", sha)
    return sha
