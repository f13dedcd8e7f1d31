"""The GitHub forge, through PyGithub: push branches, open or update pull requests, reply, react.

Idempotent by construction, so a re-run or a resumed run never makes duplicates:
- a pull request is found by its head branch (``GET /repos/O/R/pulls?state=all&head=O:BRANCH``);
  an open one is updated (title, body), a missing one is opened, and one that a person closed is
  left closed: the bot says so in the summary and the reply instead of reopening it (a long-lived
  branch, `new_after_merge`, gets a new pull request once its last one was merged);
- the reply on the triggering PR carries a marker ``<!-- optbot-run: RUN_ID -->``; a comment with
  the marker is edited instead of a second one being posted, but only a comment the bot wrote: its
  author's login must be the token's own user (``GET /user``, asked once per forge, or
  $OPTBOT_GITHUB_LOGIN). Anyone can paste the marker into a comment; the bot never edits that one.
  A token that may not read ``GET /user`` (403/404: an installation token such as GitHub Actions'
  GITHUB_TOKEN) and no $OPTBOT_GITHUB_LOGIN: every reply is posted, none edited;
- the dashboard issue (bot/deliver/dashboard.py) is the bot's own issue carrying its marker: found by
  ``GET /repos/O/R/issues?state=all&creator=LOGIN`` and the marker, never an issue someone else
  opened with the marker; opened when there is none (``POST /repos/O/R/issues``), edited
  (``PATCH /repos/O/R/issues/N``) while open, left alone once a person closed it. A token that may
  not read its login (and no $OPTBOT_GITHUB_LOGIN) cannot tell, so it neither reads nor writes it;
- reactions are idempotent on GitHub's side (the same reaction by the same user is returned, not
  added again).

Rate limits and server errors: a 403/429 whose headers say rate limit (Retry-After,
X-RateLimit-Remaining: 0) or whose message says so, and a 500/502/503/504, are retried with backoff
(Retry-After, else until X-RateLimit-Reset, else 2^n s, capped by $OPTBOT_GITHUB_MAX_WAIT, default
300 s), at most 6 attempts; then one OptbotError names the operation, the last status and the
attempts. PyGithub's own retry is switched off so this one policy applies. A write answered 5xx
may still have landed: retrying an edit repeats it, but a retried create can meet a 422 (the PR
exists: a resume finds it by branch) or post a second reply. No HTTP answer at all (refused,
unresolvable, timed out) is one OptbotError naming the API URL, not a requests traceback, and is
not retried. GitHub Enterprise: base_url (``--github-api-url`` or
$OPTBOT_GITHUB_API_URL), e.g. https://ghe.example.com/api/v3.

Branches are pushed with gitpython to the engine remote (``--engine-remote``, $OPTBOT_ENGINE_REMOTE,
else the engine repository's ``origin``) and the knowledge remote likewise.
"""
from __future__ import annotations

import os
import time
from http import HTTPStatus
from typing import Any, Callable

import git
import requests
from github import Auth, Github, GithubException

from bot.errors import OptbotError
from bot.deliver.dashboard import MARKER, TITLE, Found
from bot.deliver.pull_request import PullRequestRef

DEFAULT_API = "https://api.github.com"
ATTEMPTS = 6
TIMEOUT_S = 30
SERVER_ERRORS = (500, 502, 503, 504)  # GitHub's transient failures; 501/505 would not heal on retry


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


def retry_wait(e: GithubException, attempt: int, now: float | None = None) -> float | None:
    """Seconds to wait before retrying ``e`` (a rate limit or a server error), or None: not retried."""
    if e.status in SERVER_ERRORS:
        try:
            return max(0.0, float(_header(e.headers, "Retry-After") or 2 ** attempt))
        except ValueError:
            return float(2 ** attempt)
    return rate_limit_wait(e, attempt, now)


