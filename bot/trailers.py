"""Optbot-* git trailers (DESIGN decision 5): the one parser.

Every reader of candidate metadata (the validator's bot/validate/resolve.py, the generators'
bot/generate/candidate.py, the optimize stages, the agent) goes through here, so they agree on
where trailers are and what a value means:
  - trailers are the `Optbot-<Name>: value` lines of the message's last paragraph (where git puts
    trailers; an `Optbot-` line in the prose above is not one); a line starting with whitespace
    continues the previous value (git's folding);
  - a value is comma-separated; "none" is how a commit says it declares nothing (make_trailers
    writes it for empty lists), so it reads as no values;
  - a key given twice keeps every value, in order, without repeats.
Pure Python: imported by the bot side only, never needs git or torch.
"""
from __future__ import annotations

import re

_LINE = re.compile(r"^(Optbot-[A-Za-z0-9-]+):[ \t]*(.*)$")


def trailer_pairs(message: str) -> list[tuple[str, str]]:
    """(key, raw value) per Optbot-* trailer line of the last paragraph, in order."""
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", message.strip()) if p.strip()]
    if not paragraphs:
        return []
    out: list[tuple[str, str]] = []
    for line in paragraphs[-1].splitlines():
        m = _LINE.match(line.rstrip())
        if m:
            out.append((m.group(1), m.group(2).strip()))
        elif out and line[:1] in (" ", "\t") and line.strip():
            out[-1] = (out[-1][0], f"{out[-1][1]} {line.strip()}".strip())
    return out


def trailer_values(value: str | None) -> list[str]:
    """'a, b' -> ['a', 'b']; '', None and 'none' -> []."""
    return [v.strip() for v in (value or "").split(",") if v.strip() and v.strip().lower() != "none"]


def parse_trailer_lists(message: str) -> dict[str, list[str]]:
    """{key: values}: the validator's view (a stack merges these over its commits)."""
    out: dict[str, list[str]] = {}
    for k, v in trailer_pairs(message):
        vals = out.setdefault(k, [])
        vals += [x for x in trailer_values(v) if x not in vals]
    return out


def parse_trailers(message: str) -> dict[str, str]:
    """{key: value as written}: the generators' view (keeps "none", so a message round-trips).
    A key given twice has its values joined with ", "."""
    out: dict[str, str] = {}
    for k, v in trailer_pairs(message):
        out[k] = f"{out[k]}, {v}" if k in out else v
    return out
