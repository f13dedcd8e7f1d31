"""A small stand-in of the GitHub REST API on 127.0.0.1, for the real PyGithub client (base_url).

It implements only what optbot's forge calls, with the JSON fields PyGithub reads:
  GET    /repos/{o}/{r}                                   repository
  GET    /repos/{o}/{r}/pulls?state=&head=OWNER:BRANCH     list pull requests (filtered like GitHub)
  POST   /repos/{o}/{r}/pulls                             create (422 if the head branch is missing
                                                          from the pushed bare repo, has no commits
                                                          over the base, or already has an open PR)
  GET    /repos/{o}/{r}/pulls/{n},  PATCH (title, body, state)
  GET    /repos/{o}/{r}/issues/{n}
  GET    /repos/{o}/{r}/issues/{n}/comments,  POST (create)
  GET    /repos/{o}/{r}/issues/comments/{id}, PATCH (edit)
  POST   /repos/{o}/{r}/issues/comments/{id}/reactions    201 new, 200 when the same reaction exists
Every response carries X-RateLimit-* headers. ``fail_next(method, path_regex, kind)`` makes the next
matching request fail once with a primary rate limit (403, X-RateLimit-Remaining: 0, reset in 1 s)
or a secondary one (429 + Retry-After). ``close_pr`` plays a person closing a pull request.
Delivery hardening (issue 15, the block "who the bot is, server errors" below):
  GET    /user                                            the token's user, login ``auth_login``
                                                          ("optbot", the author of what the bot
                                                          writes); None: 403 as for an installation
                                                          token (GitHub Actions' GITHUB_TOKEN)
``fail_status(method, path_regex, status, times)`` answers the next ``times`` matching requests
(None: every one) with that status, e.g. 502, before any other route or failure.
Runner registration tokens (issue 15, runner/setup): POST .../actions/runners/registration-token|remove-token
of a repository or organization, ``set_runner_admin`` (the block below).
The dashboard issue (issue 15, its block below): GET/POST /repos/{o}/{r}/issues, GET/PATCH
/repos/{o}/{r}/issues/{n}.
Branches are read from the bare repositories the bot pushes to, so a PR is only created for a
branch that was really pushed.
"""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import git


@dataclass
class Repo:
    full_name: str
    bare: Path | None
    default_branch: str = "main"
    pulls: list[dict] = field(default_factory=list)


