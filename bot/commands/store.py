"""`optbot store`: the kernel store (kernel_store/<entry-id>/), listed, shown, re-validated, benchmarked."""
from __future__ import annotations

import json
from pathlib import Path

import click

from bot.commands import store_propose
from bot.commands.common import command_line, echo_err, github_option, knowledge_options, utc_now, write_json
from bot.errors import ConfigError, OptbotError
from bot.knowledge.check import record_validation
from bot.knowledge.records import KernelTests, MicroRecord, read_bench, save_bench
from bot.knowledge.store import get_entry, load_store, sync_sources
from bot.paths import new_run_dir, runs_dir
from bot.target import require_device

_store_opt = knowledge_options(store=True)


@click.group("store")
def command():
    """The kernel store: reusable, validated optimizations, one folder per entry.

    \b
    Examples:
      optbot store list                          entries, pattern, engine, status, provenance
      optbot store show flux2-qk-rmsnorm-rope    entry.yaml, files, bench numbers
      optbot store check                         re-validate every entry (CPU: patch applies,
                                                 kernel tests under TRITON_INTERPRET=1, the
                                                 validator on the tiny preset)
      optbot store check --device cuda --gpus 2 --record
                                                 on GPUs: also microbenchmarks and end-to-end
                                                 speed on the full preset, into bench.json
      optbot store sync-sources ENTRY            after editing ENTRY's kernel files: write them
                                                 back into its patch.diff
      optbot store record-bench results.json     write GPU numbers into each entry's bench.json
      optbot store tune qwen-image-absorb-bias --gpus 2
                                                 variant search over its config space, no commit
    """


@command.command("list")
@_store_opt
@click.option("--pattern", default=None, help="Only entries of this opportunity kind.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def list_cmd(knowledge, pattern, json_path):
    """List the entries of the store."""
    entries = [e for e in load_store(knowledge.kernel_store) if pattern is None or e.pattern == pattern]
    if not entries:
        click.echo(f"no entries in {knowledge.kernel_store}")
    rows = []
    for e in entries:
        prov = e.provenance.kind + (f" by {e.provenance.author}" if e.provenance.author else f" in run {e.provenance.run_id}")
        gpu = e.bench().gpu
        gpu = "gpu numbers" if gpu is not None and gpu.to_json() else "no gpu numbers"
        click.echo(f"{e.id:34} {e.pattern:22} {e.engine.name:10} {','.join(e.workloads):18} {e.status:14} {prov} ({gpu})")
        rows.append({"id": e.id, "pattern": e.pattern, "engine": e.engine.name, "workloads": list(e.workloads),
                     "hardware": list(e.hardware), "status": e.status, "provenance": e.provenance.kind})
    write_json(json_path, {"entries": rows})


@command.command("show")
@_store_opt
@click.argument("entry_id")
def show_cmd(knowledge, entry_id):
    """Show one entry: its fields, its files and its bench.json."""
    e = get_entry(entry_id, knowledge.kernel_store)
    click.echo((e.path / "entry.yaml").read_text().rstrip())
    click.echo(f"\nfiles in {e.path}:")
    for f in sorted(e.path.iterdir()):
        if f.is_file():
            click.echo(f"  {f.name:28} {f.stat().st_size:>8} bytes")
    bench = read_bench(e.bench_path)
    click.echo("\nbench.json:" if bench else "\nbench.json: (none)")
    if bench:
        click.echo(bench.dumps().rstrip()[:4000])


@command.command("sync-sources")
@_store_opt
@click.argument("entry_ids", nargs=-1, required=True)
def sync_sources_cmd(knowledge, entry_ids):
    """Write an entry's edited kernel sources back into its patch.diff.

    A store kernel is edited in its entry folder (kernel_store/ENTRY/*.py, where its tests run);
    patch.diff adds the same file to the engine, and `store check` rejects the entry until the two
    are byte-identical. This rewrites each kernel file's new-file hunk in patch.diff from the folder's
    copy (the engine's other edits untouched) and says which changed. Then re-validate:

    \b
      optbot store sync-sources qwen-image-fp8-norm-quant
      optbot store check qwen-image-fp8-norm-quant
    """
    for eid in entry_ids:
        changed = sync_sources(get_entry(eid, knowledge.kernel_store))
        click.echo(f"{eid}: {'rewrote ' + ', '.join(changed) + ' in patch.diff' if changed else 'patch.diff already holds every kernel source'}")


def _resumed_run_dir(run_id: str) -> Path:
    """The run directory of an earlier `store check`, by its id (or path): exit 2 naming it if there is none."""
    d = Path(run_id) if Path(run_id).is_dir() else runs_dir() / run_id
    if not d.is_dir() or "store-check" not in d.name:
        raise click.BadParameter(f"{run_id}: no store check run directory under {runs_dir()} (the id `optbot store "
                                 f"check` printed as 'run directory ...')", param_hint="--resume")
    click.echo(f"resuming store check {d.name}: each validation keeps its seeds and the runner processes it "
               f"finished", err=True)
    return d


@command.command("check")
@_store_opt
@click.argument("entry_ids", nargs=-1)
@click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda[:N]",
              help="cpu: correctness (Triton under TRITON_INTERPRET=1) and engagement. cuda: correctness, "
                   "microbenchmarks and end-to-end speed.")
