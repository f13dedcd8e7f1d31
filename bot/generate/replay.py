"""Store replay: kernel_store entries -> candidates for the current opportunities.

An entry matches an opportunity when its pattern is the opportunity's kind, its engine is the
engine in use and it lists the hardware (and, when the entry names workloads, the workload). Each
matched entry is applied once (for the first, i.e. highest-ranked, opportunity it matches) in its
own worktree with ``git apply --3way`` and committed with the Optbot-* trailers (DESIGN decision 5).
A patch that does not apply is recorded as a typed ReplayResult with status "conflict" and the
conflicted files; it never stops the run. An entry whose unchanged patch a person declined in review
of the same engine and workload (a review caveat in lessons/, bot/knowledge/review.declined) is
recorded as "skipped" with the lesson and pull request that declined it, and not applied.

Under torch.compile a store kernel is a registered op, one node inductor cannot fuse into. Where the
entry's recorded GPU microbenchmark on this hardware lost to the reference compiled by inductor at
every shape (bench.json gpu.micro, `vs_compiled`), the replayed kernel files get
`UNDER_COMPILE = "reference"`: under compile they run the torch reference ops, which inductor fuses,
and eager and CUDA-graph runs keep the kernel. The same where, at a place the entry acts on
(entry_places), its kernel computes a value an FP8 GEMM's per-token quantization reads (the
analyzer's `quantized_by`, a precision with a quantization recipe): as one opaque node the kernel writes its bf16 output and the
quantization reads it back, where inductor, seeing the reference ops, computes the norm (or
activation) and the quantization in one pass that writes only the float8 values and scales (for a
[tokens, width] bf16 activation 7 bytes per element moved against 3). The commit body says so, and
the verdict is measured afresh (it is not the entry patch's).
"""
from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from bot.analyze.opportunity import Opportunity, stand_in_at, stand_in_spans
from bot.engine import EngineCheckout, add_worktree
from bot.generate.candidate import Candidate, commit_message, make_trailers
from bot.generate.commits import commit_all, run_git
from bot.knowledge.records import bench_file, read_bench
from bot.knowledge.review import declined
from bot.knowledge.store import (UNDER_COMPILE_OP, UNDER_COMPILE_REFERENCE, UNUSABLE, Entry, load_store,
                                 patch_added_files)


@dataclass
class ReplayResult:
    entry_id: str
    opportunity_id: str
    status: str  # applied | conflict | error | skipped (a review caveat) | retired (entry.yaml `retired:`)
    reason: str = ""
    worktree: str = ""
    conflicts: list[str] = field(default_factory=list)
    candidate: Candidate | None = None
    under_compile: str = "op"  # "reference": its kernels step aside under torch.compile (module docstring)
    under_compile_why: str = ""  # why they step aside (the variant search's commit keeps the same choice)

    def to_json(self) -> dict:
        d = asdict(self)
        d["candidate"] = self.candidate.to_json() if self.candidate else None
        return d


def match(entries: Iterable[Entry], opportunities: list[Opportunity], engine: str, hardware: str | None,
          workload: str | None = None, unusable: bool = False, modes: tuple[str, ...] = (),
          precision: str = "") -> list[tuple[Entry, str]]:
    """(entry, opportunity id) pairs: each usable entry once, for the first opportunity it fits
    (unusable=True: the rejected and retired entries that would have fitted instead). An entry that
    enables modes (entry.yaml `enables:`) fits, with no opportunity (id ""), a run that checks one of
    them (`modes`, the validator's) at one of its dtypes (`precision`)."""
    out = []
    for e in entries:
        if (e.status in UNUSABLE) != unusable:
            continue
        if workload and e.workloads and workload not in e.workloads:
            continue
        if e.enables:
            if (e.matches(None, engine, hardware) and set(e.enables) & set(modes)
                    and (not e.dtypes or precision in e.dtypes)):
                out.append((e, ""))
            continue
        for opp in opportunities:
            if e.matches(opp.kind, engine, hardware):
                out.append((e, opp.id))
                break
    return out


def superseded_by(offered: list[str], entries: Iterable[Entry]) -> dict[str, str]:
    """{entry id: the offered entry whose entry.yaml `supersedes` names it, directly or through entries
    it names}. Such an entry's changes are part of the offered one's and their patches conflict:
    combine would keep whichever came first, so the generate step does not offer it (it is offered
    again when the superseding entry is not: no match, a conflict, known rejected on this machine).
    `supersedes` is transitive whether or not the entry between is offered (flux2-fp8-norm-quant
    includes flux2-fp8-swiglu-quant, which does flux2-swiglu's work in FP8), and where several offered
    entries include one, the last superseder stands: flux2-qk-rmsnorm-rope is in
    flux2-qkv-norm-rope-epilogue, and that in flux2-fp8-norm-quant."""
    by_id = {e.id: e for e in entries}

    def included(eid: str) -> set[str]:
        out, todo = set(), list(by_id[eid].supersedes)
        while todo:
            old = todo.pop()
            if old not in out and old != eid:
                out.add(old)
                todo.extend(by_id[old].supersedes if old in by_id else ())
        return out

    incl = {eid: included(eid) for eid in offered if eid in by_id}
    out = {}
    for old in sorted(set().union(*incl.values())):
        sups = [eid for eid in incl if old in incl[eid]]
        last = [eid for eid in sups if not any(eid in incl[o] for o in sups if o != eid)]
        out[old] = (last or sups)[0]
    return out


