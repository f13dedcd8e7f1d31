"""`optbot lessons review`: read what people did with the bot's engine pull requests on GitHub, and
deliver it as knowledge (the formats and the matching are bot/knowledge/review.py's).

The bot's pull requests are those whose author is the token's own user (GitHubForge.login()) and
whose head branch is one the bot names (`optbot/...`, bot/steps/combine.branch_name). A person's
pull request from an `optbot/...` branch is not the bot's: it is listed as ignored, never read.
For each of the bot's pull requests (newest first, at most `limit`):

  closed unmerged   the reason: the closing person's (issue `closed_by`) last comment, else the last
                    review with a text by a person with write permission, else "closed without a
                    reason" -> a caveat lesson
  open              the newest review of each reviewer with write, maintain or admin permission
                    (asked of GET /repos/O/R/collaborators/LOGIN/permission; anyone can review a
                    public pull request); one of them requesting changes -> a caveat lesson with
                    that review's text; none (approved since, dismissed) -> the caveat is removed
  merged            the store entries it carried get `production` {repo, pr, merge_sha, merged_at};
                    a caveat from an earlier change request is removed

What it proposed comes from its commits (GET /repos/O/R/pulls/N/commits): their Optbot-* trailers.
The lessons and entries that differ from the knowledge repository's HEAD are one commit on the fixed
branch BRANCH and one knowledge pull request (updated; a new one after the last was merged). A run
that finds nothing new commits nothing; the same files as the branch already holds reuse its commit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Callable

import git
from github import GithubException

from bot.deliver.knowledge import commit_files_to_branch
from bot.deliver.pull_request import PullRequestRef
from bot.errors import OptbotError
from bot.knowledge.lessons import Proposal, load_lessons
from bot.knowledge.location import Knowledge
from bot.knowledge.review import caveat, entries_of, login, proposal_of, review_slug, same_review, with_production
from bot.knowledge.store import Production, load_store

BRANCH = "optbot/review-lessons"
BOT_BRANCH = "optbot/"
MAY_DECLINE = ("admin", "write")  # the API's legacy `permission`: maintain reads as write


@dataclass
class PullOutcome:
    number: int
    url: str
    state: str  # closed | changes-requested | merged | open
    head_ref: str
    reviewer: str = ""
    reason: str | None = None  # as the person wrote it (hostile): quoted only when written into a lesson
    merge_sha: str = ""
    merged_at: str = ""
    proposed: list[Proposal] = field(default_factory=list)


@dataclass
class ReviewResult:
    repo: str
    pulls: list[PullOutcome] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # why a pull request from an optbot/ branch was not read
    written: list[str] = field(default_factory=list)  # lessons new or changed (paths in the knowledge repository)
    unchanged: list[str] = field(default_factory=list)  # lessons already recording their review
    removed: list[str] = field(default_factory=list)  # caveats whose change request was resolved or merged
    production: list[str] = field(default_factory=list)  # entry.yaml files that got a production record
    branch: str = ""
    commit: str = ""
    knowledge_pr: PullRequestRef = field(default_factory=lambda: PullRequestRef("none"))

    def summary(self) -> str:
        n = {s: sum(1 for p in self.pulls if p.state == s) for s in ("closed", "changes-requested", "merged", "open")}
        return (f"{self.repo}: {len(self.pulls)} of the bot's pull requests read ({n['closed']} closed, "
                f"{n['changes-requested']} changes requested, {n['merged']} merged, {n['open']} open); "
                f"{len(self.ignored)} ignored; lessons {len(self.written)} written, {len(self.unchanged)} unchanged, "
                f"{len(self.removed)} removed; {len(self.production)} entries in production; knowledge PR "
                f"{self.knowledge_pr.action} {self.knowledge_pr.url}".rstrip())


def _iso(d) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%SZ") if d is not None else ""


class _Reader:
    """One engine repository's pull requests, through one GitHubForge (its retries and errors)."""

    def __init__(self, forge, repo_name: str, store_root: Path | None):
        self.forge, self.repo_name, self.store_root = forge, repo_name, store_root
        self.gh = forge.repo(repo_name)
        self._perm: dict[str, str] = {}

    def may_decline(self, who: str) -> bool:
        if who not in self._perm:
            def ask():
                try:
                    return self.gh.get_collaborator_permission(who)
                except GithubException as e:
                    if e.status == 404:
                        return "none"
                    raise
            self._perm[who] = self.forge.call(f"get the permission of {who}", ask)
        return self._perm[who] in MAY_DECLINE

    def outcome(self, pr) -> PullOutcome:
        n = pr.number
        parts = pr.head.ref.split("/")
        workload = parts[1] if len(parts) == 3 else ""
        commits = self.forge.call(f"list commits of PR #{n}", lambda: list(pr.get_commits()))
        proposed = [p for c in commits if (p := proposal_of(c.commit.message or "", c.parents[0].sha if c.parents else "",
                                                            workload, self.store_root)) is not None]
        out = PullOutcome(n, pr.html_url, "open", pr.head.ref, proposed=proposed)
        if pr.merged_at is not None:
            out.state, out.merge_sha, out.merged_at = "merged", pr.merge_commit_sha or "", _iso(pr.merged_at)
            return out
        reviews = [r for r in self.forge.call(f"list reviews of PR #{n}", lambda: list(pr.get_reviews()))
                   if r.user is not None]
        if pr.state == "closed":
            issue = self.forge.call(f"get #{n}", self.gh.get_issue, n)
            closer = issue.closed_by.login if issue.closed_by is not None else ""
            comments = self.forge.call(f"list comments of #{n}", lambda: list(issue.get_comments()))
            said = [c.body for c in comments if closer and c.user is not None and c.user.login == closer and c.body]
            texts = [r for r in reviews if (r.body or "").strip()
                     and (r.user.login == closer or self.may_decline(r.user.login))]
            out.state, out.reviewer = "closed", closer
            if said:
                out.reason = said[-1]
            elif texts:
                out.reason, out.reviewer = texts[-1].body, out.reviewer or texts[-1].user.login
            return out
        latest = {}
        for r in reviews:  # GitHub lists reviews oldest first; a later verdict of the same person wins
            if r.state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED"):
                latest[r.user.login] = r
        asked = [r for who, r in latest.items() if r.state == "CHANGES_REQUESTED" and self.may_decline(who)]
        if asked:
            r = max(asked, key=lambda r: (r.submitted_at is not None, r.submitted_at, r.id))
            out.state, out.reviewer, out.reason = "changes-requested", r.user.login, r.body
        return out


