"""`optbot bench`: the product's number, in one run.

Per-step latency of upstream eager, upstream torch.compile (regional), CUDA-graph replay, the bot's
optimization branch and other engines (e.g. SGLang's own DiT), next to the roofline floor, with
every row's outputs checked against upstream eager in a clean process.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click
from rich.console import Console

from bot.bench_report import markdown, print_table
from bot.commands.common import command_line, parse_modes, workload_options, write_json
from bot.engine import add_worktree, checkout_engine
from bot.jobs import run_job
from bot.paths import new_run_dir
from bot.target import Target, base_worktree, resolve_target
from bot.tolerance import NO_FARTHER
from runner.job import Job, parse_mode, precision
from runner.roofline import compute_floor


@dataclass
class BenchRow:
    variant: str  # upstream | candidate (candidate:<name> when several) | engine name
    mode: str  # eager | graph | compile | compile+graph
    device: str
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    n: int = 0
    per_pass_ms: float | None = None
    speedup: float | None = None  # vs upstream eager
    vs_compile: float | None = None  # vs the best upstream torch.compile row of the same run (the bar)
    correct: bool | None = None
    correctness: str = ""
    error: str = ""
    engine_sha: str = ""
    comparison: dict = field(default_factory=dict)  # output name -> rel_l2, max_abs, max_rel, where, ok
    window: list[float] | None = None  # unix seconds [start, end] of the timed steps (joins a clock log)
    graphs: str = ""  # a compiled row: dynamo's graphs and graph breaks (runner/modes.compile_report)


@dataclass
class BenchResult:
    workload: str
    preset: str
    device: str
    dtype: str
    shape: dict
    passes: int
    rows: list[BenchRow] = field(default_factory=list)
    roofline_ms: float | None = None
    roofline_basis: str = ""
    # the same FLOPs with the linear layers at the FP8 matmul ceiling measured in the run (attention
    # stays bf16, as FP8 deployments keep it): what an FP8 path could reach (issue 16)
    # the same FLOPs at the matmul rate held back to back (power-capped on the H200: runner/peaks.py):
    # what a step that keeps the GPU busy, as compile + CUDA graph does, can reach (CUDA only)
    roofline_sustained_ms: float | None = None
    roofline_sustained_basis: str = ""
    roofline_fp8_ms: float | None = None
    roofline_fp8_basis: str = ""
    # the recipe a user who compiles would pick: the fastest correct upstream compile row of this run
    best_compile_mode: str = ""
    best_compile_ms: float | None = None
    # why the bar is not a compile row: under --quant, when the quantized upstream runs but none of its
    # compile rows does (SGLang's FP8 under inductor), the bar is its fastest row that ran
    bar_note: str = ""
    env: dict = field(default_factory=dict)
    # --quant rows: variant label -> what the runner applied (runner/quant.py: implementation, layers)
    quant: dict = field(default_factory=dict)
    command: str = ""


def _job(t: Target, wt: Path, sha: str, modes: list[str], out_dir: Path, iters: int, flops: bool,
         backend: str = "inductor") -> Job:
    return t.job("bench", wt, out_dir, engine_sha=sha, seeds=[1234], warmup=3 if t.device.startswith("cuda") else 1,
                 iters=iters, params={"modes": modes, "flops": flops, "compile_backend": backend,
                                      "engine": t.engine_name or t.workload.default_engine})


# upstream: every recipe a user who compiles might pick (max-autotune only on request: its GEMM
# autotuning took minutes and picked cuBLAS on the H200, benchmarks/results/README.md)
CUDA_UPSTREAM = ("eager", "graph", "compile", "compile+graph", "compile:whole", "compile:whole+graph")
CUDA_OTHERS = ("eager", "graph", "compile", "compile+graph")


def _modes(text: str | None, default: tuple[str, ...], option: str) -> list[str]:
    modes = list(parse_modes(text, option) or default)
    return ["eager"] + [m for m in modes if m != "eager"]  # eager first: the reference


@click.command("bench")
@workload_options
@click.option("--candidate", "candidates", multiple=True, metavar="REF|PATCH",
              help="The optimized engine to compare: a branch/commit on top of the base (e.g. "
                   "optbot/flux2/<base-sha12>) or a patch file (e.g. kernel_store/<entry>/patch.diff). "
                   "Repeatable: several candidates in one run are rows candidate:<name>.")
@click.option("--with-engine", "extra_engines", multiple=True, metavar="NAME",
              help="Also bench another engine the workload defines (e.g. sglang). Repeatable.")
@click.option("--modes", default=None, metavar="LIST",
              help="Comma list of modes for the (unquantized) upstream rows: eager, graph, compile[:RECIPE][+graph] with RECIPE "
                   "regional (plain 'compile'), whole or max-autotune (runner/modes.py). Default on cuda: "
                   f"{','.join(CUDA_UPSTREAM)}; on cpu: eager.")
@click.option("--other-modes", default=None, metavar="LIST",
              help="Modes for the --candidate, --with-engine and (with --quant) upstream+RECIPE rows; eager is "
                   "always among them (the reference the others are judged against). Default on cuda: "
                   f"{','.join(CUDA_OTHERS)}, the four production modes; on cpu: eager.")
@click.option("--iters", default=None, type=int, help="Timed steps per mode (default 10 on cuda, 3 on cpu).")
@click.option("--compile-backend", default="inductor", show_default=True, metavar="NAME",
              help="torch.compile backend of the compile modes (aot_eager traces without generating code: "
                   "a quick check that the candidate compiles at all).")
@click.option("--timeout", default=1800, show_default=True, help="Seconds per runner job.")
def command(workload, engine, ref, preset, device, json_path, candidates, extra_engines, modes, other_modes, quant,
            iters, compile_backend, timeout):
    """Per-step latency of upstream vs optimized vs other engines vs the roofline, outputs checked.

    \b
    Rows: upstream eager (the reference), upstream CUDA-graph replay, upstream torch.compile in
    the recipes a user would write (regional and whole-model, each also inside a CUDA graph), the
    --candidate branch in the four production modes, each --with-engine engine, and the compute
    floors: all FLOPs at the matmul ceiling measured in the same run (a burst); on CUDA the same
    FLOPs at the rate a back-to-back matmul holds for ~3 s (a busy H200 runs into its power cap:
    docs/timing.md); and the linear layers' FLOPs at the FP8 (_scaled_mm, row-wise scales) ceiling,
    with attention still at the matmul one: what an FP8 path could reach. Every row's outputs are
    compared with upstream eager under the workload's tolerance, in a separate process. The
    fastest correct upstream compile row is the bar ("vs best compile"), not eager. A row that
    fails keeps its error; the rows that ran stay. A row whose timed steps spread over 10% of its
    median is marked noisy (its median may not hold in another run: more --iters).

    \b
    --quant fp8 adds upstream+fp8 rows (the recipe's own error against upstream, reported), runs
    the candidates at FP8 and judges them against upstream+fp8 eager (a compiled candidate row
    against upstream+fp8 compiled the same way where that ran, as the validator does); the bar becomes the
    fastest upstream+fp8 compile row (where every one of those fails, as SGLang's FP8 does under
    inductor, its fastest row that ran, said so). Beside those, two distances are reported, not judged: each
    upstream+fp8 mode against its own eager run (a trusted rewrite of the FP8 model) and each
    candidate row against unquantized upstream (docs/fp8.md).

    \b
    Examples:
      optbot bench flux2                                  # tiny on CPU: eager only
      optbot bench flux2 --preset full --device cuda --candidate optbot/flux2/d93305b4891d
      optbot bench qwen-image --with-engine sglang --json qwen-bench.json
    """
    t = resolve_target(workload, engine, ref, preset, device)  # upstream unquantized: the reference of every row
    # --quant: upstream again at the quantized precision, and the candidates there too (an FP8 branch
    # is judged against the FP8 baseline, under that precision's tolerance where the workload has one)
    qt = dataclasses.replace(t, dtype=precision(t.dtype, quant)) if quant else t
    is_cuda = t.device.startswith("cuda")
    mode_list = _modes(modes, CUDA_UPSTREAM if is_cuda else ("eager",), "--modes")
    others = _modes(other_modes, CUDA_OTHERS if is_cuda else ("eager",), "--other-modes")
    iters = iters or (10 if is_cuda else 3)
    run_dir = new_run_dir("bench")
    console = Console(width=None if Console().is_terminal else 150)
    # (label, the target its engine is, worktree, sha); another engine of the workload is its own target
    variants: list[tuple[str, Target, Path, str]] = [("upstream", t, base_worktree(t), t.checkout.base_sha)]
    qref = f"upstream+{quant}" if quant else "upstream"
    if quant:  # the same upstream at the quantized precision (runner/job.split_precision)
        variants.append((qref, qt, variants[0][2], t.checkout.base_sha))
    from bot.validate.resolve import candidate_labels, resolve_candidate

    for candidate, label in zip(candidates, candidate_labels(list(candidates))):
        # the validator's resolution: a commit/branch on top of the base, or a patch file (applied
        # and committed deterministically in its own worktree)
        rev = resolve_candidate(t.checkout, candidate, t.checkout.base_sha)
        variants.append((label, qt, rev.worktree, rev.sha))
    for name in extra_engines:
        spec = t.workload.engine(name)
        co = checkout_engine(spec.source, spec.ref, spec.import_root, name)
        other = dataclasses.replace(t, engine_name=name, model_class=spec.model_class, checkout=co)
        variants.append((name, other, add_worktree(co, f"base-{co.base_sha[:12]}"), co.base_sha))

    shape = t.workload.preset(t.preset).shapes
    res = BenchResult(t.workload.name, t.preset, "cuda" if is_cuda else "cpu", t.dtype, shape.to_json(),
                      t.workload.step.passes, command=command_line())
    outputs: dict[str, str] = {}  # "label:mode" -> its saved outputs
    owner: dict[str, str] = {}  # "label:mode" -> label
    for label, vt, wt, sha in variants:
        ml = mode_list if label == "upstream" else others
        eng = vt.engine_name or vt.workload.default_engine
        console.print(f"[bold]{label}[/bold] ({eng} @ {sha[:12]}): modes {', '.join(ml)} on {t.device} ...")
        job = _job(vt, wt, sha, ml, run_dir / label, iters, flops=(label == "upstream"), backend=compile_backend)
        out = run_job(job, run_dir, timeout_s=timeout, name=f"bench-{label}")
        if not out.ok:
            if label == "upstream":
                raise out.error("bench of upstream")
            res.rows.append(BenchRow(label, "-", res.device, error=out.reason(), engine_sha=sha))
            continue
        r = out.result
        if label == qref and quant:
            res.quant[label] = r["env"].get("quant", {})
        if label == "upstream":
            res.env = r["env"]
            if "flops" in r:
                fl, pk = r["flops"], r["peaks"]
                res.roofline_ms, res.roofline_basis = compute_floor(fl, pk)
                if pk.get("matmul_sustained_tflops"):
                    res.roofline_sustained_ms = compute_floor(fl, {**pk, "matmul_tflops": pk["matmul_sustained_tflops"]})[0]
                    res.roofline_sustained_basis = (
                        f"the same FLOPs at {pk['matmul_sustained_tflops']} TFLOP/s, the {pk['matmul_dtype']} matmul rate "
                        f"held back to back for ~3 s in this run (power-limited)")
                res.roofline_fp8_ms, res.roofline_fp8_basis = compute_floor(fl, pk, fp8=True)
        for mode, m in r["modes"].items():
            row = BenchRow(label, mode, res.device, engine_sha=sha)
            if "error" in m:
                row.error = m["error"]
            if "latency" in m:
                lat = m["latency"]
                row.median_ms, row.min_ms, row.max_ms, row.n = lat["median_ms"], lat["min_ms"], lat["max_ms"], lat["n"]
                row.per_pass_ms = m["per_pass_ms"]
                row.window = m.get("window")
                if g := m.get("graphs"):  # breaks None: the user's TORCH_LOGS left them unrecorded
                    row.graphs = f"{g['graphs']} graph(s), " + ("breaks not recorded" if g["breaks"] is None else f"{g['breaks']} break(s)")
            if "outputs" in m:
                outputs[f"{label}:{mode}"] = m["outputs"]["file"]
                owner[f"{label}:{mode}"] = label  # labels and modes both may hold ':'
            res.rows.append(row)

    # each row against its reference's eager outputs: candidates against upstream at their precision,
    # everything else (other engines, the quantized upstream itself) against unquantized upstream
    cand_labels = {v[0] for v in variants if v[1] is qt and v[0] != qref} if quant else set()
    comps: dict[str, dict[str, dict]] = {}
    unjudged: dict[str, str] = {}  # row key -> why its differences are measured but not judged
    across_keys: dict[str, float] = {}  # rows judged by the precision's bound across modes -> its rel L2
    same_mode: dict[str, str] = {}  # rows judged against the quantized upstream's run of their mode -> that row
    for ref_label, tgt, labels in (("upstream", t, lambda k: owner[k] not in cand_labels),
                                   (qref, qt, lambda k: owner[k] in cand_labels)):
        ref_key = f"{ref_label}:eager"
        pairs = {k: v for k, v in outputs.items() if k != ref_key and labels(k)}
        if ref_key not in outputs or not pairs:
            continue
        tol = tgt.workload.tolerance_for(tgt.dtype, tgt.engine_name)
        judged = not t.workload.bit_exact and tol is not None
        across = tol.bound(across_modes=True) if judged and tol.across_modes else None
        plist = []
        for k, v in pairs.items():
            pair, against = compare_pair(k, k[len(owner[k]) + 1:], v, ref_label, outputs, qref, across)
            plist.append(pair)
            if "tolerance" in pair:
                across_keys[k] = pair["tolerance"]["rel_l2"]
            elif against:
                same_mode[k] = against
        cj = t.job("compare", None, run_dir, device="cpu", shapes=[],
                   params={"pairs": plist,
                           "tolerance": tol.bound() if judged else None,
                           "bit_exact": t.workload.bit_exact})
        cout = run_job(cj, run_dir, timeout_s=600, name=f"bench-compare-{ref_label}")
        if not cout.ok:
            raise cout.error("output comparison")
        for c in cout.result["checks"]:
            comps.setdefault(c["label"], {})[c["output"]] = c
        if tol is None and not t.workload.bit_exact:  # a quantized precision without its own tolerance
            unjudged.update({k: f"the workload declares no tolerance for {tgt.dtype}" for k in pairs})
    qtol = qt.workload.tolerance_for(qt.dtype, qt.engine_name) if quant else None
    cross = _cross_distances(t, run_dir, outputs, owner, qref, cand_labels,
                             qtol.bound() if qtol is not None else None) if quant else {}
    base_ms = next((r.median_ms for r in res.rows if r.variant == "upstream" and r.mode == "eager"), None)
    for row in res.rows:
        key = f"{row.variant}:{row.mode}"
        own_error = bool(quant) and row.variant == qref  # the quantized upstream against unquantized upstream
        if key == "upstream:eager":
            row.correct, row.correctness = True, "reference"
        elif key in comps:
            row.comparison = comps[key]
            errs = "; ".join(f"{n}: rel L2 {c['rel_l2']:.3g}, max abs {c['max_abs']:.3g}" if "rel_l2" in c else c["reason"]
                             for n, c in comps[key].items())
            if own_error:
                row.correctness = f"{errs} (the {quant} recipe's own error against upstream eager: reported, not judged)"
            elif key in unjudged:
                row.correctness = f"{errs} against {qref} eager (not judged: {unjudged[key]})"
            else:
                bad = {n: c for n, c in comps[key].items() if not c["ok"]}
                worst = max(comps[key].values(), key=lambda c: c.get("rel_l2", float("inf")))
                row.correct = not bad
                row.correctness = worst["reason"] if not bad else "; ".join(c["reason"] for c in bad.values())
                if key in across_keys:
                    row.correctness += f" (compiled against {qref if owner[key] in cand_labels else 'upstream'} " \
                                       f"eager: the bound across modes, rel L2 <= {across_keys[key]:g})"
                elif key in same_mode:
                    row.correctness += f" (against {same_mode[key]})"
        if key in cross:
            text, ok = cross[key]
            row.correctness = f"{row.correctness}; {text}" if row.correctness else text
            if ok is False and key not in unjudged:
                row.correct = False
        if row.median_ms and base_ms:
            row.speedup = base_ms / row.median_ms
    best, bar_label, res.bar_note = choose_bar(res.rows, qref if quant else "")
    if best is not None:
        res.best_compile_mode, res.best_compile_ms = (best.mode if bar_label == "upstream" else f"{bar_label} {best.mode}"), best.median_ms
        for row in res.rows:
            if row.median_ms:
                row.vs_compile = best.median_ms / row.median_ms
    print_table(console, res)
    write_json(run_dir / "bench.json", asdict(res))
    (run_dir / "bench.md").write_text(markdown(res))
    if json_path is not None:
        write_json(json_path, asdict(res))
        json_path.with_suffix(".md").write_text(markdown(res))
    console.print(f"run directory: {run_dir}")


def choose_bar(rows: list[BenchRow], qref: str = "") -> tuple[BenchRow | None, str, str]:
    """(the row every row is set against, its variant, why it is not a compile row or "").

    The bar is what a user of this precision runs compiled: the fastest correct upstream compile row;
    under --quant (`qref`, the quantized upstream's label) the quantized upstream's fastest compile row
    (its outputs are measured against unquantized upstream: reported, not judged). When the quantized
    upstream runs but every compile row of it failed (SGLang's FP8 under inductor), its user runs its
    fastest mode that ran instead (the validator's base_fallbacks), not the unquantized model compiled."""
    label = qref if qref and any(r.variant == qref and r.mode.startswith("compile") and r.median_ms
                                 for r in rows) else "upstream"
    best = min((r for r in rows if r.variant == label and r.mode.startswith("compile") and r.median_ms
                and (r.correct or label == qref)), key=lambda r: r.median_ms, default=None)
    ran = [r for r in rows if qref and r.variant == qref and r.median_ms]
    failed = [r.mode for r in rows if qref and r.variant == qref and r.mode.startswith("compile") and not r.median_ms]
    if label == "upstream" and ran and failed:
        return min(ran, key=lambda r: r.median_ms), qref, f"its torch.compile rows failed ({', '.join(failed)})"
    return best, label, ""


def _cross_distances(t: Target, run_dir: Path, outputs: dict[str, str], owner: dict[str, str], qref: str,
                     cand_labels: set[str], bound: dict | None = None) -> dict[str, tuple[str, bool | None]]:
    """Under --quant, beside the judged distances (the evidence for the quantized tolerance, docs/fp8.md):
    the quantized upstream's other modes against its own eager run (what a trusted rewrite of the
    same quantized model moves; reported, with how many of its elements the precision's element bound
    `bound` would reject), and each candidate row against unquantized upstream eager,
    judged as the validator does: no farther from it than the quantized upstream eager is
    (bot/tolerance.py NO_FARTHER). Row key -> (the words, ok; None where only reported)."""
    pairs = []
    q_eager, u_eager = outputs.get(f"{qref}:eager"), outputs.get("upstream:eager")
    for k, f in outputs.items():
        if owner[k] == qref and q_eager and f != q_eager:
            pairs.append({"label": k, "base": q_eager, "candidate": f, "against": f"{qref} eager",
                          **({"tolerance": bound} if bound else {})})
        elif owner[k] in cand_labels and u_eager and q_eager:
            pairs.append({"label": k, "reference": u_eager, "base": q_eager, "candidate": f, "no_farther": NO_FARTHER,
                          "against": "upstream eager (unquantized)"})
    if not pairs:
        return {}
    against = {p["label"]: p.pop("against") for p in pairs}
    cj = t.job("compare", None, run_dir, device="cpu", shapes=[],
               params={"pairs": pairs, "tolerance": None, "bit_exact": False})
    cout = run_job(cj, run_dir, timeout_s=600, name="bench-compare-cross")
    if not cout.ok:
        raise cout.error("output comparison")
    found: dict[str, list[str]] = {}
    ok: dict[str, bool | None] = {}
    for c in cout.result["checks"]:
        k, judged = c["label"], c.get("against") == "unquantized"
        ok[k] = bool(ok.get(k, True) and c["ok"]) if judged else None
        # no distance: why (shape, NaN); the trusted rewrite's largest element error too (the evidence
        # for the precision's atol: docs/fp8.md)
        found.setdefault(k, []).append(c["reason"] if "rel_l2" not in c else f"{c['output']} {c['rel_l2']:.3g}" + (
            f" ({qref} eager {c['base_rel_l2']:.3g})" if judged else f", max abs {c['max_abs']:.3g}" + (
                f", {c['violations']} of {c['numel']} elements over the precision's element bound"
                if "violations" in c and bound else "")))
    fail = f"; FAIL: farther from the unquantized model than {NO_FARTHER:g}x {qref} eager"
    return {k: (f"vs {against[k]}: rel L2 {', '.join(v)}" + (fail if ok[k] is False else ""), ok[k])
            for k, v in found.items()}


def compare_pair(key: str, mode: str, outputs_file: str, ref_label: str, outputs: dict[str, str], qref: str,
                 across: dict | None) -> tuple[dict, str]:
    """The compare job's pair for row `key` (its `mode`), and the row it is set against when that is
    not its reference's eager run ("" otherwise). A quantized candidate compiled, where the quantized
    upstream ran that mode too, is set against that run, as the validator judges (inductor's rewrite of
    an FP8 model moves its outputs by about the recipe's own bound: rel L2 0.029 against 0.027 on the
    CPU, 2026-12-06); where that mode failed upstream, against eager under the precision's bound across
    modes (`across`, when the workload has one); every other row against its reference's eager run."""
    compiled = parse_mode(mode)[0] is not None
    if compiled and ref_label == qref and f"{qref}:{mode}" in outputs:
        return {"label": key, "base": outputs[f"{qref}:{mode}"], "candidate": outputs_file}, f"{qref} {mode}"
    pair = {"label": key, "base": outputs[f"{ref_label}:eager"], "candidate": outputs_file}
    if across and compiled:
        pair["tolerance"] = across
    return pair, ""
