"""The dashboard: one issue per engine repository, kept up to date by every run (docs/dashboard.md).

The issue's body is the bot's text in sections, one per workload, between two hidden markers:

    <!-- optbot-dashboard-section: flux2 -->
    ## flux2
    ...the open optimization PR, every candidate's verdict and reason, retired and held entries...
    - [ ] re-run flux2 <!-- optbot-request: rerun flux2 -->
    - [ ] re-validate flux2-merge-qkv <!-- optbot-request: revalidate flux2-merge-qkv -->
    <!-- optbot-dashboard-section-end: flux2 -->

The nightly store check keeps a section of its own, ``STORE_SECTION`` (no workload has that name):
what the last check found for every entry, and where its proposal went (``StoreCheck``).

A run rewrites only its own section (``upsert``); every other byte of the body, other
sections and whatever a person wrote outside them, is kept. A box a maintainer ticks asks the next
run for that work; ``read_requests`` reads the ticked boxes back as typed requests, taking each
name from the box's marker (never from the text beside it) and keeping only names optbot knows.
A box is unticked by the run that did the work: an optimize run when it re-renders its section
(``Section.done``), the store check through ``mark_done``. The forges hold the body: GitHub's in
an issue the bot opened (found by MARKER *and* its author being the bot), the local forge's in a
file (bot/deliver/github.py, local.py: ``dashboard()`` and ``write_dashboard()``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from bot.deliver.pull_request import PullRequestRef

MARKER = "<!-- optbot-dashboard -->"
STORE_SECTION = "store-check"  # the nightly `optbot store check --propose`'s section
TITLE = "optbot dashboard"
KINDS = ("rerun", "revalidate")
MAX_ROWS = 30  # candidates listed per section
NAME = r"[a-z0-9][a-z0-9._-]*"  # workload and entry names as optbot spells them (store.ID_RE)
_START = re.compile(rf"^<!-- optbot-dashboard-section: ({NAME}) -->\r?$", re.M)
_BOX = re.compile(r"^- \[([ xX])\] [^\r\n]*?<!-- optbot-request: ([^\r\n]*?) -->\r?$", re.M)
HEADER = (f"{MARKER}\n# {TITLE}\n\n"
          "Kept up to date by optbot: every `optbot optimize` run rewrites its workload's section below, the "
          "nightly store check its own. "
          "Tick a box to ask for the work it names: the nightly run reads ticked boxes, and the run that did "
          "the work unticks its box. Text you write outside the sections is kept.\n")


def _end(workload: str) -> re.Pattern:
    return re.compile(rf"^<!-- optbot-dashboard-section-end: {re.escape(workload)} -->\r?(\n|$)", re.M)


# ------------------------------------------------------------------------------------------------
# the model

@dataclass
class CandidateRow:
    id: str
    generator: str
    kind: str
    entry: str  # the kernel_store entry it replays or became ("" when none)
    verdict: str  # accepted | rejected | held | not validated
    reason: str  # the verdict's reason (Verdict.REASONS), "" when accepted
    summary: str  # the validator's one line
    speed: str = ""  # eager speedup and the device that measured it, e.g. "1.111x (cuda)"


@dataclass
class EntryRow:
    id: str
    why: str


@dataclass
class Section:
    """One workload's part of the dashboard, from one run's typed results (``section_of_run``)."""
    workload: str
    run_id: str
    base_sha: str
    preset: str
    device: str
    pull_request: PullRequestRef  # the run's engine PR (deliver step)
    candidates: list[CandidateRow] = field(default_factory=list)
    stack: str = ""  # the stack's verdict line (combine)
    retired: list[EntryRow] = field(default_factory=list)
    held: list[EntryRow] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)  # the workload's store entries: a re-validate box each
    done: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) this run did: unticked

    @property
    def name(self) -> str:
        return self.workload

    def render(self, keep_ticked: set[tuple[str, str]] = frozenset()) -> str:
        return render_section(self, keep_ticked)


@dataclass
class StoreCheckRow:
    entry: str
    outcome: str  # holds | environment-changed | no-longer-applies | no-longer-wins | needs-a-person | not-checked
    action: str  # what was done or proposed: none | re-recorded | re-tuned ... | retired
    why: str
    measured_on: str


@dataclass
class StoreCheck:
    """The nightly store check's section, from its proposal (bot/knowledge/upkeep.Proposal)."""
    when: str
    engine: str
    tip: str
    device: str
    command: str
    pull_request: PullRequestRef  # the proposal's knowledge PR
    rows: list[StoreCheckRow] = field(default_factory=list)
    done: list[tuple[str, str]] = field(default_factory=list)  # every entry checked: its re-validate box

    name = STORE_SECTION

    def render(self, keep_ticked: set[tuple[str, str]] = frozenset()) -> str:
        return render_store_check(self, keep_ticked)