def _refused(e: BaseException) -> bool:
    """Whether a requests error comes down to ECONNREFUSED (urllib3 nests it a few levels deep)."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, ConnectionRefusedError):
            return True
        todo += [y for y in (x.__cause__, x.__context__, getattr(x, "reason", None), *x.args)
                 if isinstance(y, BaseException)]
    return False


def _message(e: GithubException) -> str:
    data = e.data
    text = " ".join(str(data.get("message", "") if isinstance(data, dict) else data or "").split())[:200]
    if not text:  # a proxy's HTML 502 carries no message
        try:
            text = HTTPStatus(e.status).phrase
        except ValueError:
            pass
    return text  # one line, whatever the server sent


class GitHubError(OptbotError):
    """A GitHub call that failed for good; ``status`` is the HTTP status, None without an answer."""

    def __init__(self, message: str, status: int | None):
        super().__init__(message)
        self.status = status


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
        self.base_url = base_url.rstrip("/")
        delay = float(os.environ.get("OPTBOT_GITHUB_WRITE_DELAY", "1.0"))
        self.gh = Github(auth=Auth.Token(token), base_url=self.base_url, retry=None,
                         seconds_between_requests=min(delay, 0.25), seconds_between_writes=delay,
                         timeout=TIMEOUT_S)
        if not options.repo:
            raise OptbotError("a GitHub token is set but --repo OWNER/NAME (the engine's GitHub repository) is not; "
                              "give --repo, or unset the token / pass --dry-run for a local run")
        self.max_wait = float(os.environ.get("OPTBOT_GITHUB_MAX_WAIT", "300"))
        self._repos: dict[str, Any] = {}
        self._login: str | None = os.environ.get("OPTBOT_GITHUB_LOGIN") or None
        self._login_known = self._login is not None
        self._dash, self._dash_known = None, False

    # ---------------------------------------------------------------- plumbing
    def call(self, what: str, fn: Callable, *a, **kw):
        for attempt in range(ATTEMPTS):
            try:
                return fn(*a, **kw)
            except GithubException as e:
                wait = retry_wait(e, attempt)
                if wait is None or attempt == ATTEMPTS - 1:
                    tried = f" (after {ATTEMPTS} attempts)" if wait is not None else ""
                    raise GitHubError(f"GitHub: {what} failed: {e.status} {_message(e)}".rstrip() + tried,
                                      e.status) from None
                wait = min(wait, self.max_wait)
                why = "server error" if e.status in SERVER_ERRORS else "rate limit"
                self.log(f"GitHub {why} ({e.status}) on {what}: waiting {wait:.0f} s (attempt {attempt + 1})")
                self.retries.append(wait)
                self.sleep(wait)
            except requests.exceptions.RequestException as e:  # no HTTP answer at all: not retried
                if _refused(e):
                    why = f"connection refused by {self.base_url}"
                elif isinstance(e, requests.exceptions.Timeout):
                    why = f"no answer from {self.base_url} within {TIMEOUT_S} s"
                else:
                    why = f"cannot reach {self.base_url} ({type(e).__name__})"
                raise GitHubError(f"GitHub: {what} failed: {why} (--github-api-url / $OPTBOT_GITHUB_API_URL)",
                                  None) from None

    def login(self) -> str | None:
        """The login the token acts as, asked once; None when the token may not read it."""
        if not self._login_known:
            try:
                self._login = self.call("get the authenticated user", lambda: self.gh.get_user().login)
            except GitHubError as e:
                if e.status not in (403, 404):
                    raise
                self.log(f"{e}: replies are posted, never edited (set $OPTBOT_GITHUB_LOGIN to the bot's login)")
            self._login_known = True
        return self._login

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
                 base: str | None, title: str, body: str, new_after_merge: bool = False) -> PullRequestRef:
        gh_repo = self.repo(repo_name)
        pr = self._find_pr(gh_repo, branch)
        if pr is not None and pr.state != "open" and new_after_merge and bool(getattr(pr, "merged", False)):
            pr = None  # a long-lived branch (the review lessons'): its merged PR is history, a new one is opened
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

    def publish_knowledge(self, repo_path: str, branch: str, head_sha: str, title: str, body: str,
                          new_after_merge: bool = False) -> PullRequestRef:
        name = self.options.knowledge_repo or os.environ.get("OPTBOT_KNOWLEDGE_REPO")
        if not name:
            return PullRequestRef("skipped", note="no --knowledge-repo OWNER/NAME: knowledge branch kept locally")
        remote = self.options.knowledge_remote or os.environ.get("OPTBOT_KNOWLEDGE_REMOTE")
        return self._publish(name, repo_path, remote, branch, head_sha, None, title, body, new_after_merge)

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
        me = self.login()  # anyone can copy the marker: only the bot's own comment is its reply
        existing = [] if me is None else [
            c for c in self.call("list comments", lambda: list(issue.get_comments()))
            if marker in (c.body or "") and c.user is not None and c.user.login == me]
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

    # ---------------------------------------------------------------- the dashboard issue (issue 15)
    def _dashboard_issue(self):
        """The bot's own issue carrying MARKER (the lowest-numbered open one, else the last closed),
        or None; looked up once per forge."""
        if self._dash_known:
            return self._dash
        me = self.login()
        if me is None:
            raise OptbotError("dashboard: the token may not read its own login (GET /user), so the bot cannot tell "
                              "its dashboard issue from one anyone opened with the marker; set $OPTBOT_GITHUB_LOGIN "
                              "to the bot's login")
        gh_repo = self.repo(self.options.repo)

        def mine():  # the list holds pull requests too; the marker alone proves nothing (anyone can paste it)
            return [i for i in gh_repo.get_issues(state="all", creator=me)
                    if i.user is not None and i.user.login == me and MARKER in (i.body or "")
                    and i.pull_request is None]

        found = self.call(f"list issues of {gh_repo.full_name}", mine)
        open_ = sorted((i for i in found if i.state == "open"), key=lambda i: i.number)
        self._dash = open_[0] if open_ else (max(found, key=lambda i: i.number) if found else None)
        self._dash_known = True
        return self._dash

    def dashboard(self) -> Found | None:
        i = self._dashboard_issue()
        return None if i is None else Found(i.body or "", i.state == "open", i.number, i.html_url)

    def write_dashboard(self, body: str) -> PullRequestRef:
        i = self._dashboard_issue()
        if i is not None and i.state != "open":
            return PullRequestRef("closed-by-person", i.number, i.html_url,
                                  f"dashboard issue #{i.number} was closed by a person; the bot does not reopen it")
        if i is not None:
            self.call(f"edit dashboard issue #{i.number}", i.edit, body=body)
            return PullRequestRef("updated", i.number, i.html_url, f"updated dashboard issue #{i.number}")
        gh_repo = self.repo(self.options.repo)
        i = self.call("open the dashboard issue", gh_repo.create_issue, title=TITLE, body=body)
        self._dash = i
        return PullRequestRef("opened", i.number, i.html_url, f"opened dashboard issue #{i.number}")
