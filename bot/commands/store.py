"""`optbot store`: the kernel store (kernel_store/<entry-id>/), listed, shown, re-validated, benchmarked."""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import click

from bot.commands.common import command_line, write_json
from bot.errors import ConfigError, OptbotError
from bot.knowledge.store import STORE_DIR, get_entry, load_store
from bot.paths import new_run_dir

_store_opt = click.option("--store", "store_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                          envvar="OPTBOT_STORE", help="Kernel store folder (default: kernel_store/ of this repo).")


@click.group("store")
def command():
    """The kernel store: reusable, validated optimizations, one folder per entry.

    \b
    Examples:
      optbot store list                          entries, pattern, engine, status, provenance
      optbot store show flux2-qk-rmsnorm-rope    entry.yaml, files, bench numbers
      optbot store check                         re-validate every entry (CPU: patch applies +
                                                 kernel tests under TRITON_INTERPRET=1)
      optbot store check --device cuda --json r.json   on a GPU: correctness and microbenchmarks
      optbot store record-bench results.json     write GPU numbers into each entry's bench.json
    """


@command.command("list")
@_store_opt
@click.option("--pattern", default=None, help="Only entries of this opportunity kind.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def list_cmd(store_dir, pattern, json_path):
    """List the entries of the store."""
    entries = [e for e in load_store(store_dir) if pattern is None or e.pattern == pattern]
    if not entries:
        click.echo(f"no entries in {store_dir or STORE_DIR}")
    rows = []
    for e in entries:
        prov = e.provenance.kind + (f" by {e.provenance.author}" if e.provenance.author else f" in run {e.provenance.run_id}")
        gpu = "gpu numbers" if (e.bench().get("gpu") or {}) else "no gpu numbers"
        click.echo(f"{e.id:34} {e.pattern:22} {e.engine.name:10} {','.join(e.workloads):18} {e.status:14} {prov} ({gpu})")
        rows.append({"id": e.id, "pattern": e.pattern, "engine": e.engine.name, "workloads": list(e.workloads),
                     "hardware": list(e.hardware), "status": e.status, "provenance": e.provenance.kind})
    write_json(json_path, {"entries": rows})


@command.command("show")
@_store_opt
@click.argument("entry_id")
def show_cmd(store_dir, entry_id):
    """Show one entry: its fields, its files and its bench.json."""
    e = get_entry(entry_id, store_dir)
    click.echo((e.path / "entry.yaml").read_text().rstrip())
    click.echo(f"\nfiles in {e.path}:")
    for f in sorted(e.path.iterdir()):
        if f.is_file():
            click.echo(f"  {f.name:28} {f.stat().st_size:>8} bytes")
    bench = e.bench()
    click.echo("\nbench.json:" if bench else "\nbench.json: (none)")
    if bench:
        click.echo(json.dumps(bench, indent=2)[:4000])


@command.command("check")
@_store_opt
@click.argument("entry_ids", nargs=-1)
@click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda[:N]",
              help="cpu: correctness with TRITON_INTERPRET=1. cuda: correctness and microbenchmarks.")
@click.option("--no-kernels", is_flag=True, help="Only schema, sources and patch checks (fast).")
@click.option("--record", is_flag=True, help="Write the kernel test results into each entry's bench.json.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def check_cmd(store_dir, entry_ids, device, no_kernels, record, json_path):
    """Re-validate entries (all by default): schema, kernel sources == patched files, patch applies
    to the engine base in a real worktree, kernel tests in an isolated runner process.

    Exit code 1 when any check fails.
    """
    from bot.knowledge.check import check_entry

    if not (device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise click.BadParameter(f"{device!r}: expected cpu, cuda or cuda:N", param_hint="--device")
    entries = [get_entry(i, store_dir) for i in entry_ids] if entry_ids else load_store(store_dir)
    run_dir = new_run_dir("store-check")
    click.echo(f"checking {len(entries)} entries on {device}; run directory {run_dir}", err=True)
    results = []
    for e in entries:
        r = check_entry(e, device, run_dir, run_kernels=not no_kernels)
        results.append(r)
        click.echo(f"{'ok  ' if r.ok else 'FAIL'} {e.id}")
        for c in r.checks:
            mark = {True: "ok", False: "FAIL", None: "--"}[c.ok]
            click.echo(f"     {mark:4} {c.name:28} {c.reason}")
        if record and not no_kernels:
            _record_correctness(e, r)
    data = {"device": device, "command": command_line(), "ok": all(r.ok for r in results),
            "entries": [r.to_json() for r in results]}
    write_json(run_dir / "store-check.json", data)
    write_json(json_path, data)
    if not data["ok"]:
        raise SystemExit(1)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _write_bench(entry, bench: dict) -> None:
    bench.setdefault("entry", entry.id)
    (entry.path / "bench.json").write_text(json.dumps(bench, indent=2) + "\n")


def _record_correctness(entry, result) -> None:
    """Kernel test results (max errors per case) into bench.json, keyed by device kind."""
    bench = entry.bench()
    kind = "cuda" if result.device.startswith("cuda") else "cpu"
    tests = {}
    for c in result.checks:
        if c.name.startswith("kernels:") and c.details.get("cases"):
            d = c.details
            tests[c.name.split(":", 1)[1]] = {
                "passed": c.ok, "interpret": d.get("interpret"),
                "cases": [{k: case[k] for k in ("shape", "dtype", "seed", "atol", "rtol", "max_abs", "max_rel", "path", "passed")}
                          for case in d["cases"]],
                "micro": d.get("micro"), "env": d.get("env")}
    if not tests:
        return
    bench.setdefault("correctness", {})[kind] = {"command": command_line(), "date": _now(), "tests": tests}
    _write_bench(entry, bench)


@command.command("record-bench")
@_store_opt
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def record_bench_cmd(store_dir, results):
    """Write GPU results (from benchmarks/gpu_store.sh) into each entry's bench.json, with provenance.

    RESULTS is the JSON that `optbot store bench` or `optbot store check --device cuda --json`
    wrote. Numbers are copied as measured; nothing is computed or filled in here.
    """
    try:
        data = json.loads(results.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(results, "(json)", str(e), "valid JSON") from None
    n = 0
    if "entries" in data and isinstance(data["entries"], list):  # store check --json (micro + correctness)
        for r in data["entries"]:
            micro = {}
            for c in r.get("checks", []):
                if c["name"].startswith("kernels:") and c.get("details", {}).get("micro"):
                    micro[c["name"].split(":", 1)[1]] = {"micro": c["details"]["micro"], "env": c["details"].get("env"),
                                                         "passed": c["ok"]}
            if micro:
                e = get_entry(r["entry_id"], store_dir)
                bench = e.bench()
                bench.setdefault("gpu", {})["micro"] = {"source": str(results), "command": data.get("command"),
                                                        "recorded_at": _now(), "device": data.get("device"), "tests": micro}
                _write_bench(e, bench)
                n += 1
    elif "e2e" in data and isinstance(data["e2e"], dict):  # store bench --json (end to end)
        for eid, res in data["e2e"].items():
            e = get_entry(eid, store_dir)
            bench = e.bench()
            bench.setdefault("gpu", {})["end_to_end"] = {"source": str(results), "command": data.get("command"),
                                                         "recorded_at": _now(), **res}
            _write_bench(e, bench)
            n += 1
    else:
        raise ConfigError(results, "(top level)", sorted(data)[:5], "'entries' (store check --json) or 'e2e' (store bench --json)")
    click.echo(f"recorded GPU numbers for {n} entries from {results}")


@command.command("bench")
@_store_opt
@click.argument("entry_ids", nargs=-1)
@click.option("--device", default="cuda", show_default=True, metavar="cuda[:N]|cpu")
@click.option("--preset", type=click.Choice(["tiny", "full"]), default=None, help="Default: full on cuda, tiny on cpu.")
@click.option("--rounds", default=2, show_default=True, help="Alternating base/patched job pairs per entry.")
@click.option("--iters", default=10, show_default=True, help="Timed steps per job.")
@click.option("--timeout", default=900, show_default=True, help="Seconds per runner job.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def bench_cmd(store_dir, entry_ids, device, preset, rounds, iters, timeout, json_path):
    """End-to-end step latency of the base engine vs each entry's patched engine, per workload.

    Base and patched runs are separate `step` runner jobs (one engine per process), alternated
    base/patched/base/patched so drift hits both; the median of the jobs' medians is reported.
    """
    from bot.knowledge.bench import bench_entries

    preset = preset or ("full" if device.startswith("cuda") else "tiny")
    entries = [get_entry(i, store_dir) for i in entry_ids] if entry_ids else load_store(store_dir)
    run_dir = new_run_dir("store-bench")
    click.echo(f"benchmarking {len(entries)} entries on {device} ({preset}); run directory {run_dir}", err=True)
    data = bench_entries(entries, device, preset, rounds, iters, timeout, run_dir, echo=click.echo)
    data["command"] = command_line()
    write_json(run_dir / "store-bench.json", data)
    write_json(json_path, data)
    if not data["e2e"]:
        raise OptbotError("no entry could be benchmarked (see the lines above)")
