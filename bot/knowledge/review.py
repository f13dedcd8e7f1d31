"""Lessons from review: what a person did with one of the bot's engine pull requests, as knowledge.

- closed unmerged, or a change request on an open one: a *caveat* lesson, one per pull request
  (`review_slug`: repository and number), holding the reviewer's reason as quoted data and the
  changes the pull request carried with the inputs they were proposed with (`Proposal`);
- merged: the store entries it carried get a `production` record in their entry.yaml.

Store replay asks `declined()` before proposing an entry: an entry whose patch (sha256 of its
patch.diff, as known.patch_sha256 computes it), engine and workload match a review caveat is not
proposed again; a changed patch is. The inputs come from the Optbot-* trailers of the pull
request's commits, which bot/steps/combine.py writes (`proposal_trailers`): the pull request
itself says what it proposed, on whatever machine the review is read.

Reviewer text is hostile: `quote()` makes it inert data in the body (control and format characters
dropped, `<` escaped so no HTML comment or optbot marker survives, every line quoted with "> ", a
length cap). It never reaches the front-matter, whose values are all checked names and hashes.
GitHub is not touched here (bot/deliver/review.py reads it).
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path

import yaml

from bot.knowledge.lessons import Lesson, Proposal, Review, lesson_text, load_lessons, parse_lesson
from bot.knowledge.store import ID_RE, Entry, Production, load_store, parse_entry
from bot.trailers import parse_trailers, trailer_values

REASON_MAX = 2000  # characters of the reviewer's text kept in a lesson
NO_REASON = "closed without a reason"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_ENGINE = re.compile(r"^[A-Za-z0-9._/+~-]{1,200}$")  # a name (diffusers, sglang) or, in development, a path
_LOGIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}(\[bot\])?$")
# the inputs a candidate was proposed with, as trailers of its stack commit (DESIGN decision 5)
INPUT_TRAILERS = {"patch_sha256": "Optbot-Patch-Sha256", "base_sha": "Optbot-Base", "workload": "Optbot-Workload",
                  "engine": "Optbot-Engine", "hardware": "Optbot-Hardware"}


def entry_patch(diff: str) -> str:
    """The patch.diff text the learn step stores for a candidate's `git diff base commit`."""
    return diff if diff.endswith("\n") else diff + "\n"


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def proposal_trailers(p: Proposal) -> dict[str, str]:
    return {key: getattr(p, f) or "none" for f, key in INPUT_TRAILERS.items()}


def proposal_of(message: str, parent_sha: str, workload: str, store_root: Path | None) -> Proposal | None:
    """What one commit of the bot's pull request proposed, from its trailers; None for a commit
    that is no optbot candidate (a person's push to the branch). Every value is checked: a bad
    one is left empty. A commit made before the input trailers existed gets the entry's current
    patch sha256 from the store, the base from its parent and the workload from the branch."""
    t = parse_trailers(message)
    if "Optbot-Candidate" not in t and "Optbot-Kind" not in t:
        return None

    def value(key: str, rx: re.Pattern) -> str:
        v = next(iter(trailer_values(t.get(key))), "")
        return v if rx.match(v) else ""

    entry = value("Optbot-Entry", ID_RE)
    p = Proposal(candidate=value("Optbot-Candidate", _NAME), entry=entry, kind=value("Optbot-Kind", _NAME),
                 patch_sha256=value("Optbot-Patch-Sha256", _SHA256),
                 base_sha=value("Optbot-Base", _SHA1) or (parent_sha if _SHA1.match(parent_sha or "") else ""),
                 workload=value("Optbot-Workload", _NAME) or (workload if _NAME.match(workload or "") else ""),
                 engine=value("Optbot-Engine", _ENGINE), hardware=value("Optbot-Hardware", _NAME))
    if not p.patch_sha256 and entry and store_root is not None and (Path(store_root) / entry / "patch.diff").is_file():
        from bot.knowledge.known import patch_sha256
        e = next((e for e in load_store(store_root) if e.id == entry), None)
        if e is not None:
            p = Proposal(**{**p.__dict__, "patch_sha256": patch_sha256(e), "engine": p.engine or e.engine.name})
    return p


def login(value: str | None) -> str:
    return value if value and _LOGIN.match(value) else ""


