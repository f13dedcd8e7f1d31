"""The local forge: what a GitHub forge would publish, kept on this machine.

With no GitHub token (or with --dry-run), the optimization branch stays a local branch of the
engine repository, the knowledge branch a local branch of the knowledge repository, and each pull
request's title + body is written to the run directory (forge/engine-pr.md, forge/knowledge-pr.md,
forge/trigger-reply.md). Reactions are recorded in forge/reactions.txt. Nothing leaves the machine.
"""
from __future__ import annotations

from pathlib import Path

from bot.deliver.pull_request import PullRequestRef


class LocalForge:
    name = "local"

    def __init__(self, run_dir: Path, reason: str):
        self.dir = run_dir / "forge"
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
