"""The local forge: what a GitHub forge would publish, kept on this machine.

With no GitHub token (or with --dry-run), the optimization branch stays a local branch of the
engine repository, the knowledge branch a local branch of the knowledge repository, and each pull
request's title + body is written to the run directory (forge/engine-pr.md, forge/knowledge-pr.md,
forge/trigger-reply.md). Reactions are recorded in forge/reactions.txt. Nothing leaves the machine.
The dashboard (bot/deliver/dashboard.py) is one file for every run, ``$OPTBOT_RUNS_DIR/dashboard.md``
(each run rewrites its workload's section there), copied into the run directory as dashboard.md.
"""
from __future__ import annotations

import os
from pathlib import Path

from bot.deliver.dashboard import Found
from bot.deliver.pull_request import PullRequestRef
from bot.paths import runs_dir


def dashboard_file() -> Path:
    return runs_dir() / "dashboard.md"


class LocalForge:
    name = "local"

    def __init__(self, run_dir: Path | None, reason: str):
        """``run_dir`` None: no run (`optbot dashboard`), only the dashboard is read or written."""
        self.run_dir = run_dir
        self.dir = run_dir / "forge" if run_dir is not None else None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.reason = reason  # why local (no token, --dry-run)

    def react(self, content: str) -> None:
        with open(self.dir / "reactions.txt", "a") as f:
            f.write(content + "\n")

    def file_url(self, which: str, branch: str, path: str) -> str:
        return f"{path} (branch {branch})"

    def _write(self, name: str, branch: str, title: str, body: str, repo_path: str = "") -> PullRequestRef:
        p = self.dir / name
        p.write_text(f"# {title}\n\nhead branch: `{branch}` (local)\n\n{body}")
        where = f" of {repo_path}" if repo_path else ""  # say which repository got the branch
        return PullRequestRef("local", None, str(p), f"local branch {branch}{where}; PR text in {p} ({self.reason})")

    def publish_engine(self, repo_path: str, branch: str, head_sha: str, base_ref: str | None, title: str,
                       body: str) -> PullRequestRef:
        return self._write("engine-pr.md", branch, title, body, repo_path)

    def publish_knowledge(self, repo_path: str, branch: str, head_sha: str, title: str, body: str,
                          new_after_merge: bool = False) -> PullRequestRef:
        return self._write("knowledge-pr.md", branch, title, body, repo_path)

    def reply(self, body: str, marker: str) -> PullRequestRef:
        p = self.dir / "trigger-reply.md"
        p.write_text(body)
        return PullRequestRef("local", None, str(p), "reply kept locally")

    def dashboard(self) -> Found | None:
        f = dashboard_file()
        # bytes, not text: universal newlines would turn a person's \r\n into \n
        return Found(f.read_bytes().decode(), True, None, str(f)) if f.is_file() else None

    def write_dashboard(self, body: str) -> PullRequestRef:
        f = dashboard_file()
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
        tmp.write_bytes(body.encode())
        tmp.replace(f)  # a reader (or a kill mid-write) never sees half a dashboard
        note = f"dashboard in {f}"
        if self.run_dir is not None:
            (self.run_dir / "dashboard.md").write_bytes(body.encode())
            note += f" (this run's copy: {self.run_dir / 'dashboard.md'})"
        return PullRequestRef("local", None, str(f), note)
