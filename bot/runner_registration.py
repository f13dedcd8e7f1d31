"""Short-lived tokens for registering (and removing) a self-hosted GitHub Actions runner.

An ephemeral runner registers anew before every job (runner/setup/register.sh). The token that
config.sh takes is asked of GitHub's REST API at each start:
  POST /repos/{owner}/{repo}/actions/runners/registration-token   (repository runners)
  POST /orgs/{org}/actions/runners/registration-token              (organization runners)
  .../remove-token                                                 (deregistering an idle runner)
201 with ``{"token": ..., "expires_at": ...}`` (valid one hour). The operator's own token, which
may administer the repository or organization, is read from a file only root may read
(/etc/optbot-runner/github-token), never from an environment a job inherits.

PyGithub has the organization's call (Organization.create_self_hosted_runner_registration_token)
but not the repository's, so both go through its requester: one code path, PyGithub's auth,
base URL (GitHub Enterprise) and error type.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import requests
from github import Auth, Github, GithubException

from bot.deliver.github import DEFAULT_API, TIMEOUT_S
from bot.errors import OptbotError

PURPOSES = ("registration", "remove")


@dataclass(frozen=True)
class RunnerScope:
    """Where a runner registers: config.sh's --url, and the API path that hands out its tokens."""
    url: str  # https://github.com/team/sglang or https://github.com/team
    kind: str  # "repository" | "organization"
    name: str  # team/sglang | team

    def api_path(self, purpose: str) -> str:
        base = f"/repos/{self.name}" if self.kind == "repository" else f"/orgs/{self.name}"
        return f"{base}/actions/runners/{purpose}-token"

    def needs(self) -> str:
        """The permission the operator's token must hold, in GitHub's words."""
        if self.kind == "repository":
            return ("admin rights on it: a fine-grained token with the repository permission \"Administration\" "
                    "(read and write), or a classic token with the `repo` scope from a repository admin")
        return ("admin rights on it: a fine-grained token with the organization permission \"Self-hosted runners\" "
                "(read and write), or a classic token with the `admin:org` scope from an organization owner")


@dataclass(frozen=True)
class RunnerToken:
    token: str
    expires_at: str  # ISO 8601, as GitHub sent it


_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def parse_scope(url: str) -> RunnerScope:
    """config.sh's --url: https://HOST/OWNER/REPO (a repository's runner) or https://HOST/ORG."""
    u = urlparse(url.strip())
    parts = [p for p in u.path.split("/") if p]
    if u.scheme != "https" or not u.netloc or len(parts) not in (1, 2) or not all(_NAME.match(p) for p in parts):
        raise OptbotError(f"runner URL {url!r}: expected https://github.com/OWNER/REPO (a repository's runners) "
                          f"or https://github.com/ORG (an organization's)")
    kind = "repository" if len(parts) == 2 else "organization"
    return RunnerScope(f"https://{u.netloc}/{'/'.join(parts)}", kind, "/".join(parts))


def read_operator_token(path: Path) -> str:
    """The operator's token from a file that only its owner, root or the caller, can read."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as e:
        raise OptbotError(f"{path}: cannot read the operator's GitHub token ({e.strerror}); "
                          f"write it there as root with mode 0600 (runner/setup/README.md)") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise OptbotError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read the GitHub token; "
                          f"chmod 600 {path}")
    if st.st_uid not in (0, os.geteuid()):
        raise OptbotError(f"{path}: owned by uid {st.st_uid}, neither root nor this user; chown root {path}")
    token = text.strip()
    if not token or any(c.isspace() for c in token):
        raise OptbotError(f"{path}: expected one GitHub token on one line")
    return token


def fetch_token(scope: RunnerScope, operator_token: str, api_url: str | None = None,
                purpose: str = "registration") -> RunnerToken:
    """Ask GitHub for a runner token of `purpose` (registration | remove) for `scope`."""
    if purpose not in PURPOSES:
        raise ValueError(purpose)
    base = (api_url or DEFAULT_API).rstrip("/")
    gh = Github(auth=Auth.Token(operator_token), base_url=base, retry=None, timeout=TIMEOUT_S)
    what = f"a runner {purpose} token for {scope.kind} {scope.name}"
    try:
        _, data = gh.requester.requestJsonAndCheck("POST", base + scope.api_path(purpose))
    except GithubException as e:
        msg = (e.data or {}).get("message", "") if isinstance(e.data, dict) else ""
        said = f"HTTP {e.status}" + (f": {msg}" if msg else "")
        if e.status in (403, 404):
            raise OptbotError(f"GitHub refused {what} ({said}): the operator's token needs {scope.needs()}") from None
        if e.status == 401:
            raise OptbotError(f"GitHub refused {what} ({said}): the operator's token is invalid or expired") from None
        raise OptbotError(f"GitHub: {what} failed ({said})") from None
    except requests.exceptions.RequestException as e:
        raise OptbotError(f"GitHub: {what} failed: cannot reach {base} ({type(e).__name__}); "
                          f"set --github-api-url / $OPTBOT_GITHUB_API_URL for GitHub Enterprise") from None
    token, expires = (data or {}).get("token"), (data or {}).get("expires_at")
    if not isinstance(token, str) or not token or not isinstance(expires, str):
        raise OptbotError(f"GitHub: {what}: the answer has no token and expires_at")
    return RunnerToken(token, expires)
