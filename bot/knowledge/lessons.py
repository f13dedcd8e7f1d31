"""lessons/<slug>.md: what the bot (or a person) learned, as reviewable markdown.

    ---
    kind: caveat | pattern
    applies-to: {pattern: <opportunity kind>, engine: diffusers, hardware: h200, ...}
    evidence: [kernel_store entry ids, run ids, test paths]
    confidence: low | medium | high
    review:        only on a lesson from review of the bot's pull request (bot/knowledge/review.py)
      {repo: O/R, pr: N, state: closed | changes-requested, url, reviewer, reason_sha256,
       proposed: [{candidate, entry, kind, patch_sha256, base_sha, workload, engine, hardware}]}
    signature:     only on a lesson the learn step wrote: what makes two outcomes the same lesson
    seen: N        how many runs found it (default 1)
    first-seen, last-seen: YYYY-MM-DD
    ---
    Short body: what was tried, what happened, why.

Merged by signature: a lesson written with the signature of one already in the folder updates that
file (the newest body, the evidence of both, seen + 1, last-seen today) instead of adding a second;
the same run writing it again (a resumed learn step) counts once. Aged by last-seen: a lesson not
seen for STALE_DAYS ranks after the fresh ones in `search` and says so in the agent's prompt; a
lesson without dates (written by a person) does not age.

Where the lessons are comes from location.py: a `root` of None below means its lessons folder.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bot.errors import ConfigError, OptbotError
from bot.knowledge import OPPORTUNITY_KINDS
from bot.knowledge.location import locate

KINDS = ("pattern", "caveat")
CONFIDENCE = ("low", "medium", "high")
APPLIES_KEYS = ("pattern", "engine", "hardware", "dtype", "workload", "model")
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
REVIEW_STATES = ("closed", "changes-requested")
_HEX = re.compile(r"^[0-9a-f]*$")
_NAME = re.compile(r"^[A-Za-z0-9._-]*$")
_ENGINE = re.compile(r"^[A-Za-z0-9._/+~-]*$")  # an engine name, or the path a development run named
_REPO = re.compile(r"^[A-Za-z0-9-]+/[A-Za-z0-9._-]+$")
STALE_DAYS = 90  # a generated lesson not seen again for this long ranks after the fresh ones
MAX_EVIDENCE = 12  # a merged lesson keeps the newest evidence items


@dataclass(frozen=True)
class Proposal:
    """One change a pull request of the bot carried, with the inputs it was proposed with: what
    replay compares (bot/knowledge/review.declined) to not propose it again unchanged."""
    candidate: str = ""
    entry: str = ""  # the kernel_store entry ("" when none)
    kind: str = ""  # opportunity kind
    patch_sha256: str = ""  # of the entry's patch.diff, as bot/knowledge/known.patch_sha256 computes it
    base_sha: str = ""  # the engine commit it was proposed on
    workload: str = ""
    engine: str = ""  # engine name: diffusers | sglang
    hardware: str = ""  # where it was validated: cpu | h200 | ...


@dataclass(frozen=True)
class Review:
    """What a person did with one of the bot's pull requests."""
    repo: str  # owner/name of the engine repository
    pr: int
    state: str  # closed (unmerged) | changes-requested
    url: str
    reviewer: str  # a GitHub login, or "" when none could be told
    reason_sha256: str  # of the quoted reason: a changed reason rewrites the lesson
    proposed: tuple[Proposal, ...]


@dataclass(frozen=True)
class Lesson:
    slug: str
    kind: str
    title: str
    applies_to: dict[str, str]
    evidence: tuple[str, ...]
    confidence: str
    body: str
    path: Path = field(default=Path())
    review: Review | None = None
    signature: str = ""
    seen: int = 1
    first_seen: str = ""  # YYYY-MM-DD; "" for a lesson written by a person
    last_seen: str = ""

    def age_days(self, today: dt.date | None = None) -> int | None:
        """Days since it was last seen; None for a lesson without dates (it does not age)."""
        if not self.last_seen:
            return None
        return ((today or dt.date.today()) - dt.date.fromisoformat(self.last_seen)).days

    def stale(self, today: dt.date | None = None) -> bool:
        age = self.age_days(today)
        return age is not None and age > STALE_DAYS

    def seen_line(self, today: dt.date | None = None) -> str:
        """"seen 3 times, last 2026-12-02" (+ ", stale: 120 days ago"); "" for an undated lesson."""
        if not self.last_seen:
            return ""
        line = f"seen {self.seen} time{'s' if self.seen != 1 else ''}, last {self.last_seen}"
        return line + (f", stale: {self.age_days(today)} days ago" if self.stale(today) else "")

    def applies(self, pattern: str | None = None, engine: str | None = None, hardware: str | None = None) -> bool:
        """A lesson applies unless it names a different value for a condition that was asked about."""
        for key, want in (("pattern", pattern), ("engine", engine), ("hardware", hardware)):
            have = self.applies_to.get(key)
            if want is not None and have not in (None, "any", want):
                return False
        return True

    def text(self) -> str:
        return f"{self.title}\n{self.body}"


