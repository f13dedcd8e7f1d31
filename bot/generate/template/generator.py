"""generate_templates(): fuse-norm-consumer and fuse-elementwise-chain opportunities -> candidate
commits written by rule (lift -> emit -> wire), each with its store-entry files.

Per opportunity: its first instance (in op order) is lifted. Opportunities whose programs are one
kernel (emit.kernel_key) in one package folder make one candidate: the emitted kernel module goes
into a package folder beside the engine file (`optbot_kernels/`), each place's engine statement is
rewritten, and the worktree is committed once with the Optbot-* trailers. The entry files (entry.yaml named
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
from bot.generate.template.emit import Emitted, describe, emit, kernel_key
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
    status: str  # candidate | grouped (in another's candidate) | refused | covered | small | duplicate | error
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
    groups: dict[tuple[str, str], list[tuple[Opportunity, Program]]] = {}
    for opp in opportunities:
        if opp.kind not in KINDS:
            continue
        if opp.id in ctx.covered:
            out.append(TemplateResult(opp.id, "covered", "a replayed store entry covers it"))
            continue
        try:
            p = lift(graph, opp, instances(graph, opp)[0])
        except Refused as why:
            out.append(_small(opp, ctx) if opp.gain_pct < ctx.min_gain_pct else TemplateResult(opp.id, "refused", str(why)))
            continue
        # one kernel for every place with the same program in one package folder: Qwen-Image's
        # img_norm1, img_norm2, txt_norm1 and txt_norm2 are one layer_norm + modulation at four
        # statements, each 0.4-1.9% of the step, which one at a time sit inside the validator's
        # noise (benchmarks/results/h200-template-20261203/, qwen-image-full)
        groups.setdefault((kernel_key(p), _package_of(p)), []).append((opp, p))
    for sites in groups.values():
        gain = sum(o.gain_pct for o, _ in sites)
        if gain < ctx.min_gain_pct:
            out += [_small(o, ctx, len(sites), gain) for o, _ in sites]
            continue
        try:
            e = emit(sites[0][1], tuple(p for _, p in sites[1:]))
        except Refused as why:
            out += [TemplateResult(o.id, "refused", str(why)) for o, _ in sites]
            continue
        out += _commit(checkout, sites, e, ctx, taken, written)
    return out


def _small(opp: Opportunity, ctx: TemplateContext, places: int = 1, gain_pct: float = 0.0) -> TemplateResult:
    together = f"; its kernel's {places} places together {gain_pct:.2g}%" if places > 1 else ""
    return TemplateResult(opp.id, "small", f"estimated {opp.gain_ms:.3g} ms ({opp.gain_pct:.2g}% of the step{together}) "
                          f"is under {ctx.min_gain_pct}%: below what the validator can tell from noise")


def _package_of(p: Program) -> str:
    """The folder of the engine file the program's statement is in (where its kernel module goes)."""
    src = p.src or (p.srcs[0] if p.srcs else "")
    return str(Path(src.rpartition(":")[0]).parent)