@click.option("--preset", type=click.Choice(["tiny", "full"]), default=None,
              help="Preset of the full validation. Default: full on cuda, tiny on cpu.")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1, 64),
              help="With --device cuda: check entries in parallel, one lane per GPU (cuda:0..N-1).")
@click.option("--engine", metavar="NAME|PATH|URL", default=None,
              help="Check each entry against this engine's tip instead of its recorded base sha, as every "
                   "workload command reads --engine: a name the workloads define, NAME=PATH|URL for a fork of "
                   "engine NAME, or a PATH|URL of the workload's default engine. Entries of another engine "
                   "are not checked (said so).")
@click.option("--ref", default=None, help="The engine ref to check against (branch, tag or sha). Default with "
                                          "--engine: the workload's ref, else HEAD.")
@click.option("--no-kernels", is_flag=True, help="Only schema, sources and patch checks (fast; no validation).")
@click.option("--no-validate", is_flag=True, help="Skip the full validation of the patched engine.")
@click.option("--record", is_flag=True, help="Write the results into each entry's bench.json (kernel tests; on "
                                              "cuda also the validator's end-to-end numbers).")
@click.option("--propose", is_flag=True,
              help="Turn the check into ONE knowledge pull request on branch optbot/store-check/<engine>: "
                   "entries that no longer apply are retired, ones that no longer win on a GPU re-tuned (or "
                   "retired), changed environments re-recorded. Without a GitHub token (or with --dry-run): a "
                   "local branch and the PR text in the run directory.")