@dataclass
class Piece:
    """A stretch of the body: a section (workload set, markers included) or text around them."""
    workload: str | None
    text: str


@dataclass
class Box:
    section: str  # the workload whose section holds the box
    checked: bool
    request: str  # the marker's text, as written (possibly hostile)


@dataclass
class Refused:
    section: str
    request: str  # ascii-escaped and cut: safe to print in a log
    reason: str


@dataclass
class Requests:
    """What the ticked boxes ask, each name checked against what optbot knows."""
    source: str  # the URL or the local file
    rerun: list[str] = field(default_factory=list)  # workloads
    revalidate: list[str] = field(default_factory=list)  # kernel_store entry ids
    refused: list[Refused] = field(default_factory=list)


@dataclass
class Found:
    """The dashboard as a forge holds it."""
    body: str
    open: bool = True  # False: a person closed the issue (the bot does not reopen it)
    number: int | None = None
    url: str = ""


# ------------------------------------------------------------------------------------------------
# the body: pieces, sections, boxes

def split(body: str) -> list[Piece]:
    """The body as pieces whose texts join back to it byte for byte. A start marker without its
    end marker before the next start is text, not a section (a person's edit never loses text)."""
    pieces, pos = [], 0
    starts = list(_START.finditer(body))
    for i, m in enumerate(starts):
        if m.start() < pos:
            continue
        limit = starts[i + 1].start() if i + 1 < len(starts) else len(body)
        end = _end(m.group(1)).search(body, m.end(), limit)
        if end is None:
            continue
        if m.start() > pos:
            pieces.append(Piece(None, body[pos:m.start()]))
        pieces.append(Piece(m.group(1), body[m.start():end.end()]))
        pos = end.end()
    if pos < len(body):
        pieces.append(Piece(None, body[pos:]))
    return pieces


def boxes(body: str) -> list[Box]:
    """Every request box inside a section; boxes outside the bot's sections are not requests."""
    return [Box(p.workload, m.group(1) != " ", m.group(2))
            for p in split(body) if p.workload for m in _BOX.finditer(p.text)]


def upsert(body: str | None, text: str, workload: str) -> str:
    """``body`` with ``workload``'s section replaced by ``text`` (a later duplicate of it dropped),
    or appended; every other piece kept as it was. No body (or not the bot's) starts from HEADER."""
    if body is None or MARKER not in body:
        return HEADER + "\n" + text
    out, placed = [], False
    for p in split(body):
        if p.workload != workload:
            out.append(p.text)
        elif not placed:
            out.append(text)
            placed = True
    joined = "".join(out)
    if not placed:
        joined += ("" if joined.endswith("\n") else "\n") + "\n" + text
    return joined


def ticked(body: str | None, workload: str) -> set[tuple[str, str]]:
    """The (kind, name) requests ticked in ``workload``'s section now."""
    out = set()
    for b in boxes(body or ""):
        parts = b.request.split(" ")
        if b.section == workload and b.checked and len(parts) == 2:
            out.add((parts[0], parts[1]))
    return out