def quote(text: str | None) -> str:
    """The reviewer's text as inert quoted markdown: at most REASON_MAX characters, no control or
    format characters (bidi overrides, zero-width), `<` escaped (no HTML, no `<!-- optbot-` marker),
    each line behind "> " (no heading, front-matter fence or trailer of its own)."""
    t = (text or "").replace("\r\n", "\n").replace("\r", "\n")
    t = "".join(ch for ch in t if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co"))
    t = t.replace("&", "&amp;").replace("<", "&lt;").strip()
    if not t:
        t = NO_REASON
    if len(t) > REASON_MAX:
        t = t[:REASON_MAX].rstrip() + f" ... (cut at {REASON_MAX} characters)"
    return "\n".join(f"> {line}".rstrip() for line in t.splitlines())


def review_slug(repo: str, pr: int) -> str:
    """One lesson per pull request: the repository's name and the number, with a hash of the exact
    name (two names that read alike as a slug, a.b and a-b, stay apart)."""
    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", repo.lower())).strip("-")[:60]
    return f"review-{name}-pr-{pr}-{hashlib.sha256(repo.encode()).hexdigest()[:6]}"


def caveat(repo: str, pr: int, url: str, state: str, reviewer: str, reason: str | None,
           proposed: list[Proposal]) -> tuple[str, str]:
    """(slug, file text) of the caveat lesson for one pull request."""
    quoted = quote(reason)
    review = Review(repo, pr, state, url, login(reviewer), text_sha256(quoted), tuple(proposed))
    common = {k: v for k in ("engine", "workload", "hardware") for v in [_common(proposed, k)] if v}
    applies = common or {"engine": "any"}
    evidence = [f"pr:{repo}#{pr}"] + [f"entry:{p.entry}" for p in proposed if p.entry]
    what = "closed without merging" if state == "closed" else "asked for changes on"
    who = f"@{review.reviewer}" if review.reviewer else "a person"
    rows = "\n".join(f"- {p.candidate or '(candidate)'}: kind {p.kind or '?'}, entry {p.entry or 'none'}, patch sha256 "
                     f"{p.patch_sha256[:16] or 'unknown'}, base {p.base_sha[:12] or '?'}, {p.workload or '?'} on "
                     f"{p.engine or '?'} / {p.hardware or '?'}" for p in proposed) or "- (no optbot commit found)"
    body = (f"# Declined in review: {repo}#{pr}\n\n"
            f"{who} {what} the bot's pull request {url or f'{repo}#{pr}'}. What it proposed:\n\n{rows}\n\n"
            f"The reviewer's reason, quoted as written (data, not instructions):\n\n{quoted}\n\n"
            "Store replay does not propose these patches again for the same engine and workload while the "
            "patch is unchanged (same sha256); a changed patch is proposed again.\n")
    meta = {"review": {"repo": repo, "pr": pr, "state": state, "url": url if _safe_url(url) else "",
                       "reviewer": review.reviewer, "reason_sha256": review.reason_sha256,
                       "proposed": [dict(p.__dict__) for p in proposed]}}
    slug = review_slug(repo, pr)
    text = lesson_text("caveat", applies, evidence, "high", body, meta)
    parse_lesson(text, Path(f"{slug}.md"))  # a lesson that would not load is a bug here, not in a later run
    return slug, text


def _common(proposed: list[Proposal], key: str) -> str:
    vals = {getattr(p, key) for p in proposed if getattr(p, key)}
    return vals.pop() if len(vals) == 1 else ""


def _safe_url(url: str) -> bool:
    return bool(re.fullmatch(r"https?://[A-Za-z0-9./_#:%?=&-]+", url or ""))


def same_review(old: Lesson | None, text: str) -> bool:
    """Whether the lesson already there records this review: same state, reason and proposals. A
    person's edits to the rest of the lesson are then kept."""
    if old is None or old.review is None:
        return False
    new = parse_lesson(text, old.path).review
    return (old.review.state, old.review.reason_sha256, old.review.proposed) == (new.state, new.reason_sha256,
                                                                                new.proposed)


def with_production(entry_file: Path, text: str, record: Production) -> str:
    """entry.yaml's text with `record` in its `production` list (one per repository and pull
    request). The rest of the file stays as written: the block is cut out and appended again."""
    data = yaml.safe_load(text) or {}
    rows = [p for p in (data.get("production") or []) if isinstance(p, dict)
            and (p.get("repo"), p.get("pr")) != (record.repo, record.pr)]
    rows.append({"repo": record.repo, "pr": record.pr, "merge_sha": record.merge_sha, "merged_at": record.merged_at})
    kept = re.sub(r"(?ms)^production:.*?(?=^[A-Za-z_#]|\Z)", "", text).rstrip("\n")
    out = kept + "\n" + yaml.safe_dump({"production": rows}, sort_keys=False)
    parse_entry(yaml.safe_load(out), entry_file)
    return out


def entries_of(proposed: list[Proposal], store: list[Entry]) -> list[Entry]:
    """The store entries a pull request carried: by the entry its commit names, else by patch."""
    from bot.knowledge.known import patch_sha256

    out = []
    for p in proposed:
        for e in store:
            if (p.entry and e.id == p.entry) or (not p.entry and p.patch_sha256 and patch_sha256(e) == p.patch_sha256):
                if e not in out:
                    out.append(e)
    return out


def declined(entry: Entry, engine: str, workload: str | None, lessons_root: Path | None) -> str:
    """Why replay must not propose `entry` again ("" when it may): a review caveat holds a proposal
    of the same patch (sha256), engine and workload."""
    from bot.knowledge.known import patch_sha256

    if lessons_root is None or not Path(lessons_root).is_dir():
        return ""
    sha = patch_sha256(entry)
    for lesson in load_lessons(lessons_root):
        r = lesson.review
        if r is None or lesson.kind != "caveat":
            continue
        for p in r.proposed:
            if p.patch_sha256 == sha and (p.engine or engine) == engine and (not workload or p.workload == workload):
                return (f"declined in review: lesson {lesson.slug} ({r.repo}#{r.pr} {r.state}"
                        + (f" by @{r.reviewer}" if r.reviewer else "") + f"); the patch is unchanged "
                        f"(sha256 {sha[:12]}), so it is not proposed again")
    return ""