@click.option("--dry-run", is_flag=True, help="With --propose: no push, no pull request (local branch + text).")
@github_option("repo", "With --propose: the engine's GitHub repository (default: the knowledge repository).")
@github_option("knowledge-repo", "With --propose: the GitHub repository of the knowledge (where the pull request opens).")
@github_option("knowledge-remote", "Git remote the proposal's branch is pushed to (default: the knowledge repository's origin).")
@github_option("github-api-url")
@click.option("--resume", "resume", metavar="RUN_ID", default=None,
              help="Go on with a store check that was stopped (a device call's time limit, a lost machine): "
                   "its run directory is reused, and each entry's validation keeps the seeds and the runner "
                   "processes it finished (kernel tests run again). RUN_ID as the check printed it.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def check_cmd(knowledge, entry_ids, device, preset, gpus, engine, ref, no_kernels, no_validate, record, propose,
              dry_run, repo, knowledge_repo, knowledge_remote, github_api_url, resume, json_path):
    """Re-validate entries (all but the retired ones by default), each in five checks: schema; kernel
    sources == the files the patch adds; the patch applies to the engine in a real worktree (at the
    entry's base sha, or with --engine/--ref at that engine's tip); kernel tests in an isolated
    runner process; and the full validator (`optbot validate`) on the patched engine, per workload
    the entry names: on CPU correctness and engagement, on a GPU also speed.

    \b
    Examples:
      optbot store check                                   every entry, CPU, tiny preset
      optbot store check flux2-swiglu --no-validate        one entry, kernel tests only
      optbot store check --device cuda --gpus 2 --record   every entry on 2 GPUs, full preset,
                                                           numbers into bench.json
      optbot store check --engine ~/src/diffusers --ref main --no-validate
                                                           does every patch still apply to main?
      optbot store check --engine ./engine --device cuda --propose \\
          --knowledge-repo team/optbot                     the nightly: one knowledge PR that
                                                           retires, re-tunes or re-records
      optbot store check ENTRY --device cuda --resume 20261207-143126-store-check-cb4a7b
                                                           go on where a stopped check was

    Exit code 1 when any check fails; with --propose, when an entry needs a person (held, a
    failing kernel test, a validator that could not run): every other outcome is the proposal's.
    """
    import threading

    from bot.knowledge.check import engine_tip, finish_entry, prepare_entry
    from bot.lanes import map_on_lanes

    if not (device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise click.BadParameter(f"{device!r}: expected cpu, cuda or cuda:N", param_hint="--device")
    if gpus > 1 and not device.startswith("cuda"):
        raise click.BadParameter(f"--gpus {gpus} needs --device cuda", param_hint="--gpus")
    if not no_kernels:  # kernel tests and validation run on the device; schema, sources and patch need none
        require_device(f"cuda:{gpus - 1}" if gpus > 1 else device)
    if propose and record:
        raise click.BadParameter("--propose records into the proposal's branch; --record into the working tree: "
                                 "give one", param_hint="--record")
    if propose:
        store_propose.proposal_preflight(knowledge)
    entries = _entries(knowledge, entry_ids)
    if not entry_ids:
        for e in [e for e in entries if e.status == "retired"]:
            click.echo(f"{e.id}: retired ({e.retired.reason[:120]}), not checked", err=True)
        entries = [e for e in entries if e.status != "retired"]
    run_dir = _resumed_run_dir(resume) if resume else new_run_dir("store-check")
    lanes = [f"cuda:{i}" for i in range(gpus)] if gpus > 1 else [device]
    click.echo(f"checking {len(entries)} entries on {', '.join(lanes)}; run directory {run_dir}", err=True)
    tips, cache = [], {}
    for e in entries:
        tips.append(engine_tip(e, engine, ref, cache) if (engine or ref) else None)
    for co in cache.values():
        click.echo(f"engine {co.name}: {co.repo_path} @ {co.base_sha[:12]} ({co.ref})", err=True)
    prepared = []
    for i, (e, tip) in enumerate(zip(entries, tips), 1):
        click.echo(f"[{i}/{len(entries)}] {e.id}: schema, sources, patch", err=True)
        prepared.append(prepare_entry(e, device, tip))
    lock = threading.Lock()

    def say(msg: str) -> None:
        with lock:
            click.echo(msg, err=True)

    done: dict[str, dict] = {}

    def payload(entries_json: list[dict], **extra) -> dict:
        return {"device": device, "lanes": lanes, "preset": preset, "command": command_line(), **extra,
                "entries": entries_json}

    def one(e_prep, lane: str):
        e, prep = e_prep
        say(f"{e.id}: kernel tests and validation on {lane}")
        r = finish_entry(e, prep, lane, run_dir, run_kernels=not no_kernels,
                         run_validation=not (no_kernels or no_validate), preset=preset,
                         log=lambda m, _id=e.id: say(f"  {_id}: {m}"))
        with lock:  # a partial file after each entry: a killed check keeps what it finished
            done[e.id] = r.to_json()
            partial = payload(list(done.values()), partial=True)
            write_json(run_dir / "store-check.partial.json", partial, quiet=True)
            write_json(json_path, partial, quiet=True)
        say(f"{'ok  ' if r.ok else 'FAIL'} {e.id} ({len(done)}/{len(entries)} done)")
        return r

    results = map_on_lanes(one, list(zip(entries, prepared)), lanes)
    for e, r in zip(entries, results):
        click.echo(f"{'ok  ' if r.ok else 'FAIL'} {e.id}")
        for c in r.checks:
            mark = {True: "ok", False: "FAIL", None: "--"}[c.ok]
            click.echo(f"     {mark:4} {c.name:28} {c.reason}")
        if record and not no_kernels:
            _record_correctness(e, r)
            record_validation(e, r.to_json(), command_line(), lessons_dir=knowledge.lessons, log=echo_err)
    data = payload([r.to_json() for r in results], ok=all(r.ok for r in results))
    failed = not data["ok"]
    if propose:
        p = store_propose.propose(knowledge, entries, prepared, results, tips, run_dir, device, preset, engine, ref,
                                  dict(dry_run=dry_run, repo=repo, knowledge_repo=knowledge_repo,
                                       knowledge_remote=knowledge_remote, github_api_url=github_api_url))
        data["proposal"] = {"branch": p.branch, "commit": p.commit, "files": p.files,
                            "pr": vars(p.pr) if p.pr is not None else None,
                            "decisions": [vars(d) for d in p.decisions]}
        failed = any(d.outcome == "needs-a-person" for d in p.decisions)
    write_json(run_dir / "store-check.json", data)
    write_json(json_path, data)
    if failed:
        raise SystemExit(1)




def _entries(knowledge, entry_ids) -> list:
    return [get_entry(i, knowledge.kernel_store) for i in entry_ids] if entry_ids else load_store(knowledge.kernel_store)


def _save(entry, bench) -> None:
    """The store commands' bench.json names its entry (learn's generated entries may not yet)."""
    bench.entry = bench.entry or entry.id
    save_bench(entry.path, bench)


def _record_correctness(entry, result) -> None:
    """Kernel test results (max errors per case) into bench.json, keyed by device kind."""
    kind = "cuda" if result.device.startswith("cuda") else "cpu"
    tests = {}
    for c in result.checks:
        if c.name.startswith("kernels:") and c.details.get("cases"):
            d = c.details
            tests[c.name.split(":", 1)[1]] = {
                "passed": c.ok, "interpret": d.get("interpret"),
                "cases": [{k: case.get(k, "eager" if k == "mode" else None) for k in ("mode", "shape", "dtype", "seed", "atol", "rtol", "max_abs", "max_rel", "path", "passed")}
                          for case in d["cases"]],
                "micro": d.get("micro"), "env": d.get("env")}
    if not tests:
        return
    bench = entry.bench()
    setattr(bench.correctness_section(), kind, KernelTests(command=command_line(), date=utc_now(), tests=tests))
    _save(entry, bench)


@command.command("record-bench")
@_store_opt
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def record_bench_cmd(knowledge, results):
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
            e = get_entry(r["entry_id"], knowledge.kernel_store)
            validated = record_validation(e, r, data.get("command") or command_line(), str(results), knowledge.lessons,
                                          log=echo_err)
            n += int(validated and not micro)
            if micro:
                bench = e.bench()
                bench.gpu_section().set_micro(MicroRecord(source=str(results), command=data.get("command"),
                                                          recorded_at=utc_now(), device=data.get("device"), tests=micro))
                _save(e, bench)
                n += 1
    elif "e2e" in data and isinstance(data["e2e"], dict):  # store bench --json (end to end)
        for eid, res in data["e2e"].items():
            e = get_entry(eid, knowledge.kernel_store)
            bench = e.bench()
            bench.gpu_section().end_to_end = {"source": str(results), "command": data.get("command"),
                                              "recorded_at": utc_now(), **res}
            _save(e, bench)
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
def bench_cmd(knowledge, entry_ids, device, preset, rounds, iters, timeout, json_path):
    """End-to-end step latency of the base engine vs each entry's patched engine, per workload.

    Base and patched runs are separate `step` runner jobs (one engine per process), alternated
    base/patched/base/patched so drift hits both; the median of the jobs' medians is reported.
    """
    from bot.knowledge.bench import bench_entries

    require_device(device)
    preset = preset or ("full" if device.startswith("cuda") else "tiny")
    entries = _entries(knowledge, entry_ids)
    run_dir = new_run_dir("store-bench")
    click.echo(f"benchmarking {len(entries)} entries on {device} ({preset}); run directory {run_dir}", err=True)
    data = bench_entries(entries, device, preset, rounds, iters, timeout, run_dir, echo=click.echo)
    data["command"] = command_line()
    write_json(run_dir / "store-bench.json", data)
    write_json(json_path, data)
    if not data["e2e"]:
        raise OptbotError("no entry could be benchmarked (see the lines above)")


@command.command("tune")
@_store_opt
@click.argument("entry_ids", nargs=-1)
@click.option("--device", default="cuda", show_default=True, metavar="cuda|cpu")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1, 64),
              help="One worker per GPU (cuda:0..N-1), each taking its share of the configs.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="CPU worker processes.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def tune_cmd(knowledge, entry_ids, device, gpus, workers, json_path):
    """Variant search over entries' declared config spaces, committing nothing.

    Each config of `config_space:` (entry.yaml) or `CONFIG_SPACE` (the kernel module) is checked
    against the entry's reference on its test cases; on a GPU the correct ones are timed per shape
    against the reference, and the config `optimize` would commit is named (the smallest total time
    over the shapes). On CPU the kernels run in the Triton interpreter: correctness only, speed needs
    a GPU. Entries without a config space are listed and skipped. `optimize` runs the same search
    for the entries it replays (and records it, so it is not repeated); this command is for looking
    at a space, or checking one after a kernel change.

    \b
    Examples:
      optbot store tune qwen-image-absorb-bias --device cuda --gpus 2
      optbot store tune --device cpu            every tunable entry, correctness in the interpreter
    """
    from bot.generate.variants import choose_config, search_entry

    require_device(f"cuda:{gpus - 1}" if gpus > 1 and device.startswith("cuda") else device)
    entries = _entries(knowledge, entry_ids)
    tunable = [e for e in entries if e.config_space]
    for e in entries:
        if not e.config_space:
            click.echo(f"{e.id}: no config_space declared, skipped", err=True)
    if not tunable:
        raise OptbotError("no entry to tune: none of " + ", ".join(e.id for e in entries) + " declares a config_space")
    run_dir = new_run_dir("store-tune")
    click.echo(f"tuning {len(tunable)} entries on {device}; run directory {run_dir}", err=True)
    out, broken = {"command": command_line(), "device": device, "entries": {}}, []
    for e in tunable:
        res = search_entry(e.path, device=device, run_dir=run_dir / e.id, gpus=gpus, workers=workers)
        res.chosen = choose_config(res) or {}
        click.echo(f"{e.id}: " + res.table())
        out["entries"][e.id] = res.to_json()
        if res.failures or not res.rows:
            broken.append(e.id)
    write_json(run_dir / "store-tune.json", out)
    write_json(json_path, out)
    if broken:
        raise OptbotError(f"variant search failed for {', '.join(broken)}: its workers failed (see above; "
                          f"job logs under {run_dir})")