# Kinds whose kernel computes the opportunity's last value itself (a norm's modulated output, an
# activation, a GEMM with its activation), so the value a quantization reads is the kernel's output.
# For another kind (attention-waste, absorb-bias, ...) an opportunity's data flow says nothing about
# the kernel's output (FLUX.2's QKV epilogue entry and the attention output's layout copy are both
# attention-waste; the copy's output is quantized for to_out, the kernel's q, k, v go to attention).
PRODUCER_KINDS = ("fuse-norm-consumer", "fuse-elementwise-chain", "fuse-gemm-epilogue")


def entry_places(entry: Entry, opportunities: list[Opportunity], matched: str = "") -> list[Opportunity]:
    """The opportunities an entry acts on: those of its kind at the modules its declared removed kernels
    scope (`KERNEL@GLOB`: "aten::silu@*gate_fn" names every SwiGLU gate), else the one it was matched
    to. Replay matches an entry to the first opportunity of its kind, which need not be where its
    kernel runs (FLUX.2's first chain is the modulation MLP's, flux2-swiglu's the gates')."""
    globs = [r.partition("@")[2] for r in entry.removes_kernels if "@" in r]
    if globs:
        return [o for o in opportunities
                if o.kind == entry.pattern and any(fnmatch.fnmatchcase(o.location.module_pattern, g) for g in globs)]
    return [o for o in opportunities if o.id == matched]


def under_compile(entry: Entry, hardware: str | None, places: list[Opportunity] = ()) -> tuple[str, str]:
    """("reference", why) when the entry's recorded GPU microbenchmark on `hardware` lost to the
    reference compiled by inductor at every shape it timed, or when at one of its places (entry_places)
    its kernel's output feeds an FP8 activation quantization (module docstring); else ("op", "")."""
    if not hardware or hardware == "cpu" or not entry.kernel_files():
        return "op", ""
    b = read_bench(bench_file(entry.path))
    micro = b.gpu.micro_on(hardware) if b is not None and b.gpu is not None else None
    rows = [r for t in (micro.tests.values() if micro else []) for r in (t.get("micro") or []) if r.get("vs_compiled")]
    if rows and all(r["vs_compiled"] < 1.0 for r in rows):
        shapes = ", ".join(f"{r['shape']} {r['vs_compiled']:.2f}x" for r in rows)
        return "reference", (f"its recorded microbenchmark on {hardware} loses to inductor's compile of the "
                             f"reference at every shape ({shapes})")
    quantized = [o for o in places if o.quantized_by and o.kind in PRODUCER_KINDS]
    if quantized:
        where = "; ".join(f"{o.location.module_pattern} ({o.id}) by {', '.join(o.quantized_by)}" for o in quantized)
        return "reference", (f"its output is quantized for an FP8 GEMM at {where}: inductor computes it and its "
                             "quantization in one pass, which an opaque op would split")
    return "op", ""


def aside_note(why: str) -> str:
    """The commit body's sentence for kernels that step aside under torch.compile."""
    return f"Under torch.compile its kernels run the torch reference ops (UNDER_COMPILE = \"reference\"), which inductor fuses: {why}."


def _step_aside(wt: Path, entry: Entry) -> str:
    """Write UNDER_COMPILE = "reference" into the entry's kernel files in the worktree; "" when
    done, else why not (a kernel file without the switch). A file that already steps aside (a
    template generator's kernel always does, docs/generate.md) is left as it is."""
    names = {k.name for k in entry.kernel_files()}
    files = [wt / f for f in patch_added_files(entry.patch_path.read_text()) if Path(f).name in names]
    todo = []
    for f in files:
        text = f.read_text()
        if text.count(UNDER_COMPILE_OP) == 1:
            todo.append(f)
        elif not (text.count(UNDER_COMPILE_REFERENCE) == 1 and UNDER_COMPILE_OP not in text):
            return f"{f.name} has no single `{UNDER_COMPILE_OP}` line"
    for f in todo:
        f.write_text(f.read_text().replace(UNDER_COMPILE_OP, UNDER_COMPILE_REFERENCE))
    return "" if files else "the patch adds none of the entry's kernel files"


