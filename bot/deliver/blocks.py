"""The blocks a report is built of (headings, paragraphs, tables, code, <details>, images), and their
markdown (pull request bodies, report.md) and HTML (report.html) renderings. bot/deliver/report.py
builds the run's report from them; bot/deliver/left.py its "What is left" section.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field


def fmt_ms(x) -> str:
    """A millisecond figure as every table prints it (three decimals), or n/a."""
    return "n/a" if x is None else f"{x:.3f}"


@dataclass
class H:
    level: int
    text: str


@dataclass
class P:
    text: str


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Code:
    text: str


@dataclass
class Details:
    summary: str
    blocks: list = field(default_factory=list)


@dataclass
class Img:
    alt: str
    src: str


def to_markdown(blocks: list) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, H):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, P):
            out.append(b.text)
        elif isinstance(b, Table):
            esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in r] for r in b.rows]
            out.append("| " + " | ".join(b.header) + " |\n|" + "---|" * len(b.header) + "\n"
                       + "\n".join("| " + " | ".join(r) + " |" for r in esc))
        elif isinstance(b, Code):
            out.append("```\n" + b.text.rstrip() + "\n```")
        elif isinstance(b, Details):
            out.append(f"<details><summary>{html.escape(b.summary)}</summary>\n\n{to_markdown(b.blocks)}\n\n</details>")
        elif isinstance(b, Img):
            out.append(f"![{b.alt}]({b.src})")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _inline_html(text: str) -> str:
    """Escapes, then renders `code` and [text](url) (the only inline markup our blocks use)."""
    import re
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)
    return s


def to_html(blocks: list, title: str = "optbot report") -> str:
    def render(bs: list) -> str:
        parts = []
        for b in bs:
            if isinstance(b, H):
                parts.append(f"<h{b.level}>{_inline_html(b.text)}</h{b.level}>")
            elif isinstance(b, P):
                parts.append("<p>" + "<br>".join(_inline_html(ln) for ln in b.text.splitlines()) + "</p>")
            elif isinstance(b, Table):
                head = "".join(f"<th>{_inline_html(h)}</th>" for h in b.header)
                rows = "".join("<tr>" + "".join(f"<td>{_inline_html(str(c))}</td>" for c in r) + "</tr>" for r in b.rows)
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            elif isinstance(b, Code):
                parts.append(f"<pre><code>{html.escape(b.text)}</code></pre>")
            elif isinstance(b, Details):
                parts.append(f"<details><summary>{html.escape(b.summary)}</summary>{render(b.blocks)}</details>")
            elif isinstance(b, Img):
                parts.append(f'<img alt="{html.escape(b.alt)}" src="{html.escape(b.src)}" style="max-width:720px">')
        return "\n".join(parts)

    css = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
           "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:3px 8px;text-align:left}"
           "pre{background:#f4f4f4;padding:.6em;overflow-x:auto}code{background:#f4f4f4}")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{css}</style></head><body>\n{render(blocks)}\n</body></html>\n")


# ------------------------------------------------------------------------------------------------
# numbers
