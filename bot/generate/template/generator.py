"""generate_templates(): fuse-norm-consumer and fuse-elementwise-chain opportunities -> candidate
commits written by rule (lift -> emit -> wire), each with its store-entry files.

Per opportunity: its first instance (in op order) is lifted; the emitted kernel module goes into a
package folder beside the engine file (`optbot_kernels/`), the one engine statement is rewritten,
and the worktree is committed with the Optbot-* trailers. The entry files (entry.yaml named
`<workload>-fuse-<module pattern>`, the kernel module, its test, config_space, patch.diff,
bench.json) are written by the learn step's writer (bot/knowledge/learn.write_entry) with status
`candidate`, into `entries_dir` (the run's folder, not the store: validation decides what is kept).
A refused opportunity is a result with the reason, for the agent to take over.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bot.analyze.graph import Graph
from bot.analyze.opportunity import Opportunity
from bot.engine import EngineCheckout, add_worktree, remove_worktree
from bot.generate.candidate import Candidate, commit_message, make_trailers
from bot.generate.commits import commit_all, run_git
from bot.generate.template.emit import Emitted, describe, emit
from bot.generate.template.lift import Program, Refused, instances, lift
from bot.generate.template.across import rewrite
from bot.generate.template.wire import PACKAGE_INIT, Rewrite
from bot.knowledge.learn import Outcome, write_entry

KINDS = ("fuse-norm-consumer", "fuse-elementwise-chain")
GENERATOR = "template"
# An opportunity estimated under this share of the step is not written: the validator cannot tell
# it from noise (A/A noise is about 1% of a step on the H200, benchmarks/results/), so it would be
# rejected "no-change" after a full validation in every production mode (250-300 GPU-s on FLUX.2
# full, benchmarks/results/h200-template-20261202/). On FLUX.2 full that leaves the single blocks'
# SwiGLU (18.2 ms) and norm (7.1 ms) and drops norm_out (0.16 ms) and the 0.01 ms timestep chains.
MIN_GAIN_PCT = 0.5


@dataclass
class TemplateResult:
    opportunity_id: str
    status: str  # candidate | refused | covered | small | duplicate | error
    reason: str
    candidate: Candidate | None = None
    entry_dir: Path | None = None
    program: str = ""  # the lifted op sequence, e.g. "layer_norm -> mul -> add"
    worktree: str = ""


@dataclass(frozen=True)
class TemplateContext:
    """What the generator needs besides the checkout, graph and opportunities."""
    workload: str
    engine: str
    engine_source: str
    hardware: str
    run_id: str
    entries_dir: Path  # where the entry folders go (the run's directory)
    covered: frozenset[str] = field(default_factory=frozenset)  # opportunity ids a replayed entry covers
    min_gain_pct: float = MIN_GAIN_PCT  # 0 writes every opportunity (tests of small models)
    dtype: str = "float32"  # the run's activation dtype (the target's), recorded in the entry
    # base-side lines other candidates change: (file relative to the import root, first, last, who);
    # a replayed entry's patch often rewrites more than the opportunity it was matched to
    claimed: tuple[tuple[str, int, int, str], ...] = ()


def changed_lines(checkout: EngineCheckout, sha: str, who: str) -> list[tuple[str, int, int, str]]:
    """The base-side line ranges commit `sha` changes, per file relative to the import root."""
    diff = run_git(checkout.repo_path, "diff", "--unified=0", "--no-color", checkout.base_sha, sha).stdout
    root = (checkout.import_root.rstrip("/") + "/") if checkout.import_root else ""
    out, path = [], ""
    for line in diff.splitlines():
        if line.startswith("--- "):
            path = line[6:] if line.startswith("--- a/") else ""
            path = path[len(root):] if root and path.startswith(root) else path
        m = re.match(r"^@@ -(\d+)(?:,(\d+))? ", line)
        if m and path:
            start, n = int(m.group(1)), int(m.group(2) or 1)
            out.append((path, start if n else start + 1, start + max(n, 1) - 1, who))
    return out


def entry_name(workload: str, pattern: str, taken: set[str]) -> str:
    base = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", f"{workload}-fuse-{pattern}".lower().replace("*", ""))).strip("-")
    name, k = base[:80], 2
    while name in taken:
        name, k = f"{base[:76]}-{k}", k + 1
    taken.add(name)
    return name


def generate_templates(checkout: EngineCheckout, graph: Graph, opportunities: list[Opportunity],
                       ctx: TemplateContext) -> list[TemplateResult]:
    out: list[TemplateResult] = []
    taken: set[str] = set()
    # (engine file, line) of every statement a candidate rewrote -> that opportunity: opportunities at
    # different module patterns often run one statement (FLUX.2's three SwiGLU sites are one
    # Flux2SwiGLU.forward line), and a second rewrite of it is the same change validated again
    written: dict[tuple[str, int], str] = {}
    for opp in opportunities:
        if opp.kind not in KINDS:
            continue
        if opp.id in ctx.covered:
            out.append(TemplateResult(opp.id, "covered", "a replayed store entry covers it"))
            continue
        if opp.gain_pct < ctx.min_gain_pct:
            out.append(TemplateResult(opp.id, "small", f"estimated {opp.gain_ms:.3g} ms ({opp.gain_pct:.2g}% of the step) "
                                      f"is under {ctx.min_gain_pct}%: below what the validator can tell from noise"))
            continue
        try:
            p = lift(graph, opp, instances(graph, opp)[0])
            e = emit(p)
            out.append(_commit(checkout, opp, p, e, ctx, taken, written))
        except Refused as why:
            out.append(TemplateResult(opp.id, "refused", str(why)))
    return out


def _commit(checkout: EngineCheckout, opp: Opportunity, p: Program, e: Emitted, ctx: TemplateContext,
            taken: set[str], written: dict[tuple[str, int], str]) -> TemplateResult:
    wt = add_worktree(checkout, f"template-{opp.id}")
    root = wt / checkout.import_root if checkout.import_root else wt
    try:
        rw: Rewrite = rewrite(p, e, root)
    except Refused:
        remove_worktree(checkout, wt)  # nothing was written: no worktree left behind for a refusal
        raise
    who = next((c[3] for c in ctx.claimed for first, last in rw.spans
                if c[0] == rw.engine_file and c[1] <= last and first <= c[2]), None)
    if who is not None:
        remove_worktree(checkout, wt)
        return TemplateResult(opp.id, "covered", f"{rw.engine_file}:{rw.line} is changed by {who}: the two would "
                              "not stack", program=describe(p))
    first = written.setdefault((rw.engine_file, rw.line), opp.id)
    if first != opp.id:
        remove_worktree(checkout, wt)
        return TemplateResult(opp.id, "duplicate", f"{rw.engine_file}:{rw.line} is the statement template-{first} "
                              "rewrites: one kernel there serves both", program=describe(p))
    (root / rw.engine_file).write_text(rw.source)
    kfile = root / rw.kernel_file
    kfile.parent.mkdir(parents=True, exist_ok=True)
    init = kfile.parent / "__init__.py"
    if not init.exists():
        init.write_text(PACKAGE_INIT)
    kfile.write_text(e.module_source)
    # the test goes into the commit beside its kernel and is declared, so that the validator's kernel
    # check runs it at the graph's shapes (as it does an agent's) and learn keeps it with the entry
    tfile = kfile.parent / f"test_{e.op_name}.py"
    tfile.write_text(e.test_source)
    rel = lambda f: str(Path(checkout.import_root) / f) if checkout.import_root else f  # noqa: E731
    test_rel = rel(str(tfile.relative_to(root)))
    trailers = make_trailers(opp.id, opp.kind, [e.kernel_name], [], "", generator=GENERATOR, run_id=ctx.run_id,
                             kernel_tests=[test_rel])
    title = f"optbot: fuse {describe(p)} at {opp.location.module_pattern} into one Triton row kernel"
    body = (f"Template-generated (no LLM) for {opp.kind} {opp.id} ({opp.location.instances} instances; "
            f"estimated {opp.gain_ms} ms).\n\n{rw.engine_file}:{rw.line}\n  was: {rw.old_statement}\n"
            f"  now: {rw.new_statement}\nKernel module: {rw.kernel_file} ({e.kernel_name}).")
    sha, err = commit_all(wt, commit_message(title, body, trailers))
    if not sha:
        return TemplateResult(opp.id, "error", err, program=describe(p), worktree=str(wt))
    patch = run_git(wt, "diff", checkout.base_sha, sha).stdout
    kernel_rel = rel(rw.kernel_file)
    name = entry_name(ctx.workload, opp.location.module_pattern, taken)
    outcome = Outcome(
        candidate_id=f"template-{opp.id}", kind=opp.kind, generator=GENERATOR, run_id=ctx.run_id, status="candidate",
        reason="template-generated, not validated yet", numbers={}, device="", hardware=ctx.hardware,
        engine=ctx.engine, engine_source=ctx.engine_source, base_sha=checkout.base_sha, commit_sha=sha, title=title,
        patch=patch, changed_files=[rel(rw.engine_file), kernel_rel, test_rel],
        added_files={kernel_rel: e.module_source, test_rel: e.test_source},
        workload=ctx.workload, dtype=ctx.dtype, adds_kernels=[e.kernel_name], entry_name=name, entry_status="candidate",
        config_space=e.config_space)
    entry_dir = write_entry(outcome, ctx.entries_dir)
    cand = Candidate(id=f"template-{opp.id}", opportunity_id=opp.id, kind=opp.kind, generator=GENERATOR,
                     worktree=str(wt), commit_sha=sha, base_sha=checkout.base_sha, entry_id="",
                     adds_kernels=[e.kernel_name], trailers=trailers, title=title,
                     estimated_gain_ms=opp.gain_ms)
    return TemplateResult(opp.id, "candidate", f"rewrote {rw.engine_file}:{rw.line} as {sha[:12]}", cand, entry_dir,
                          describe(p), str(wt))
