"""lessons/<slug>.md: what the bot (or a person) learned, as reviewable markdown.

    ---
    kind: caveat | pattern
    applies-to: {pattern: <opportunity kind>, engine: diffusers, hardware: h200, ...}
    evidence: [kernel_store entry ids, run ids, test paths]
    confidence: low | medium | high
    ---
    Short body: what was tried, what happened, why.

Where the lessons are comes from location.py: a `root` of None below means its lessons folder.
"""
from __future__ import annotations

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
    return Lesson(slug, kind, title, dict(applies), tuple(evidence), conf, body, file)


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
        scored.append((-score, rank, lesson.slug, lesson))
    return [t[-1] for t in sorted(scored, key=lambda t: t[:3])]


def write_lesson(root: Path, slug: str, kind: str, applies_to: dict, evidence: list[str], confidence: str, body: str) -> Path:
    """Used by the learn step: writes a lesson file and re-parses it (so a bad one fails here)."""
    root.mkdir(parents=True, exist_ok=True)
    file = root / f"{slug}.md"
    meta = {"kind": kind, "applies-to": applies_to, "evidence": evidence, "confidence": confidence}
    file.write_text("---\n" + yaml.safe_dump(meta, sort_keys=False).strip() + "\n---\n" + body.strip() + "\n")
    load_lesson(file)
    return file