def _commit(checkout: EngineCheckout, sites: list[tuple[Opportunity, Program]], e: Emitted, ctx: TemplateContext,
            taken: set[str], written: dict[tuple[str, int], str]) -> list[TemplateResult]:
    """One candidate for every site of one kernel: each site rewritten on the base and committed on
    its own, then the site commits cherry-picked together (the helper edit, import line, package and
    kernel module are the same text in each, so they merge) and squashed into one commit."""
    first = sites[0][0]
    wt = add_worktree(checkout, f"template-{first.id}")
    root = wt / checkout.import_root if checkout.import_root else wt
    rel = lambda f: str(Path(checkout.import_root) / f) if checkout.import_root else f  # noqa: E731
    results: list[TemplateResult] = []
    done: list[tuple[Opportunity, Program, Rewrite, str]] = []
    for opp, p in sites:
        run_git(wt, "checkout", "-q", "--detach", "--force", checkout.base_sha)
        run_git(wt, "clean", "-fdq")
        try:
            rw: Rewrite = rewrite(p, e, root)
        except Refused as why:
            results.append(TemplateResult(opp.id, "refused", str(why), program=describe(p)))
            continue
        who = next((c[3] for c in ctx.claimed for a, b in rw.spans
                    if c[0] == rw.engine_file and c[1] <= b and a <= c[2]), None)
        if who is not None:
            results.append(TemplateResult(opp.id, "covered", f"{rw.engine_file}:{rw.line} is changed by {who}: the two "
                                          "would not stack", program=describe(p)))
            continue
        earlier = written.setdefault((rw.engine_file, rw.line), opp.id)
        if earlier != opp.id:
            results.append(TemplateResult(opp.id, "duplicate", f"{rw.engine_file}:{rw.line} is the statement "
                                          f"template-{earlier} rewrites: one kernel there serves both", program=describe(p)))
            continue
        (root / rw.engine_file).write_text(rw.source)
        kfile = root / rw.kernel_file
        kfile.parent.mkdir(parents=True, exist_ok=True)
        init = kfile.parent / "__init__.py"
        if not init.exists():
            init.write_text(PACKAGE_INIT)
        kfile.write_text(e.module_source)
        # the test goes into the commit beside its kernel and is declared, so that the validator's kernel
        # check runs it at the graph's shapes (as it does an agent's) and learn keeps it with the entry
        (kfile.parent / f"test_{e.op_name}.py").write_text(e.test_source)
        sha, err = commit_all(wt, f"template site {opp.id}: {rw.engine_file}:{rw.line}\n")
        if not sha:
            results.append(TemplateResult(opp.id, "error", err, program=describe(p)))
            continue
        done.append((opp, p, rw, sha))
    run_git(wt, "checkout", "-q", "--detach", "--force", checkout.base_sha)
    run_git(wt, "clean", "-fdq")
    kept = []
    for opp, p, rw, sha in done:
        pick = run_git(wt, "cherry-pick", "--allow-empty", sha)
        if pick.returncode != 0:
            run_git(wt, "cherry-pick", "--abort")
            results.append(TemplateResult(opp.id, "error", f"does not stack with the other sites of its kernel "
                                          f"({(pick.stderr or pick.stdout).strip()[-200:]})", program=describe(p)))
            continue
        kept.append((opp, p, rw))
    if not kept:
        remove_worktree(checkout, wt)  # nothing was written: no worktree left behind for a refusal
        return results
    opp, p, rw = kept[0]
    test_rel = rel(str((Path(rw.kernel_file).parent / f"test_{e.op_name}.py")))
    trailers = make_trailers(opp.id, opp.kind, [e.kernel_name], [], "", generator=GENERATOR, run_id=ctx.run_id,
                             kernel_tests=[test_rel])
    where = opp.location.module_pattern + (f" and {len(kept) - 1} more place(s)" if len(kept) > 1 else "")
    title = f"optbot: fuse {describe(p)} at {where} into one Triton row kernel"
    gain = round(sum(o.gain_ms for o, _, _ in kept), 5)
    body = "\n".join(
        [f"Template-generated (no LLM): one kernel at {len(kept)} place(s); estimated {gain} ms in all."]
        + [f"\n{o.kind} {o.id} at {o.location.module_pattern} ({o.location.instances} instances; estimated "
           f"{o.gain_ms} ms)\n{r.engine_file}:{r.line}\n  was: {r.old_statement}\n  now: {r.new_statement}"
           for o, _, r in kept]
        + [f"\nKernel module: {rw.kernel_file} ({e.kernel_name})."])
    run_git(wt, "reset", "-q", "--soft", checkout.base_sha)
    sha, err = commit_all(wt, commit_message(title, body, trailers))
    if not sha:
        return results + [TemplateResult(opp.id, "error", err, program=describe(p), worktree=str(wt))]
    patch = run_git(wt, "diff", checkout.base_sha, sha).stdout
    kernel_rel = rel(rw.kernel_file)
    changed = list(dict.fromkeys([rel(r.engine_file) for _, _, r in kept] + [kernel_rel, test_rel]))
    pattern = opp.location.module_pattern + (f" and {len(kept) - 1} more" if len(kept) > 1 else "")
    name = entry_name(ctx.workload, pattern, taken)
    outcome = Outcome(
        candidate_id=f"template-{opp.id}", kind=opp.kind, generator=GENERATOR, run_id=ctx.run_id, status="candidate",
        reason="template-generated, not validated yet", numbers={}, device="", hardware=ctx.hardware,
        engine=ctx.engine, engine_source=ctx.engine_source, base_sha=checkout.base_sha, commit_sha=sha, title=title,
        patch=patch, changed_files=changed,
        added_files={kernel_rel: e.module_source, test_rel: e.test_source},
        workload=ctx.workload, dtype=ctx.dtype, adds_kernels=[e.kernel_name], entry_name=name, entry_status="candidate",
        config_space=e.config_space)
    entry_dir = write_entry(outcome, ctx.entries_dir)
    cand = Candidate(id=f"template-{opp.id}", opportunity_id=opp.id, kind=opp.kind, generator=GENERATOR,
                     worktree=str(wt), commit_sha=sha, base_sha=checkout.base_sha, entry_id="",
                     adds_kernels=[e.kernel_name], trailers=trailers, title=title, estimated_gain_ms=gain)
    lines = ", ".join(f"{r.engine_file}:{r.line}" for _, _, r in kept)
    results.insert(0, TemplateResult(opp.id, "candidate", f"rewrote {lines} as {sha[:12]}", cand, entry_dir,
                                     describe(p), str(wt)))
    for o, _, _ in kept[1:]:
        results.append(TemplateResult(o.id, "grouped", f"in template-{opp.id}: one kernel at its places",
                                      program=describe(p)))
    return results