def parse_lesson(text: str, file: Path) -> Lesson:
    m = re.match(r"^---\s*\n(.*?)\n---\s*\n?(.*)$", text, re.S)
    if not m:
        raise ConfigError(file, "(front-matter)", text[:40], "a YAML front-matter block between '---' lines")
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError as e:
        raise ConfigError(file, "(front-matter)", str(e).splitlines()[0], "valid YAML") from None
    if not isinstance(meta, dict):
        raise ConfigError(file, "(front-matter)", meta, "a mapping")
    kind = meta.get("kind")
    if kind not in KINDS:
        raise ConfigError(file, "kind", kind, "pattern | caveat")
    applies = meta.get("applies-to")
    if not isinstance(applies, dict) or not applies:
        raise ConfigError(file, "applies-to", applies, f"a mapping of conditions ({', '.join(APPLIES_KEYS)})")
    for k, v in applies.items():
        if k not in APPLIES_KEYS:
            raise ConfigError(file, f"applies-to.{k}", v, f"one of the conditions {', '.join(APPLIES_KEYS)}")
        if not isinstance(v, str):
            raise ConfigError(file, f"applies-to.{k}", v, "a string")
    if "pattern" in applies and applies["pattern"] not in OPPORTUNITY_KINDS + ("any",):
        raise ConfigError(file, "applies-to.pattern", applies["pattern"], f"an opportunity kind ({', '.join(OPPORTUNITY_KINDS)})")
    evidence = meta.get("evidence")
    if isinstance(evidence, str):
        evidence = [evidence]
    if not isinstance(evidence, list) or not evidence or not all(isinstance(e, str) for e in evidence):
        raise ConfigError(file, "evidence", evidence, "a non-empty list of entry ids, run ids or test paths")
    conf = meta.get("confidence")
    if conf not in CONFIDENCE:
        raise ConfigError(file, "confidence", conf, "low | medium | high")
    body = m.group(2).strip()
    if not body:
        raise ConfigError(file, "(body)", "", "a short body: what was tried, what happened, why")
    title = body.splitlines()[0].lstrip("# ").strip()
    slug = file.stem
    if not SLUG_RE.match(slug):
        raise ConfigError(file, "(file name)", slug, "a slug of lowercase letters, digits and '-'")
    review = _parse_review(meta["review"], file) if meta.get("review") is not None else None
    signature = meta.get("signature") or ""
    if not isinstance(signature, str):
        raise ConfigError(file, "signature", signature, "a string")
    seen = meta.get("seen", 1)
    if not isinstance(seen, int) or isinstance(seen, bool) or seen < 1:
        raise ConfigError(file, "seen", seen, "a whole number >= 1")
    days = {}
    for key in ("first-seen", "last-seen"):
        v = meta.get(key)
        if isinstance(v, dt.date):  # YAML reads an unquoted date as one
            v = v.isoformat()
        if v is not None:
            try:
                dt.date.fromisoformat(str(v))
            except ValueError:
                raise ConfigError(file, key, v, "a date YYYY-MM-DD") from None
        days[key] = str(v) if v is not None else ""
    return Lesson(slug, kind, title, dict(applies), tuple(evidence), conf, body, file, review, signature, seen,
                  days["first-seen"], days["last-seen"])


def _parse_review(r, file: Path) -> Review:
    """The review block; every value is checked, since a person edits these files too."""
    if not isinstance(r, dict):
        raise ConfigError(file, "review", r, "a mapping {repo, pr, state, url, reviewer, reason_sha256, proposed}")

    def field_(d: dict, key: str, prefix: str, rx: re.Pattern | None = None, required: bool = False) -> str:
        v = d.get(key, "")
        if v is None:
            v = ""
        if not isinstance(v, str) or (rx is not None and not rx.match(v)) or (required and not v):
            raise ConfigError(file, f"{prefix}{key}", v, "a string" + (f" matching {rx.pattern}" if rx else ""))
        return v

    repo = field_(r, "repo", "review.", _REPO, required=True)
    pr = r.get("pr")
    if not isinstance(pr, int) or isinstance(pr, bool) or pr < 1:
        raise ConfigError(file, "review.pr", pr, "a pull request number")
    state = r.get("state")
    if state not in REVIEW_STATES:
        raise ConfigError(file, "review.state", state, " | ".join(REVIEW_STATES))
    proposed = r.get("proposed") or []
    if not isinstance(proposed, list) or not all(isinstance(p, dict) for p in proposed):
        raise ConfigError(file, "review.proposed", proposed, "a list of {candidate, entry, kind, patch_sha256, ...}")
    props = []
    for i, p in enumerate(proposed):
        pre = f"review.proposed[{i}]."
        unknown = set(p) - set(Proposal.__dataclass_fields__)
        if unknown:
            raise ConfigError(file, pre + sorted(unknown)[0], p[sorted(unknown)[0]],
                              f"one of {', '.join(Proposal.__dataclass_fields__)}")
        props.append(Proposal(**{k: field_(p, k, pre, _HEX if k.endswith("sha256") or k == "base_sha"
                                              else _ENGINE if k == "engine" else _NAME)
                                 for k in Proposal.__dataclass_fields__}))
    return Review(repo, pr, state, field_(r, "url", "review."), field_(r, "reviewer", "review.", _NAME),
                  field_(r, "reason_sha256", "review.", _HEX), tuple(props))