class GitHubStandIn:
    def __init__(self, prefix: str = ""):
        self.prefix = prefix  # e.g. "/api/v3": GitHub Enterprise serves the API under it
        self.repos: dict[str, Repo] = {}
        self.issues_comments: dict[int, dict] = {}  # id -> comment (with "_issue": (repo, number))
        self.reactions: dict[int, list[dict]] = {}
        self.requests: list[tuple[str, str]] = []
        self.failures: list[tuple[str, re.Pattern, str]] = []
        self.status_failures: list[list] = []  # [method, regex, status, times left or None], fail_status
        self.lock = threading.Lock()
        self._next_id = 1000
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}{prefix}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ---------------------------------------------------------------- test controls
    def start(self) -> "GitHubStandIn":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_repo(self, full_name: str, bare: Path | None, default_branch: str = "main") -> Repo:
        self.repos[full_name] = Repo(full_name, bare, default_branch)
        return self.repos[full_name]

    def add_pull_for_trigger(self, full_name: str, title: str = "a PR a person opened") -> int:
        """An existing PR (the one a person comments `/optimize` on) with one comment; returns its number."""
        with self.lock:
            pr = self._new_pr(self.repos[full_name], title, "", "feature", "main", "person")
            return pr["number"]

    def add_comment(self, full_name: str, number: int, body: str, user: str = "person") -> int:
        with self.lock:
            return self._new_comment(full_name, number, body, user)["id"]

    def close_pr(self, full_name: str, number: int) -> None:
        with self.lock:
            pr = self._pr(full_name, number)
            pr["state"] = "closed"
            pr["closed_at"] = _now()

    def fail_next(self, method: str, path_regex: str, kind: str = "primary") -> None:
        self.failures.append((method, re.compile(path_regex), kind))

    def pulls(self, full_name: str, head: str | None = None) -> list[dict]:
        return [p for p in self.repos[full_name].pulls if head is None or p["head"]["ref"] == head]

    def comments(self, full_name: str, number: int) -> list[dict]:
        return [c for c in self.issues_comments.values() if c["_issue"] == (full_name, number)]

    # ---------------------------------------------------------------- JSON shapes
    def _user(self, login: str) -> dict:
        return {"login": login, "id": abs(hash(login)) % 10**6, "type": "User",
                "url": f"{self.base}/users/{login}", "html_url": f"https://github.example/{login}"}

    def _repo_json(self, r: Repo) -> dict:
        owner, name = r.full_name.split("/")
        return {"id": abs(hash(r.full_name)) % 10**6, "name": name, "full_name": r.full_name,
                "owner": self._user(owner), "private": False, "default_branch": r.default_branch,
                "url": f"{self.base}/repos/{r.full_name}", "html_url": f"https://github.example/{r.full_name}",
                "pulls_url": f"{self.base}/repos/{r.full_name}/pulls{{/number}}"}

    def _new_pr(self, r: Repo, title: str, body: str, head: str, base: str, user: str) -> dict:
        self._next_id += 1
        number = len(r.pulls) + 1 + sum(1 for _ in ())
        owner = r.full_name.split("/")[0]
        u = f"{self.base}/repos/{r.full_name}"
        sha = self._branch_sha(r, head) or "0" * 40
        pr = {"id": self._next_id, "number": number, "state": "open", "title": title, "body": body,
              "url": f"{u}/pulls/{number}", "html_url": f"https://github.example/{r.full_name}/pull/{number}",
              "issue_url": f"{u}/issues/{number}", "comments_url": f"{u}/issues/{number}/comments",
              "head": {"ref": head, "sha": sha, "label": f"{owner}:{head}", "repo": self._repo_json(r)},
              "base": {"ref": base, "sha": self._branch_sha(r, base) or "0" * 40, "label": f"{owner}:{base}",
                       "repo": self._repo_json(r)},
              "user": self._user(user), "merged": False, "merged_at": None, "closed_at": None,
              "created_at": _now(), "updated_at": _now()}
        r.pulls.append(pr)
        return pr

    def _issue_json(self, full_name: str, pr: dict) -> dict:
        u = f"{self.base}/repos/{full_name}/issues/{pr['number']}"
        return {"id": pr["id"], "number": pr["number"], "state": pr["state"], "title": pr["title"],
                "body": pr["body"], "url": u, "html_url": pr["html_url"], "comments_url": f"{u}/comments",
                "pull_request": {"url": pr["url"], "html_url": pr["html_url"]}, "user": pr["user"],
                "comments": len(self.comments(full_name, pr["number"])), "labels": []}

    def _new_comment(self, full_name: str, number: int, body: str, user: str) -> dict:
        self._next_id += 1
        cid = self._next_id
        c = {"id": cid, "body": body, "user": self._user(user), "created_at": _now(), "updated_at": _now(),
             "url": f"{self.base}/repos/{full_name}/issues/comments/{cid}",
             "html_url": f"https://github.example/{full_name}/pull/{number}#issuecomment-{cid}",
             "issue_url": f"{self.base}/repos/{full_name}/issues/{number}", "_issue": (full_name, number)}
        self.issues_comments[cid] = c
        return c

    @staticmethod
    def _public(c: dict) -> dict:
        return {k: v for k, v in c.items() if not k.startswith("_")}

    def _pr(self, full_name: str, number: int) -> dict:
        for p in self.repos[full_name].pulls:
            if p["number"] == number:
                return p
        raise KeyError(number)

    def _branch_sha(self, r: Repo, branch: str) -> str | None:
        if r.bare is None:
            return None
        try:
            return git.Repo(r.bare).commit(f"refs/heads/{branch}").hexsha
        except (git.BadName, ValueError, git.GitCommandError):
            return None

    # ---------------------------------------------------------------- who the bot is, server errors (issue 15)
    auth_login: str | None = "optbot"  # GET /user's login; None answers 403 (an installation token)

    def fail_status(self, method: str, path_regex: str, status: int = 502, times: int | None = 1) -> None:
        """The next ``times`` requests matching (every one when None) are answered ``status``."""
        self.status_failures.append([method, re.compile(path_regex), status, times])

    def _serve_delivery_extras(self, handler, method: str, path: str) -> bool:
        """Answer the request here (True) when a status failure matches it or it is GET /user."""
        for f in self.status_failures:
            m, rx, status, left = f
            if m == method and rx.search(path) and (left is None or left > 0):
                if left is not None:
                    f[3] = left - 1
                handler._send(status, {"message": HTTPStatus(status).phrase})
                return True
        if method == "GET" and path == "/user":
            if self.auth_login is None:
                handler._send(403, {"message": "Resource not accessible by integration"})
            else:
                handler._send(200, self._user(self.auth_login))
            return True
        return False

    # ---------------------------------------------------------------- the comment trigger (issue 15)
    # Routes and knobs of `optbot comment`, kept apart from the forge's; state made on first use.
    #   GET /repos/{o}/{r}/collaborators/{login}/permission   set_permission(); default "read" (a
    #       stranger on a public repository); role None: 404 (no such user). `permission` is the
    #       legacy field PyGithub reads (maintain -> write, triage -> read), `role_name` the role
    #   GET /repos/{o}/{r}/issues/comments/{id}/reactions     what add_reaction() and POSTs added
    #   GET /repos/{o}/{r}/issues/{n}[/comments], POST        plain issues (add_issue), no pull_request
    # set_head_sha() plays a push to a pull request's branch.
    def _trigger(self) -> dict:
        if not hasattr(self, "_trigger_state"):
            self._trigger_state = {"roles": {}, "issues": {}}
        return self._trigger_state

    def set_permission(self, full_name: str, login: str, role: str | None) -> None:
        self._trigger()["roles"][(full_name, login)] = role

    def add_issue(self, full_name: str, title: str = "an issue, not a pull request") -> int:
        with self.lock:
            issues = self._trigger()["issues"]
            self._next_id += 1
            number = 100 + len(issues) + 1  # apart from the pull requests' numbers
            u = f"{self.base}/repos/{full_name}/issues/{number}"
            issues[(full_name, number)] = {
                "id": self._next_id, "number": number, "state": "open", "title": title, "body": "", "url": u,
                "html_url": f"https://github.example/{full_name}/issues/{number}", "comments_url": f"{u}/comments",
                "user": self._user("person"), "labels": [], "comments": 0}
            return number

    def set_head_sha(self, full_name: str, number: int, sha: str) -> None:
        with self.lock:
            self._pr(full_name, number)["head"]["sha"] = sha

    def add_reaction(self, comment_id: int, content: str, user: str = "optbot") -> None:
        with self.lock:
            self._next_id += 1
            self.reactions.setdefault(comment_id, []).append(
                {"id": self._next_id, "content": content, "user": self._user(user), "created_at": _now()})

    def _trigger_route(self, method: str, full: str, rest: str, body: dict):
        """(status, JSON) for the comment trigger's routes, None for every other path."""
        m = re.match(r"^/collaborators/([^/]+)/permission$", rest)
        if m and method == "GET":
            login = unquote(m.group(1))
            role = self._trigger()["roles"].get((full, login), "read")
            if role is None:
                return 404, {"message": "Not Found"}
            legacy = {"maintain": "write", "triage": "read"}.get(role, role)
            return 200, {"permission": legacy, "role_name": role, "user": self._user(login)}
        m = re.match(r"^/issues/comments/(\d+)/reactions$", rest)
        if m and method == "GET":
            c = self.issues_comments.get(int(m.group(1)))
            if c is None or c["_issue"][0] != full:
                return 404, {"message": "Not Found"}
            return 200, list(self.reactions.get(c["id"], []))
        m = re.match(r"^/issues/(\d+)(/comments)?$", rest)
        issue = self._trigger()["issues"].get((full, int(m.group(1)))) if m else None
        if issue is None:
            return None
        if not m.group(2):
            return 200, {**issue, "comments": len(self.comments(full, issue["number"]))}
        if method == "POST":
            return 201, self._public(self._new_comment(full, issue["number"], body.get("body", ""), "optbot"))
        return 200, [self._public(c) for c in self.comments(full, issue["number"])]

    # ---------------------------------------------------------------- runner registration tokens (issue 15, runner/setup)
    #   POST /repos/{o}/{r}/actions/runners/registration-token | remove-token
    #   POST /orgs/{org}/actions/runners/registration-token | remove-token
    # 201 {token, expires_at} (one hour) where set_runner_admin(name, True); a repository or
    # organization the token may see but not administer: 403 "Resource not accessible by personal
    # access token" (GitHub's answer to a fine-grained token without the permission); unknown: 404.
    # Each request's Authorization header is kept in runner_token_auth.
    def set_runner_admin(self, name: str, admin: bool) -> None:
        self._runner_state()["admin"][name] = admin

    def _runner_state(self) -> dict:
        if not hasattr(self, "_runner_tokens"):
            self._runner_tokens = {"admin": {}, "issued": [], "auth": []}
        return self._runner_tokens

    @property
    def runner_token_auth(self) -> list[str]:
        return self._runner_state()["auth"]

    @property
    def runner_tokens_issued(self) -> list[dict]:
        return self._runner_state()["issued"]

    def _runner_token_route(self, handler, method: str, path: str) -> bool:
        m = re.match(r"^/(repos/[^/]+/[^/]+|orgs/[^/]+)/actions/runners/(registration|remove)-token$", path)
        if not m or method != "POST":
            return False
        state = self._runner_state()
        state["auth"].append(handler.headers.get("Authorization", ""))
        name = m.group(1).split("/", 1)[1]
        admin = state["admin"].get(name)
        if admin is None and name not in self.repos:
            handler._send(404, {"message": "Not Found", "status": "404"})
        elif not admin:
            handler._send(403, {"message": "Resource not accessible by personal access token", "status": "403",
                                "documentation_url": "https://docs.github.com/rest/actions/self-hosted-runners"})
        else:
            with self.lock:
                self._next_id += 1
                tok = {"token": f"AABF{self._next_id:06d}{m.group(2).upper()[:3]}TOKEN",
                       "expires_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() + 3600))}
                state["issued"].append({"scope": name, "purpose": m.group(2), **tok})
            handler._send(201, tok)
        return True

    # ---------------------------------------------------------------- the dashboard issue (issue 15)
    # Plain issues (no pull_request key) of the dashboard; state made on first use.
    #   GET   /repos/{o}/{r}/issues?state=open|closed|all&creator=LOGIN&labels=A,B   pull requests and
    #         issues alike (as GitHub lists them), newest first
    #   POST  /repos/{o}/{r}/issues                 title, body, labels; 201; its author is the token's
    #         user (auth_login; github-actions[bot] for an installation token)
    #   GET   /repos/{o}/{r}/issues/{n},  PATCH (title, body, state)
    # add_user_issue() plays a person opening an issue, edit_issue() a person editing a body
    # (ticking a box in GitHub's UI sends the whole body back, with \r\n line ends).
    def _dash_issues(self) -> dict:
        if not hasattr(self, "_dash_state"):
            self._dash_state = {}
        return self._dash_state  # (repo, number) -> issue

    def _new_issue(self, full_name: str, title: str, body: str, user: str, labels=()) -> dict:
        issues = self._dash_issues()
        self._next_id += 1
        number = 200 + len(issues) + 1  # apart from the pull requests' and add_issue's numbers
        u = f"{self.base}/repos/{full_name}/issues/{number}"
        issue = {"id": self._next_id, "number": number, "state": "open", "title": title, "body": body, "url": u,
                 "html_url": f"https://github.example/{full_name}/issues/{number}", "comments_url": f"{u}/comments",
                 "user": self._user(user), "labels": [{"name": n} for n in labels], "comments": 0,
                 "created_at": _now(), "updated_at": _now()}
        issues[(full_name, number)] = issue
        return issue

    def add_user_issue(self, full_name: str, title: str, body: str, user: str = "mallory") -> int:
        with self.lock:
            return self._new_issue(full_name, title, body, user)["number"]

    def edit_issue(self, full_name: str, number: int, body: str) -> None:
        with self.lock:
            self._dash_issues()[(full_name, number)]["body"] = body

    def issues(self, full_name: str) -> list[dict]:
        return [i for (f, _), i in sorted(self._dash_issues().items()) if f == full_name]

    def _dashboard_route(self, method: str, full: str, rest: str, query: dict, body: dict):
        """(status, JSON) for the dashboard's routes, None for every other path."""
        issues = self._dash_issues()
        if rest == "/issues" and method == "POST":
            if not body.get("title"):
                return 422, {"message": "Validation Failed", "errors": [{"field": "title", "code": "missing_field"}]}
            return 201, self._new_issue(full, body["title"], body.get("body") or "",
                                        self.auth_login or "github-actions[bot]", body.get("labels") or ())
        if rest == "/issues" and method == "GET":
            every = ([self._issue_json(full, p) for p in self.repos[full].pulls]
                     + [i for (f, _), i in self._trigger().get("issues", {}).items() if f == full]
                     + [i for (f, _), i in issues.items() if f == full])
            state = (query.get("state") or ["open"])[0]
            creator = (query.get("creator") or [None])[0]
            labels = [x for x in (query.get("labels") or [""])[0].split(",") if x]
            out = [i for i in every if (state == "all" or i["state"] == state)
                   and (creator is None or i["user"]["login"] == creator)
                   and all(n in [lb["name"] for lb in i.get("labels", [])] for n in labels)]
            return 200, sorted(out, key=lambda i: -i["number"])
        m = re.match(r"^/issues/(\d+)$", rest)
        issue = issues.get((full, int(m.group(1)))) if m else None
        if issue is None:
            return None
        if method == "PATCH":
            for k in ("title", "body", "state"):
                if k in body:
                    issue[k] = body[k]
            issue["updated_at"] = _now()
        return 200, issue

    # ---------------------------------------------------------------- lessons from review (issue 15 item 6)
    # Routes and knobs of `optbot lessons review`, state made on first use:
    #   GET /repos/{o}/{r}/pulls?state=closed|all&sort=created&direction=desc  newest first, as GitHub's
    #       sort=created direction=desc (the forge's route above lists oldest first when not asked to sort)
    #   GET /repos/{o}/{r}/pulls/{n}/reviews     what add_review() added, oldest first
    #   GET /repos/{o}/{r}/pulls/{n}/commits     the head branch's commits over the base branch, read from
    #       the bare repository (oldest first, with their parents), as GitHub lists a PR's commits
    #   GET /repos/{o}/{r}/issues/{n}            a pull request's issue with `closed_by` (close_by())
    # merge_pr() plays a person merging (merged, merged_at, merge_commit_sha); add_person_pull() a PR a
    # person opened from a branch of their choosing.
    def _review_state(self) -> dict:
        if not hasattr(self, "_review_data"):
            self._review_data = {"reviews": {}, "closed_by": {}}
        return self._review_data

    def add_person_pull(self, full_name: str, head: str, user: str = "person", base: str = "main") -> int:
        with self.lock:
            return self._new_pr(self.repos[full_name], f"a PR {user} opened", "", head, base, user)["number"]

    def add_review(self, full_name: str, number: int, user: str, state: str, body: str = "") -> int:
        with self.lock:
            self._next_id += 1
            pr = self._pr(full_name, number)
            self._review_state()["reviews"].setdefault((full_name, number), []).append(
                {"id": self._next_id, "user": self._user(user), "body": body, "state": state,
                 "submitted_at": _now(), "commit_id": pr["head"]["sha"], "author_association": "OWNER",
                 "html_url": f"{pr['html_url']}#pullrequestreview-{self._next_id}",
                 "pull_request_url": pr["url"]})
            return self._next_id

    def close_by(self, full_name: str, number: int, login: str) -> None:
        self.close_pr(full_name, number)
        self._review_state()["closed_by"][(full_name, number)] = login

    def merge_pr(self, full_name: str, number: int, login: str = "maintainer") -> str:
        with self.lock:
            pr = self._pr(full_name, number)
            sha = pr["head"]["sha"]
            pr.update(state="closed", merged=True, merged_at=_now(), closed_at=_now(), merge_commit_sha=sha)
            self._review_state()["closed_by"][(full_name, number)] = login
            return sha

    def _review_route(self, method: str, full: str, rest: str, query: dict):
        """(status, JSON) for the review routes, None for every other path."""
        r = self.repos[full]
        if rest == "/pulls" and method == "GET" and (query.get("sort") or [""])[0] == "created":
            state = (query.get("state") or ["open"])[0]
            out = [p for p in r.pulls if state == "all" or p["state"] == state]
            desc = (query.get("direction") or ["desc"])[0] == "desc"
            return 200, sorted(out, key=lambda p: p["number"], reverse=desc)
        m = re.match(r"^/(pulls|issues)/(\d+)(/reviews|/commits)?$", rest)
        if not m or method != "GET" or (m.group(1) == "issues") != (m.group(3) is None):
            return None
        try:
            pr = self._pr(full, int(m.group(2)))
        except KeyError:
            return 404, {"message": "Not Found"}
        if m.group(1) == "issues":
            who = self._review_state()["closed_by"].get((full, pr["number"]))
            return 200, {**self._issue_json(full, pr), "closed_by": self._user(who) if who else None}
        if m.group(3) == "/reviews":
            return 200, list(self._review_state()["reviews"].get((full, pr["number"]), []))
        repo = git.Repo(r.bare)
        out = []
        for c in repo.iter_commits(f"refs/heads/{pr['base']['ref']}..refs/heads/{pr['head']['ref']}", reverse=True):
            person = {"name": c.author.name, "email": c.author.email, "date": c.authored_datetime.isoformat()}
            out.append({"sha": c.hexsha, "url": f"{self.base}/repos/{full}/commits/{c.hexsha}",
                        "html_url": f"https://github.example/{full}/commit/{c.hexsha}",
                        "commit": {"message": c.message, "author": person, "committer": person,
                                   "tree": {"sha": c.tree.hexsha}},
                        "parents": [{"sha": p.hexsha, "url": f"{self.base}/repos/{full}/commits/{p.hexsha}"}
                                    for p in c.parents]})
        return 200, out

    # ---------------------------------------------------------------- the server
    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, status: int, data, extra: dict | None = None):
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(raw)))
                headers = {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999",
                           "X-RateLimit-Reset": str(int(time.time()) + 3600), **(extra or {})}
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}") if n else {}

            def _handle(self, method: str):
                url = urlparse(self.path)
                path, query = url.path, parse_qs(url.query)
                if standin.prefix:
                    if not path.startswith(standin.prefix + "/"):
                        return self._send(404, {"message": "Not Found"})
                    path = path[len(standin.prefix):]
                standin.requests.append((method, self.path))
                if standin._serve_delivery_extras(self, method, path):
                    return
                if standin._runner_token_route(self, method, path):  # runner registration tokens (issue 15)
                    return
                for i, (m, rx, kind) in enumerate(standin.failures):
                    if m == method and rx.search(path):
                        standin.failures.pop(i)
                        if kind == "primary":
                            return self._send(403, {"message": "API rate limit exceeded for user ID 1.",
                                                    "documentation_url": "https://docs.github.com/rest/rate-limit"},
                                              {"X-RateLimit-Remaining": "0",
                                               "X-RateLimit-Reset": str(int(time.time()) + 1)})
                        return self._send(429, {"message": "You have exceeded a secondary rate limit."},
                                          {"Retry-After": "1"})
                body = self._body() if method in ("POST", "PATCH") else {}
                with standin.lock:
                    return self._route(method, path, query, body)

            def _route(self, method, path, query, body):
                m = re.match(r"^/repos/([^/]+/[^/]+)(/.*)?$", path)
                if not m or m.group(1) not in standin.repos:
                    return self._send(404, {"message": "Not Found"})
                full, rest = m.group(1), m.group(2) or ""
                r = standin.repos[full]
                hit = standin._trigger_route(method, full, rest, body)  # issue 15's routes first
                if hit is None:
                    hit = standin._dashboard_route(method, full, rest, query, body)
                if hit is None:
                    hit = standin._review_route(method, full, rest, query)  # issue 15 item 6
                if hit is not None:
                    return self._send(*hit)
                if rest == "" and method == "GET":
                    return self._send(200, standin._repo_json(r))
                if rest == "/pulls" and method == "GET":
                    state = (query.get("state") or ["open"])[0]
                    head = (query.get("head") or [None])[0]
                    out = [p for p in r.pulls if state == "all" or p["state"] == state]
                    if head:
                        out = [p for p in out if p["head"]["label"] == head]
                    return self._send(200, out)
                if rest == "/pulls" and method == "POST":
                    head, base = body.get("head", ""), body.get("base", "")
                    if standin._branch_sha(r, head) is None and r.bare is not None:
                        return self._send(422, {"message": "Validation Failed",
                                                "errors": [{"field": "head", "code": "invalid"}]})
                    if r.bare is not None and standin._branch_sha(r, head) == standin._branch_sha(r, base):
                        return self._send(422, {"message": "Validation Failed",
                                                "errors": [{"message": f"No commits between {base} and {head}"}]})
                    if any(p["head"]["ref"] == head and p["state"] == "open" for p in r.pulls):
                        return self._send(422, {"message": "Validation Failed", "errors": [
                            {"message": f"A pull request already exists for {full.split('/')[0]}:{head}."}]})
                    return self._send(201, standin._new_pr(r, body.get("title", ""), body.get("body", ""), head,
                                                           base, "optbot"))
                m2 = re.match(r"^/pulls/(\d+)$", rest)
                if m2:
                    try:
                        pr = standin._pr(full, int(m2.group(1)))
                    except KeyError:
                        return self._send(404, {"message": "Not Found"})
                    if method == "PATCH":
                        for k in ("title", "body", "state"):
                            if k in body:
                                pr[k] = body[k]
                        pr["updated_at"] = _now()
                        pr["head"]["sha"] = standin._branch_sha(r, pr["head"]["ref"]) or pr["head"]["sha"]
                    return self._send(200, pr)
                m2 = re.match(r"^/issues/(\d+)(/comments)?$", rest)
                if m2:
                    try:
                        pr = standin._pr(full, int(m2.group(1)))
                    except KeyError:
                        return self._send(404, {"message": "Not Found"})
                    if not m2.group(2):
                        return self._send(200, standin._issue_json(full, pr))
                    if method == "GET":
                        return self._send(200, [standin._public(c) for c in standin.comments(full, pr["number"])])
                    if method == "POST":
                        c = standin._new_comment(full, pr["number"], body.get("body", ""), "optbot")
                        return self._send(201, standin._public(c))
                m2 = re.match(r"^/issues/comments/(\d+)(/reactions)?$", rest)
                if m2:
                    c = standin.issues_comments.get(int(m2.group(1)))
                    if c is None or c["_issue"][0] != full:
                        return self._send(404, {"message": "Not Found"})
                    if m2.group(2) and method == "POST":
                        lst = standin.reactions.setdefault(c["id"], [])
                        for x in lst:
                            if x["content"] == body.get("content"):
                                return self._send(200, x)
                        standin._next_id += 1
                        x = {"id": standin._next_id, "content": body.get("content"), "user": standin._user("optbot"),
                             "created_at": _now()}
                        lst.append(x)
                        return self._send(201, x)
                    if method == "PATCH":
                        c["body"] = body.get("body", c["body"])
                        c["updated_at"] = _now()
                    return self._send(200, standin._public(c))
                return self._send(404, {"message": "Not Found"})

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PATCH(self):
                self._handle("PATCH")

        return Handler


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