def mark_done(body: str, done: list[tuple[str, str]], workload: str | None = None) -> str:
    """Untick the boxes of ``done`` (kind, name), in every section or in ``workload``'s only,
    changing nothing else: how a run that did the work without re-rendering a section (the store
    check) says so."""
    want = {f"{k} {n}" for k, n in done}
    out = []
    for p in split(body):
        if p.workload is None or (workload is not None and p.workload != workload):
            out.append(p.text)
            continue
        out.append(_BOX.sub(lambda m: m.group(0).replace("- [x]", "- [ ]", 1).replace("- [X]", "- [ ]", 1)
                            if m.group(2) in want else m.group(0), p.text))
    return "".join(out)


# ------------------------------------------------------------------------------------------------
# reading the requests back

def _safe(text: str, n: int = 80) -> str:
    """A name from the body as it may be shown: ascii-escaped (no control characters, no workflow
    command at a line start) and cut."""
    s = ascii(text)
    return s if len(s) <= n else s[:n - 3] + "..."


def read_requests(body: str | None, source: str, workloads: list[str], entries: list[str]) -> Requests:
    """The ticked boxes as typed requests. A name counts only where it is one of ``workloads`` (the
    workloads optbot knows) or ``entries`` (the store's entry ids), and a re-run only in its own
    workload's section; the name returned is optbot's own string, never the body's."""
    req = Requests(source)
    known_w, known_e = {w: w for w in workloads}, {e: e for e in entries}
    for b in boxes(body or ""):
        if not b.checked:
            continue
        kind, _, name = b.request.partition(" ")
        why = ""
        if kind not in KINDS or not name or " " in name:
            why = f"not a request optbot writes (expected one of: {', '.join(f'{k} NAME' for k in KINDS)})"
        elif kind == "rerun" and name not in known_w:
            why = f"not a workload optbot knows (known: {', '.join(workloads) or 'none'})"
        elif kind == "rerun" and name != b.section:
            why = f"a re-run box asks only for its own section's workload ({b.section})"
        elif kind == "revalidate" and name not in known_e:
            why = "not an entry of the kernel store"
        if why:
            req.refused.append(Refused(b.section, _safe(b.request), why))
            continue
        lst, name = (req.rerun, known_w[name]) if kind == "rerun" else (req.revalidate, known_e[name])
        if name not in lst:
            lst.append(name)
    req.rerun.sort()
    req.revalidate.sort()
    return req


# ------------------------------------------------------------------------------------------------
# rendering a section

