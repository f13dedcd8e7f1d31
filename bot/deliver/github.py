"""The GitHub forge, through PyGithub: push branches, open or update pull requests, reply, react.

Idempotent by construction, so a re-run or a resumed run never makes duplicates:
- a pull request is found by its head branch (``GET /repos/O/R/pulls?state=all&head=O:BRANCH``);
  an open one is updated (title, body), a missing one is opened, and one that a person closed is
  left closed: the bot says so in the summary and the reply instead of reopening it;
- the reply on the triggering PR carries a marker ``<!-- optbot-run: RUN_ID -->``; a comment with
  the marker is edited instead of a second one being posted;
- reactions are idempotent on GitHub's side (the same reaction by the same user is returned, not
  added again).

Rate limits: a 403/429 whose headers say rate limit (Retry-After, X-RateLimit-Remaining: 0) or whose
message says so is retried with backoff (Retry-After, else until X-RateLimit-Reset, else 2^n s,
capped by $OPTBOT_GITHUB_MAX_WAIT, default 300 s), at most 6 attempts. PyGithub's own retry is
switched off so this one policy applies. GitHub Enterprise: base_url (``--github-api-url`` or
$OPTBOT_GITHUB_API_URL), e.g. https://ghe.example.com/api/v3.

Branches are pushed with gitpython to the engine remote (``--engine-remote``, $OPTBOT_ENGINE_REMOTE,
else the engine repository's ``origin``) and the knowledge remote likewise.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import git
from github import Auth, Github, GithubException

from bot.errors import OptbotError
from bot.deliver.pull_request import PullRequestRef

DEFAULT_API = "https://api.github.com"


def _header(headers: dict | None, name: str) -> str | None:
    for k, v in (headers or {}).items():
        if k.lower() == name.lower():
            return v
    return None


def rate_limit_wait(e: GithubException, attempt: int, now: float | None = None) -> float | None:
    """Seconds to wait before retrying, or None when ``e`` is not a rate limit."""
    if e.status not in (403, 429):
        return None
    h = e.headers or {}
    msg = str((e.data or {}).get("message", "") if isinstance(e.data, dict) else "").lower()
    retry_after = _header(h, "Retry-After")
    remaining = _header(h, "X-RateLimit-Remaining")
    reset = _header(h, "X-RateLimit-Reset")
    if retry_after is None and remaining != "0" and "rate limit" not in msg and e.status != 429:
        return None  # a plain 403 (permissions): not ours to retry
    if retry_after is not None:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            pass
    if remaining == "0" and reset:
        try:
            return max(0.0, float(reset) - (now or time.time())) + 1.0
        except ValueError:
            pass
    return float(2 ** attempt)


class GitHubForge:
    name = "github"

    def __init__(self, token: str, options, run_id: str, log: Callable[[str], None] = print,
                 sleep: Callable[[float], None] = time.sleep):
        self.options = options
        self.run_id = run_id
        self.log = log
        self.sleep = sleep
        self.retries: list[float] = []  # waits taken, for the record
        base_url = options.github_api_url or os.environ.get("OPTBOT_GITHUB_API_URL") or DEFAULT_API
        delay = float(os.environ.get("OPTBOT_GITHUB_WRITE_DELAY", "1.0"))
        self.gh = Github(auth=Auth.Token(token), base_url=base_url.rstrip("/"), retry=None,
                         seconds_between_requests=min(delay, 0.25), seconds_between_writes=delay, timeout=30)
        if not options.repo:
            raise OptbotError("a GitHub token is set but --repo OWNER/NAME (the engine's GitHub repository) is not; "
                              "give --repo, or unset the token / pass --dry-run for a local run")
        self.max_wait = float(os.environ.get("OPTBOT_GITHUB_MAX_WAIT", "300"))
        self._repos: dict[str, Any] = {}

    # ---------------------------------------------------------------- plumbing
    def call(self, what: str, fn: Callable, *a, **kw):
        for attempt in range(6):
            try:
                return fn(*a, **kw)
            except GithubException as e:
                wait = rate_limit_wait(e, attempt)
                if wait is None or attempt == 5:
                    raise OptbotError(f"GitHub: {what} failed: {e.status} "
                                      f"{(e.data or {}).get('message', '') if isinstance(e.data, dict) else e.data}") from None
                wait = min(wait, self.max_wait)
                self.log(f"GitHub rate limit on {what}: waiting {wait:.0f} s (attempt {attempt + 1})")
                self.retries.append(wait)
                self.sleep(wait)

    def repo(self, full_name: str):
        if full_name not in self._repos:
            self._repos[full_name] = self.call(f"get repo {full_name}", self.gh.get_repo, full_name)
        return self._repos[full_name]

    def file_url(self, which: str, branch: str, path: str) -> str:
        name = self.options.knowledge_repo if which == "knowledge" else self.options.repo
        return f"{self.repo(name).html_url}/blob/{branch}/{path}"

    def _push(self, repo_path: str, remote: str | None, branch: str, sha: str) -> str:
        repo = git.Repo(repo_path)
        if not remote:
            try:
                remote = repo.remotes.origin.url
            except AttributeError:
                raise OptbotError(f"{repo_path}: no remote to push {branch} to; give --engine-remote/--knowledge-remote "
                                  f"or add an 'origin' remote") from None
        try:
            repo.git.push("--force", remote, f"{sha}:refs/heads/{branch}")
        except git.GitCommandError as e:
            raise OptbotError(f"cannot push {branch} to {remote}: {e.stderr.strip()[-300:]}") from None
        return remote

    def _find_pr(self, gh_repo, branch: str):
        owner = gh_repo.full_name.split("/")[0]
        pulls = self.call(f"list pulls of {gh_repo.full_name}",
                          lambda: list(gh_repo.get_pulls(state="all", head=f"{owner}:{branch}")))
        pulls = [p for p in pulls if p.head.ref == branch]
        if not pulls:
            return None
        open_ = [p for p in pulls if p.state == "open"]
        return open_[0] if open_ else sorted(pulls, key=lambda p: p.number)[-1]

    def _publish(self, repo_name: str, repo_path: str, remote: str | None, branch: str, head_sha: str,
                 base: str | None, title: str, body: str) -> PullRequestRef:
        gh_repo = self.repo(repo_name)
        pr = self._find_pr(gh_repo, branch)
        if pr is not None and pr.state != "open":
            merged = bool(getattr(pr, "merged", False))
            what = "merged" if merged else "closed by a person"
            return PullRequestRef("merged" if merged else "closed-by-person", pr.number, pr.html_url,
                                  f"PR #{pr.number} was {what}; the bot does not reopen it and did not push {branch}")
        self._push(repo_path, remote, branch, head_sha)
        if pr is not None:
            self.call(f"edit PR #{pr.number}", pr.edit, title=title, body=body)
            return PullRequestRef("updated", pr.number, pr.html_url, f"updated PR #{pr.number}")
        base = base or gh_repo.default_branch
        pr = self.call(f"open PR for {branch}", gh_repo.create_pull, title=title, body=body, head=branch, base=base)
        return PullRequestRef("opened", pr.number, pr.html_url, f"opened PR #{pr.number}")

    # ---------------------------------------------------------------- the forge interface
    def publish_engine(self, repo_path: str, branch: str, head_sha: str, base_ref: str | None, title: str,
                       body: str) -> PullRequestRef:
        remote = self.options.engine_remote or os.environ.get("OPTBOT_ENGINE_REMOTE")
        return self._publish(self.options.repo, repo_path, remote, branch, head_sha, base_ref, title, body)

    def publish_knowledge(self, repo_path: str, branch: str, head_sha: str, title: str, body: str) -> PullRequestRef:
        name = self.options.knowledge_repo or os.environ.get("OPTBOT_KNOWLEDGE_REPO")
        if not name:
            return PullRequestRef("skipped", note="no --knowledge-repo OWNER/NAME: knowledge branch kept locally")
        remote = self.options.knowledge_remote or os.environ.get("OPTBOT_KNOWLEDGE_REMOTE")
        return self._publish(name, repo_path, remote, branch, head_sha, None, title, body)

    def _trigger_issue(self):
        if not self.options.trigger_pr:
            return None
        gh_repo = self.repo(self.options.repo)
        return self.call(f"get PR #{self.options.trigger_pr}", gh_repo.get_issue, self.options.trigger_pr)

    def reply(self, body: str, marker: str) -> PullRequestRef:
        issue = self._trigger_issue()
        if issue is None:
            return PullRequestRef("none", note="no triggering PR (--trigger-pr)")
        body = f"{body}\n\n{marker}\n"
        existing = [c for c in self.call("list comments", lambda: list(issue.get_comments())) if marker in (c.body or "")]
        if existing:
            self.call("edit reply", existing[0].edit, body)
            return PullRequestRef("updated", issue.number, existing[0].html_url, "reply updated")
        c = self.call("post reply", issue.create_comment, body)
        return PullRequestRef("opened", issue.number, c.html_url, "replied")

    def react(self, content: str) -> None:
        if not (self.options.trigger_comment and self.options.repo):
            return
        issue = self._trigger_issue()
        if issue is None:
            return  # the comment is looked up through its PR (--trigger-pr)
        comment = self.call("get trigger comment", issue.get_comment, self.options.trigger_comment)
        self.call(f"react {content}", comment.create_reaction, content)