def apply_entry(checkout: EngineCheckout, entry: Entry, opportunity_id: str = "", name: str | None = None,
                onto: str | None = None, aside: tuple[str, str] = ("op", "")) -> ReplayResult:
    """Apply entry's patch in a fresh worktree at `onto` (default: the base sha) and commit it;
    with aside ("reference", why) its kernels step aside under torch.compile (module docstring)."""
    wt = add_worktree(checkout, name or f"replay-{entry.id}", onto)
    res = ReplayResult(entry.id, opportunity_id, "error", worktree=str(wt))
    proc = run_git(wt, "apply", "--3way", "--whitespace=nowarn", str(entry.patch_path.resolve()))
    if proc.returncode != 0:
        unmerged = run_git(wt, "diff", "--name-only", "--diff-filter=U").stdout.split()
        res.status = "conflict"
        res.conflicts = unmerged
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        res.reason = (f"patch {entry.patch_path} does not apply at {onto or checkout.base_sha[:12]}"
                      + (f"; conflicts in {', '.join(unmerged)}" if unmerged else "")
                      + (f": {msg[-1]}" if msg else ""))
        run_git(wt, "reset", "-q", "--hard")
        run_git(wt, "clean", "-qfd")
        return res
    trailers = make_trailers(opportunity_id, entry.pattern, list(entry.adds_kernels), list(entry.removes_kernels), entry.id)
    body = (f"Replayed from kernel_store/{entry.id} ({entry.provenance.kind}"
            + (f" by {entry.provenance.author}" if entry.provenance.author else "")
            + (f", run {entry.provenance.run_id}" if entry.provenance.run_id else "") + ").\n\n" + entry.description)
    if aside[0] == "reference":
        why_not = _step_aside(wt, entry)
        if why_not:
            res.reason = f"not stepping aside under torch.compile: {why_not}; "
        else:
            res.under_compile, res.under_compile_why = "reference", aside[1]
            body += "\n\n" + aside_note(aside[1])
    msg = commit_message(f"optbot: {entry.title}", body, trailers)
    sha, err = commit_all(wt, msg)
    if not sha:
        res.reason = err
        return res
    res.status = "applied"
    res.reason += (f"applied at {onto or checkout.base_sha[:12]} as {sha[:12]}"
                   + ("; its kernels step aside under torch.compile" if res.under_compile == "reference" else ""))
    res.candidate = Candidate(
        id=f"replay-{entry.id}", opportunity_id=opportunity_id, kind=entry.pattern, generator="replay",
        worktree=str(wt), commit_sha=sha, base_sha=onto or checkout.base_sha, entry_id=entry.id,
        adds_kernels=list(entry.adds_kernels), removes_kernels=list(entry.removes_kernels), trailers=trailers,
        title=entry.title)
    return res


def on_stand_in_code(patch_text: str, code: dict[str, list[str]]) -> str:
    """The stand-in whose code (the runner's `stand_in_code` spans, "engine/file.py:first-last") a
    patch changes, as "NAME (file:line)", or "": lines the patch removes or replaces, by the old
    file's numbers (a pure insertion counts at the line it follows)."""
    spans = stand_in_spans(code)
    path, line = "", 0
    for text in patch_text.splitlines():
        if text.startswith("--- "):
            path = text[4:].strip().removeprefix("a/")
        elif text.startswith("@@ "):
            line = int(text.split()[1].lstrip("-").split(",")[0])
        elif text.startswith(("-", "+")) and not text.startswith(("---", "+++")):
            at = line if text.startswith("-") else line - 1
            hit = stand_in_at(spans, path, at)
            if hit:
                return f"{hit[0]} ({hit[1]}:{at})"
            line += text.startswith("-")
        elif text.startswith(" "):
            line += 1
    return ""


def replay(checkout: EngineCheckout, opportunities: list[Opportunity], engine: str, hardware: str | None,
           workload: str | None = None, store_root: Path | None = None,
           lessons_root: Path | None = None, stand_in_code: dict | None = None,
           modes: tuple[str, ...] = (), precision: str = "") -> list[ReplayResult]:
    """The generator: every matching entry becomes a candidate commit, a recorded conflict, or a
    skip that names the review caveat (in `lessons_root`) that declined its unchanged patch, or the
    stand-in code it would change (`stand_in_code`, the run's environment record: measured against
    code production does not run, its gain would not be one); a retired entry that would have matched
    is a result "retired" with its reason (not applied)."""
    entries = load_store(store_root)
    out = []
    for e, opp_id in match(entries, opportunities, engine, hardware, workload, modes=modes, precision=precision):
        hit = on_stand_in_code(e.patch_path.read_text(), stand_in_code or {})
        why = (f"its patch changes code that runs here only for a stand-in: {hit}" if hit
               else declined(e, engine, workload, lessons_root))
        out.append(ReplayResult(e.id, opp_id, "skipped", why) if why
                   else apply_entry(checkout, e, opp_id, name=f"replay-{e.id}",
                                    aside=under_compile(e, hardware, entry_places(e, opportunities, opp_id))))
    out += [ReplayResult(e.id, opp_id, "retired", e.retired.reason
                         + (f" (checked at {e.retired.engine_sha[:12]}, {e.retired.date})" if e.retired.engine_sha else ""))
            for e, opp_id in match(entries, opportunities, engine, hardware, workload, unusable=True,
                                   modes=modes, precision=precision)
            if e.retired is not None]
    return out