def read_pulls(forge, repo_name: str, limit: int, store_root: Path | None,
               log: Callable[[str], None] = print) -> tuple[list[PullOutcome], list[str]]:
    """The bot's pull requests of `repo_name` (newest first, at most `limit`) and what became of
    each; and why each pull request from an optbot/ branch that is not the bot's was ignored."""
    me = forge.login()
    if not me:
        raise OptbotError("optbot lessons review: cannot tell the bot's pull requests from anyone else's: the "
                          "token may not read GET /user; set $OPTBOT_GITHUB_LOGIN to the bot's login")
    reader = _Reader(forge, repo_name, store_root)
    pulls = forge.call(f"list pulls of {repo_name}", lambda: list(islice(
        reader.gh.get_pulls(state="all", sort="created", direction="desc"), limit)))
    outcomes, ignored = [], []
    for pr in pulls:
        if not pr.head.ref.startswith(BOT_BRANCH):
            continue
        author = pr.user.login if pr.user is not None else ""
        if author != me:
            ignored.append(f"#{pr.number}: branch {pr.head.ref} but opened by {login(author) or 'someone'}, "
                           f"not {me}: not the bot's")
            continue
        log(f"review: #{pr.number} ({pr.head.ref}, {pr.state})")
        outcomes.append(reader.outcome(pr))
    return outcomes, ignored


