"""How `optbot bench` shows its result: the terminal table (long notes as numbered footnotes under it)
and the markdown file beside the JSON (notes kept in the table). The result type and the runs that fill
it are bot/commands/bench.py's."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from runner.job import parse_mode

if TYPE_CHECKING:
    from bot.commands.bench import BenchResult


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


# A row whose timed steps spread over more than this share of its median is marked: on an H100 the
# compiled rows of one bench held 3-6%, while an eager row of the same run spread 32% (317-453 ms;
# benchmarks/results/h100-fp8-modmerge-20261207/), and its median said nothing about the change measured.
NOISY = 0.10


def noisy(r) -> float | None:
    """(max - min) / median of a timed row with at least 3 steps where that exceeds NOISY, else None."""
    if not r.median_ms or r.min_ms is None or r.max_ms is None or r.n < 3:
        return None
    spread = (r.max_ms - r.min_ms) / r.median_ms
    return spread if spread > NOISY else None


def _table_rows(res: BenchResult) -> list[list[str]]:
    rows = []
    for r in res.rows:
        spread = f"{_fmt(r.min_ms)}–{_fmt(r.max_ms)}" if r.median_ms else "-"
        wide = noisy(r)
        if wide:
            spread += f" (noisy: {wide:.0%})"
        ok = "-" if r.correct is None else ("ok" if r.correct else "WRONG")
        rows.append([r.variant, r.mode, _fmt(r.median_ms), spread, str(r.n or "-"), _fmt(r.per_pass_ms),
                     _fmt(r.speedup, ".3f") + ("x" if r.speedup else ""),
                     _fmt(r.vs_compile, ".3f") + ("x" if r.vs_compile else ""), ok,
                     r.error or "; ".join(filter(None, [r.graphs, r.correctness]))])
    if res.roofline_ms is not None:
        rows.append(["roofline", "compute floor", _fmt(res.roofline_ms), "-", "-", _fmt(res.roofline_ms / res.passes), "-",
                     "-", "-", res.roofline_basis])
    if res.roofline_sustained_ms is not None:
        rows.append(["roofline", "compute floor, sustained", _fmt(res.roofline_sustained_ms), "-", "-",
                     _fmt(res.roofline_sustained_ms / res.passes), "-", "-", "-", res.roofline_sustained_basis])
    if res.roofline_fp8_basis:
        fp8 = res.roofline_fp8_ms
        rows.append(["roofline", "compute floor, FP8 linear", _fmt(fp8), "-", "-",
                     _fmt(fp8 / res.passes if fp8 is not None else None), "-", "-", "-", res.roofline_fp8_basis])
    return rows


NOTE_INLINE = 40  # characters of a note the terminal table keeps in its column
HEAD = ["variant", "mode", "step ms (median)", "min–max", "N", "per pass ms", "vs upstream eager", "vs best compile",
        "outputs", "notes"]


def _bar(res: BenchResult) -> str:
    if res.best_compile_ms is None:
        if not any(r.variant.startswith("upstream") and parse_mode(r.mode)[0] is not None for r in res.rows):
            return ("No upstream torch.compile row was asked for (--modes): there is no compile bar in this run "
                    "(on cuda the default modes include the compile recipes).")
        return "No upstream torch.compile row ran correct: there is no compile bar in this run."
    if res.bar_note:
        return (f"The bar: {res.best_compile_mode} at {res.best_compile_ms:.2f} ms/step, the fastest row of the "
                f"quantized upstream: {res.bar_note}, so that is what a user of it runs (\"vs best compile\" > 1 "
                "is faster than it).")
    return (f"The bar: the best upstream torch.compile recipe of this run, {res.best_compile_mode} at "
            f"{res.best_compile_ms:.2f} ms/step (\"vs best compile\" > 1 is faster than it).")


def _noise_line(res: BenchResult) -> str:
    n = [r for r in res.rows if noisy(r)]
    if not n:
        return ""
    return (f"{len(n)} row(s) marked noisy: their timed steps spread over more than {NOISY:.0%} of the median "
            f"({', '.join(f'{r.variant} {r.mode}' for r in n)}); their medians may not hold in another run "
            "(more steps: --iters; a quieter machine).")


def _quant_lines(res: BenchResult) -> list[str]:
    """What each --quant row ran: the implementation (torchao's or optbot's emulation) and its reach."""
    return [f"{label}: {q['implementation']}; {q['linear_layers']} linear layers ({q['form']})"
            + (f"; left unquantized: {', '.join(q['left_unquantized'])}" if q.get("left_unquantized") else "")
            + (f" ({q['left_unquantized_why']})" if q.get("left_unquantized") and q.get("left_unquantized_why") else "")
            for label, q in res.quant.items()]


def print_table(console: Console, res: BenchResult) -> None:
    """The table in the terminal, a long note as a numbered footnote under it: folded into its column,
    one roofline note took 17 lines of a 10-column table (the markdown keeps notes in the table)."""
    env = res.env
    t = Table(title=f"optbot bench {res.workload} · {res.preset} · {res.dtype} · measured on {res.device} "
                    f"({env.get('device_name', '?')}) · {res.passes} pass(es) per step")
    for h in HEAD:
        t.add_column(h, overflow="fold")
    notes = []
    for row in _table_rows(res):
        if len(row[-1]) > NOTE_INLINE:
            notes.append(f"[{len(notes) + 1}] {row[0]} {row[1]}: {row[-1]}")
            row = row[:-1] + [f"[{len(notes)}]"]
        t.add_row(*row)
    console.print(t)
    for line in notes:
        console.print(line, markup=False)
    console.print(_bar(res))
    noise = _noise_line(res)
    if noise:
        console.print(noise, markup=False)
    for line in _quant_lines(res):
        console.print(line, markup=False)


def markdown(res: BenchResult) -> str:
    env = res.env
    lines = [f"# optbot bench: {res.workload} ({res.preset}, {res.dtype}"
             + "".join(f"; candidates at {q.partition('+')[2]}, beside upstream and {q}" for q in res.quant) + ")", "",
             f"Measured on **{res.device} ({env.get('device_name', '?')})**, shape {res.shape}, "
             f"{res.passes} pass(es) per step. Command: `{res.command}`", "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(r) + " |" for r in _table_rows(res)]
    lines += ["", _bar(res)] + [line for line in [_noise_line(res)] if line] + [f"- {line}" for line in _quant_lines(res)]
    lines += ["", "```"] + [f"{k}: {v}" for k, v in env.items()] + ["```", ""]
    return "\n".join(lines)