def load_lesson(file: Path) -> Lesson:
    return parse_lesson(Path(file).read_text(), Path(file))


def _root(root: Path | None) -> Path:
    return Path(root) if root is not None else locate().lessons


def load_lessons(root: Path | None = None) -> list[Lesson]:
    root = _root(root)
    if not root.is_dir():
        return []
    return [load_lesson(p) for p in sorted(root.glob("*.md")) if p.name.lower() != "readme.md"]


def get_lesson(slug: str, root: Path | None = None) -> Lesson:
    root = _root(root)
    file = root / f"{slug.removesuffix('.md')}.md"
    if not file.is_file():
        raise OptbotError(f"lessons {root}: no lesson {slug!r} (see `optbot lessons list`)")
    return load_lesson(file)


def search(query: str = "", pattern: str | None = None, engine: str | None = None, hardware: str | None = None,
           kind: str | None = None, root: Path | None = None, caveats_first: bool = False) -> list[Lesson]:
    """Retrieval by pattern, engine and hardware, then ranked by how many query words they contain.
    `caveats_first` (the agent's view): at equal score a caveat comes before a pattern, since a
    known failure is the costlier thing to repeat."""
    words = [w for w in re.findall(r"[\w.+-]+", query.lower()) if w]
    scored = []
    for lesson in load_lessons(root):
        if kind and lesson.kind != kind:
            continue
        if not lesson.applies(pattern, engine, hardware):
            continue
        hay = (lesson.text() + " " + " ".join(lesson.applies_to.values()) + " " + " ".join(lesson.evidence)).lower()
        score = sum(hay.count(w) for w in words)
        if words and score == 0:
            continue
        rank = 1 if caveats_first and lesson.kind != "caveat" else 0
        # at equal score and kind: fresh before stale, then the most often seen, then the newest
        recency = -dt.date.fromisoformat(lesson.last_seen).toordinal() if lesson.last_seen else 0
        scored.append((-score, rank, lesson.stale(), -lesson.seen, recency, lesson.slug, lesson))
    return [t[-1] for t in sorted(scored, key=lambda t: t[:6])]


def lesson_text(kind: str, applies_to: dict, evidence: list[str], confidence: str, body: str,
                extra: dict | None = None) -> str:
    """The file's text: YAML front-matter (safe_dump: no value can end it early), then the body."""
    meta = {"kind": kind, "applies-to": applies_to, "evidence": evidence, "confidence": confidence, **(extra or {})}
    return "---\n" + yaml.safe_dump(meta, sort_keys=False).strip() + "\n---\n" + body.strip() + "\n"


def write_lesson(root: Path, slug: str, kind: str, applies_to: dict, evidence: list[str], confidence: str, body: str,
                 *, signature: str = "", today: dt.date | None = None) -> Path:
    """Used by the learn step: writes a lesson file and re-parses it (so a bad one fails here). With
    a `signature`, a lesson of the folder that has it is updated instead (the module docstring)."""
    root.mkdir(parents=True, exist_ok=True)
    file = root / f"{slug}.md"
    extra: dict = {}
    if signature:
        day = (today or dt.date.today()).isoformat()
        same = next((le for le in load_lessons(root) if le.signature == signature), None)
        if same is None:
            extra = {"signature": signature, "seen": 1, "first-seen": day, "last-seen": day}
        else:
            file = same.path
            runs = {e for e in evidence if e.startswith("run:")}
            again = not runs & set(same.evidence)  # the same run writing it twice (a resume) counts once
            merged = list(dict.fromkeys(list(evidence) + list(same.evidence)))[:MAX_EVIDENCE]
            evidence = merged
            extra = {"signature": signature, "seen": same.seen + (1 if again else 0),
                     "first-seen": same.first_seen or day, "last-seen": day}
    file.write_text(lesson_text(kind, applies_to, evidence, confidence, body, extra))
    load_lesson(file)
    return file