def _cell(text: str, n: int = 160) -> str:
    """Text of a run (a validator's summary, a candidate id) as one table cell: one line, no pipe,
    no angle bracket (so it can never make a marker or a box), cut at ``n``."""
    s = " ".join(str(text or "").split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    s = s.replace("`", "'")
    return s if len(s) <= n else s[:n - 1] + "…"


def _pr_line(pr: PullRequestRef) -> str:
    if pr.action in ("opened", "updated") and pr.number is not None:
        return f"[#{pr.number}]({pr.url}) (open; {pr.action} by this run)"
    if pr.action == "closed-by-person":
        return f"#{pr.number} was closed by a person; the bot does not reopen it"
    if pr.action == "merged":
        return f"#{pr.number} was merged"
    if pr.action == "local":
        return f"local branch only ({_cell(pr.url, 300)})"
    return _cell(pr.note or pr.action) or "none"


def render_section(s: Section, keep_ticked: set[tuple[str, str]] = frozenset()) -> str:
    """The section's markdown, markers included. A box ticked before (``keep_ticked``) stays ticked
    unless this run did its work (``s.done``)."""
    still = set(keep_ticked) - set(s.done)

    def box(kind: str, name: str, label: str) -> str:
        return f"- [{'x' if (kind, name) in still else ' '}] {label} <!-- optbot-request: {kind} {name} -->"

    w = s.workload
    lines = [f"<!-- optbot-dashboard-section: {w} -->", f"## {w}", "",
             f"Last run `{_cell(s.run_id)}` at base `{s.base_sha[:12]}` (preset {_cell(s.preset)}, "
             f"device {_cell(s.device)}).", "", f"**Optimization PR:** {_pr_line(s.pull_request)}", ""]
    if s.candidates:  # GitHub caps an issue body at 65,536 characters: a section keeps the first MAX_ROWS
        shown = s.candidates[:MAX_ROWS]
        lines += ["| candidate | generator | kind | entry | verdict | speedup (eager) | reason |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {_cell(c.id)} | {_cell(c.generator)} | {_cell(c.kind)} | {_cell(c.entry) or '-'} | "
                  f"{_cell(c.verdict)} | {_cell(c.speed) or '-'} | "
                  + ("-" if c.verdict == "accepted" else
                     _cell(c.reason or "-") + (f": {_cell(c.summary)}" if c.summary else "")) + " |"
                  for c in shown]
        if len(s.candidates) > len(shown):
            lines += ["", f"... and {len(s.candidates) - len(shown)} more candidates: see the run's report."]
    else:
        lines.append("No candidates in this run.")
    if s.stack:
        lines += ["", f"Stack: {_cell(s.stack, 300)}"]
    for title, rows in (("Retired entries", s.retired), ("Held for review", s.held)):
        lines += ["", f"**{title}:**" + (" none" if not rows else "")]
        lines += [f"- `{_cell(r.id)}`: {_cell(r.why, 240)}" for r in rows]
    lines += ["", "**Requests** (tick a box; the run that does the work unticks it):", "",
              box("rerun", w, f"re-run {w}")]
    lines += [box("revalidate", e, f"re-validate {e}") for e in s.entries]
    lines.append(f"<!-- optbot-dashboard-section-end: {w} -->")
    return "\n".join(lines) + "\n"


def render_store_check(s: StoreCheck, keep_ticked: set[tuple[str, str]] = frozenset()) -> str:
    """The nightly store check's section, markers included; its re-validate boxes unticked for
    every entry it checked (``s.done``)."""
    still = set(keep_ticked) - set(s.done)
    n = STORE_SECTION
    at = f" at `{s.tip[:12]}`" if s.tip else ""
    lines = [f"<!-- optbot-dashboard-section: {n} -->", "## nightly store check", "",
             f"Last check {_cell(s.when)}: every entry against `{_cell(s.engine)}`{at}, on "
             f"{_cell(s.device)} (`{_cell(s.command, 200)}`).", "",
             f"**Proposal:** {_pr_line(s.pull_request)}", ""]
    if s.rows:
        lines += ["| entry | outcome | action | why | measured on |", "|---|---|---|---|---|"]
        lines += [f"| {_cell(r.entry)} | {_cell(r.outcome)} | {_cell(r.action)} | {_cell(r.why, 240)} | "
                  f"{_cell(r.measured_on)} |" for r in s.rows[:MAX_ROWS]]
        if len(s.rows) > MAX_ROWS:
            lines += ["", f"... and {len(s.rows) - MAX_ROWS} more entries: see the proposal."]
    else:
        lines.append("No entry was checked.")
    lines += ["", "**Requests** (tick a box; the next nightly check re-validates every entry and unticks it):", ""]
    lines += [f"- [{'x' if ('revalidate', r.entry) in still else ' '}] re-validate {r.entry} "
              f"<!-- optbot-request: revalidate {r.entry} -->" for r in s.rows]
    lines.append(f"<!-- optbot-dashboard-section-end: {n} -->")
    return "\n".join(lines) + "\n"


def store_check_of(proposal, when: str) -> StoreCheck:
    """The section of one nightly check: ``proposal`` its bot/knowledge/upkeep.Proposal, published."""
    rows = [StoreCheckRow(d.entry_id, d.outcome, d.done or d.action, d.why, d.measured_on) for d in proposal.decisions]
    return StoreCheck(when, proposal.engine, proposal.tip, proposal.device, proposal.command,
                      proposal.pr or PullRequestRef("none"), rows,
                      [("revalidate", d.entry_id) for d in proposal.decisions if d.outcome != "not-checked"])


# ------------------------------------------------------------------------------------------------
# from a run, to a forge

def section_of_run(res, run_id: str, pull_request: PullRequestRef, store_entries: list) -> Section:
    """The section of one optimize run: ``res`` its typed results (bot/run/state.Results),
    ``store_entries`` the kernel store's entries (bot/knowledge/store.Entry)."""
    co = res.checkout
    w = co.workload
    verdicts = res.validate.verdicts if res.validate else {}
    cands = res.generate.candidates if res.generate else []
    rows, fresh = [], {}
    for c in cands:
        v = verdicts.get(c.id)
        sp = next((x for x in (v.speed if v else []) if x.mode == "eager" and x.speedup), None)
        rows.append(CandidateRow(c.id, c.generator, c.kind, c.entry_id, v.status if v else "not validated",
                                 (v.reason or "") if v else "", v.summary if v else "",
                                 f"{sp.speedup:.3f}x ({sp.device})" if sp else ""))
        if v is not None and c.entry_id and not v.reused_from:
            fresh[c.entry_id] = v  # measured now: newer than anything recorded
    mine = sorted((e for e in store_entries if w in e.workloads), key=lambda e: e.id)
    retired = [EntryRow(e.id, f"retired: {e.retired.reason}" if e.retired else f"status retired: {e.title}")
               for e in mine if e.status == "retired"]
    held = []
    for e in mine:
        if e.id in fresh:
            v = fresh[e.id]
            if v.status == "held":
                held.append(EntryRow(e.id, f"held in this run: {v.summary}"))
            continue
        why = _recorded_hold(e, w)
        if why:
            held.append(EntryRow(e.id, why))
    comb = res.combine
    stack = ""
    if comb is not None:
        sv = comb.stack_verdict
        stack = (f"{len(comb.commits)} commit(s) on {comb.branch}"
                 + (f"; {sv.status}" + (f" ({sv.reason})" if sv.reason else "") + f": {sv.summary}" if sv else "")
                 + "".join(f"; dropped {d}" for d in comb.dropped))
    done = [("rerun", w)] + [("revalidate", e) for e in sorted(fresh)]
    return Section(w, run_id, co.base_sha, co.preset, co.device, pull_request, rows, stack, retired, held,
                   [e.id for e in mine], done)


def _recorded_hold(entry, workload: str) -> str:
    """Why the entry is held on ``workload`` by its recorded verdicts (bench.json), or ""."""
    b = entry.bench()
    recs = [("gpu", b.gpu.validation if b.gpu else None),
            ("cpu", b.correctness.cpu_validation if b.correctness else None)]
    for where, rec in recs:
        wv = rec.workloads.get(workload) if rec else None
        if wv is not None and wv.status == "held":
            return f"{where} verdict held, recorded {rec.recorded_at or '?'} by `{rec.command or '?'}`: {wv.summary or ''}"
    return ""


def update(forge, section: Section | StoreCheck) -> PullRequestRef:
    """Rewrite ``section``'s part of the forge's dashboard (a workload's, or the store check's),
    keeping every other byte."""
    found = forge.dashboard()
    if found is not None and not found.open:
        return PullRequestRef("closed-by-person", found.number, found.url,
                              f"dashboard issue #{found.number} was closed by a person; the bot does not reopen it")
    before = found.body if found else None
    body = upsert(before, section.render(ticked(before, section.name)), section.name)
    return forge.write_dashboard(body)


def record_done(forge, done: list[tuple[str, str]], workload: str | None = None) -> PullRequestRef:
    """Untick ``done``'s boxes on the forge's dashboard (``mark_done``); nothing when there is none."""
    found = forge.dashboard()
    if found is None or not found.open:
        return PullRequestRef("none", note="no open dashboard")
    body = mark_done(found.body, done, workload)
    if body == found.body:
        return PullRequestRef("none", found.number, found.url, "no ticked box of that work")
    return forge.write_dashboard(body)