def plan(repo_name: str, outcomes: list[PullOutcome], knowledge: Knowledge) -> tuple[ReviewResult, dict[str, bytes | None]]:
    """The files that make the knowledge agree with the reviews: path (in the knowledge
    repository) -> new content, None to remove. Compared with the files as they are there."""
    root = knowledge.root
    try:
        lessons_rel = knowledge.lessons.relative_to(root)
    except ValueError:
        raise OptbotError(f"optbot lessons review: lessons folder {knowledge.lessons} is outside the knowledge "
                          f"repository {root}; the lessons are committed there (--knowledge-path)") from None
    res = ReviewResult(repo_name, list(outcomes))
    existing = {lesson.slug: lesson for lesson in load_lessons(knowledge.lessons)}
    store = load_store(knowledge.kernel_store)
    files: dict[str, bytes | None] = {}
    for o in outcomes:
        slug = review_slug(repo_name, o.number)
        rel = str(lessons_rel / f"{slug}.md")
        if o.state in ("closed", "changes-requested"):
            slug, text = caveat(repo_name, o.number, o.url, o.state, o.reviewer, o.reason, o.proposed)
            if same_review(existing.get(slug), text):
                res.unchanged.append(rel)
            else:
                files[rel] = text.encode()
                res.written.append(rel)
        elif slug in existing:
            files[rel] = None
            res.removed.append(rel)
        if o.state != "merged":
            continue
        for e in entries_of(o.proposed, store):
            f = e.path / "entry.yaml"
            rel_e = str(f.relative_to(root))
            old = f.read_text()
            new = with_production(f, old, Production(repo_name, o.number, o.merge_sha, o.merged_at))
            if new != old:
                files[rel_e] = new.encode()
                res.production.append(rel_e)
    return res, files


def _same_commit(repo: git.Repo, files: dict[str, bytes | None]) -> str:
    """The review branch's commit (local, or as cloned from the remote) when it is HEAD + exactly
    `files`: the same lessons as a run before delivered, so no new commit."""
    head = repo.head.commit
    for ref in (f"refs/heads/{BRANCH}", f"refs/remotes/origin/{BRANCH}"):
        try:
            c = repo.commit(ref)
        except (git.BadName, ValueError):
            continue
        if [p.hexsha for p in c.parents] != [head.hexsha]:
            continue
        if set(repo.git.diff("--name-only", "--no-renames", head.hexsha, c.hexsha).splitlines()) != set(files):
            continue
        def holds(path, data):
            try:
                blob = c.tree / path
            except KeyError:
                return data is None
            return data is not None and blob.data_stream.read() == data
        if all(holds(p, d) for p, d in files.items()):
            return c.hexsha
    return ""


def sync(forge, publish, repo_name: str, knowledge: Knowledge, limit: int = 100,
         log: Callable[[str], None] = print) -> ReviewResult:
    """Read the reviews through `forge` (GitHub), deliver through `publish` (GitHubForge or
    LocalForge: its publish_knowledge)."""
    outcomes, ignored = read_pulls(forge, repo_name, limit, knowledge.kernel_store, log)
    res, files = plan(repo_name, outcomes, knowledge)
    res.ignored = ignored
    if not files:
        res.knowledge_pr = PullRequestRef("none", note="nothing new from review: no commit, no pull request update")
        return res
    repo = knowledge.repo
    if repo is None:
        raise OptbotError(f"optbot lessons review: {knowledge.root} ({knowledge.why}) is not a git repository with a "
                          "commit; the lessons are committed to a branch of the knowledge repository")
    title = (f"optbot review lessons: {repo_name} ({len(res.written)} caveats written, {len(res.removed)} removed, "
             f"{len(res.production)} entries in production)")
    sha = _same_commit(repo, files)
    if sha:
        repo.git.update_ref(f"refs/heads/{BRANCH}", sha)
    else:
        date = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        sha = commit_files_to_branch(repo, BRANCH, files, title + "\n\nOptbot-Review: " + repo_name + "\n", date)
    res.branch, res.commit = BRANCH, sha
    res.knowledge_pr = publish.publish_knowledge(repo.working_tree_dir, BRANCH, sha, title, _body(res, outcomes),
                                                 new_after_merge=True)
    return res


def _body(res: ReviewResult, outcomes: list[PullOutcome]) -> str:
    """The knowledge PR's text: links and file names only (the reviewers' words are in the files)."""
    lines = [f"Lessons from review of the bot's pull requests in `{res.repo}` (`optbot lessons review`).", ""]
    by_number = {o.number: o for o in outcomes}
    for title, paths in (("Caveats written or updated", res.written), ("Caveats removed (request resolved or merged)",
                                                                       res.removed),
                         ("Entries now in production", res.production)):
        if paths:
            lines += [f"**{title}**", ""] + [f"- `{p}`" for p in paths] + [""]
    lines += ["Pull requests read: " + ", ".join(f"#{n} {o.state}" for n, o in sorted(by_number.items()))]
    return "\n".join(lines) + "\n"
