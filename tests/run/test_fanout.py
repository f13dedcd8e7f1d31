"""Fan-out (bot/run/fanout.py, `optbot shard`): one run's validation over several machines gives the
run one host gives. Real `python -m bot` subprocesses, real steps, CPU, tiny preset, a two-entry
store (two candidates): a single-host run, then the same run planned (`--stop-after generate`,
`shard plan --shards 2`), its two shards validated each in its own run directory (shard 2 on a
"new machine": a fresh OPTBOT_HOME whose engine repository has none of the candidate commits),
merged on an aggregate "machine" (an empty runs directory: the run comes from the plan) and
resumed there. Timings differ between the runs; candidates, verdict statuses, stack members and
the report's structure must not. Then what merge must refuse, each with the file named."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest

ROOT = Path(__file__).resolve().parents[2]
# two of the quickest entries to validate on CPU (no kernel to interpret: 14 and 29 s alone), one per
# shard; they apply together, so the stack is both (one stack validation per run). FLUX.2's two
# quickest that conflict took 428 s for this module's fixture, its Triton epilogue interpreted.
WL = "qwen-image"
ENTRIES = ("qwen-image-cfg-modulation-cache", "qwen-image-linear-gelu-epilogue")
# replay only: the two store entries are the candidates this is about; compile-region (tested in
# tests/generate/test_compile_region.py) would add an inductor build to every validation process
OPT = ["optimize", WL, "--device", "cpu", "--iters", "2", "--generators", "replay"]


def _knowledge(at: Path) -> Path:
    at.mkdir()
    r = git.Repo.init(at, initial_branch="main")
    (at / "README.md").write_text("knowledge\n")
    for e in ENTRIES:
        shutil.copytree(ROOT / "kernel_store" / e, at / "kernel_store" / e)
    (at / "lessons").mkdir()
    (at / "lessons" / ".keep").write_text("")
    r.git.add("-A")
    r.git.commit("-qm", "init", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@l",
                                     "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@l"})
    return at


def _bot(args: list[str], env: dict, cwd: Path, runs: Path, ok=(0,)) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "bot", *map(str, args)], env={**env, "OPTBOT_RUNS_DIR": str(runs)},
                       cwd=cwd, capture_output=True, text=True, timeout=900)
    if ok is not None:
        assert p.returncode in ok, f"{args}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p


@pytest.fixture(scope="module")
def fan(tmp_path_factory, diffusers_engine):
    tmp = tmp_path_factory.mktemp("fanout")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_TOKEN", "OPTBOT_GITHUB_TOKEN", "GH_TOKEN", "ANTHROPIC_API_KEY", "OPTBOT_ABORT_AFTER")}
    env.update(OPTBOT_KNOWLEDGE_PATH=str(_knowledge(tmp / "knowledge")),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    d = {"tmp": tmp, "env": env}

    # one host
    _bot([*OPT, "--json", tmp / "single.json"], env, tmp, tmp / "runs-single")
    d["single"] = json.loads((tmp / "single.json").read_text())
    d["single_report"] = Path(d["single"]["deliver"]["report_md"]).read_text()

    # the plan: steps 1-5, stopped (exit 75, paused), then two shards planned; a second plan of the
    # same run is made too (a re-plan: its results must not mix with the first's)
    runs = tmp / "runs-plan"
    p = _bot([*OPT, "--stop-after", "generate", "--json", tmp / "planned.json"], env, tmp, runs, ok=(75,))
    d["stop_line"] = " ".join(p.stderr.split())
    d["planned"] = json.loads((tmp / "planned.json").read_text())
    run_id = d["run_id"] = d["planned"]["run_id"]
    d["plan_out"] = _bot(["shard", "plan", run_id, "--shards", "2", "--out", tmp / "plan", "--github-output",
                          tmp / "gh-output", "--json", tmp / "plan.json"], env, tmp, runs).stdout
    _bot(["shard", "plan", run_id, "--shards", "2", "--out", tmp / "plan-again"], env, tmp, runs)

    # the shards, each on its own "machine" (runs directory); shard 2's engine repository is new
    _bot(["shard", "validate", tmp / "plan", "--shard", "1/2", "--out", tmp / "s1"], env, tmp, tmp / "runs-s1")
    home2 = tmp / "home-s2"
    shutil.copytree(Path(os.environ["OPTBOT_HOME"]) / "downloads", home2 / "downloads")
    d["home2"] = home2
    _bot(["shard", "validate", tmp / "plan", "--shard", "2/2", "--out", tmp / "s2"], {**env, "OPTBOT_HOME": str(home2)},
         tmp, tmp / "runs-s2")

    # the aggregate: nothing of the run here but what the plan carries
    agg = tmp / "runs-aggregate"
    d["merge_out"] = _bot(["shard", "merge", tmp / "plan", tmp / "s1", tmp / "s2"], env, tmp, agg).stdout
    _bot(["optimize", WL, "--resume", run_id, "--json", tmp / "fanned.json"], env, tmp, agg)
    d["fanned"] = json.loads((tmp / "fanned.json").read_text())
    d["fanned_report"] = Path(d["fanned"]["deliver"]["report_md"]).read_text()
    d["agg_state"] = json.loads((agg / run_id / "state.json").read_text())
    return d


def _structure(md: str) -> list[str]:
    """The report's headings and its tables' header rows, with shas, run ids and numbers taken out
    (the profile's rows and every timing differ from run to run)."""
    lines = md.splitlines()
    keep = [ln for i, ln in enumerate(lines) if ln.startswith("#")
            or (ln.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[-: |]+\|?", lines[i + 1]))]
    return [re.sub(r"\d{8}-\d{6}-optimize-[0-9a-f]{6}|[0-9a-f]{12,40}|\d+(\.\d+)?", "N", ln) for ln in keep]


@pytest.mark.slow
def test_fanned_out_run_is_the_single_host_run(fan):
    single, fanned = fan["single"], fan["fanned"]
    assert fanned["finished"] is True
    # the plan stopped after generate as --pause-after would, and said how to go on
    assert fan["planned"]["paused"] is True and fan["planned"]["validate"] is None
    assert f"--resume {fan['run_id']}" in fan["stop_line"] and "stopped after generate" in fan["stop_line"]

    cands = lambda out: [(c["id"], c["kind"], c["entry_id"]) for c in out["generate"]["candidates"]]  # noqa: E731
    assert len(cands(single)) == 2 and cands(fanned) == cands(single)
    # (a replay commit names its run, so the shas differ between the runs; within the fanned run they are the plan's)
    plan = json.loads((fan["tmp"] / "plan.json").read_text())
    assert [(c["id"], c["commit_sha"]) for c in plan["candidates"]] == \
        [(c["id"], c["commit_sha"]) for c in fanned["generate"]["candidates"]]
    assert all(fanned["validate"]["verdicts"][c["id"]]["candidate_sha"] == c["commit_sha"] for c in plan["candidates"])
    statuses = lambda out: {k: (v["status"], v["reason"]) for k, v in out["validate"]["verdicts"].items()}  # noqa: E731
    assert statuses(fanned) == statuses(single)
    stack = lambda out: ([c["candidate_id"] for c in out["combine"]["commits"]],  # noqa: E731
                         [d.split(":")[0] for d in out["combine"]["dropped"]],
                         out["combine"]["stack_verdict"] and out["combine"]["stack_verdict"]["status"])
    assert stack(fanned) == stack(single) and stack(single)[0]
    assert fanned["combine"]["branch"] == single["combine"]["branch"]
    assert _structure(fan["fanned_report"]) == _structure(fan["single_report"])
    # each verdict was measured by its shard, on its machine, not again by the aggregate
    for c in plan["candidates"]:
        v = fanned["validate"]["verdicts"][c["id"]]
        assert f"runs-s{c['shard']}" in v["run_dir"], (c, v["run_dir"])
    # the aggregate's state: all nine steps, validate done in this attempt from the merged checkpoints
    assert list(fan["agg_state"]["steps"]) == ["checkout", "baseline", "profile", "analyze", "generate", "validate",
                                               "combine", "learn", "deliver"]
    assert fan["agg_state"]["attempts"] == 2


@pytest.mark.slow
def test_the_plan_assigns_round_robin_and_says_so_to_the_workflow(fan):
    plan = json.loads((fan["tmp"] / "plan.json").read_text())
    ids = [c["id"] for c in fan["planned"]["generate"]["candidates"]]
    assert [(c["id"], c["shard"]) for c in plan["candidates"]] == [(ids[0], 1), (ids[1], 2)]
    assert plan["shards"] == 2 and plan["run_id"] == fan["run_id"] and re.fullmatch(r"[0-9a-f]{32}", plan["plan_id"])
    assert (fan["tmp"] / "gh-output").read_text().splitlines() == [f"run_id={fan['run_id']}", "shards=2",
                                                                   "matrix=[1, 2]"]
    assert f"shard 1/2: {ids[0]}" in fan["plan_out"] and f"shard 2/2: {ids[1]}" in fan["plan_out"]
    carried = fan["tmp"] / "plan"
    assert (carried / "run" / "candidates.bundle").is_file() and (carried / "run" / "validate" / "seeds.json").is_file()
    assert not list(carried.rglob("*.pt"))  # runner outputs stay on the plan machine
    assert sorted(p.name for p in (carried / "knowledge" / "kernel_store").iterdir()) == sorted(ENTRIES)
    for i, cid in ((1, ids[0]), (2, ids[1])):
        r = json.loads((fan["tmp"] / f"s{i}" / "shard.json").read_text())
        assert (r["shard"], r["shards"], r["candidates"], r["plan_id"]) == (i, 2, [cid], plan["plan_id"])
        assert r["device"] == "cpu" and r["hardware"] == "cpu" and r["not_validated"] == {}
        # each verdict exactly as the validate step checkpointed it in the shard's copy of the run
        work = next((fan["tmp"] / f"runs-s{i}").glob(f"{fan['run_id']}.plan-*.shard-{i}-of-2"))
        assert (fan["tmp"] / f"s{i}" / "verdicts" / f"{cid}.json").read_bytes() == \
            (work / "validate" / cid / "verdict-record.json").read_bytes()
    # shard 2's machine had none of the commits: they came from the plan's bundle
    repo = git.Repo(fan["home2"] / "engines" / "diffusers-0.42.1")
    repo.commit(plan["candidates"][1]["commit_sha"])
    assert "merged 2 verdict(s)" in fan["merge_out"] and f"--resume {fan['run_id']}" in fan["merge_out"]


# ------------------------------------------------------------------------------------------ refused

def _refused(fan, tmp_path, plan: Path, *dirs: Path) -> str:
    """merge on a fresh aggregate machine: exit 2, one line, no traceback, nothing merged."""
    runs = tmp_path / "runs"
    p = _bot(["shard", "merge", plan, *dirs], fan["env"], tmp_path, runs, ok=(2,))
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not list((runs / fan["run_id"] / "validate").glob("*/verdict-record.json"))
    return " ".join(p.stderr.split())


def _copy(fan, tmp_path, name: str) -> Path:
    return Path(shutil.copytree(fan["tmp"] / name, tmp_path / name))


@pytest.mark.slow
def test_a_missing_shard_is_refused(fan, tmp_path):
    err = _refused(fan, tmp_path, fan["tmp"] / "plan", _copy(fan, tmp_path, "s1"))
    assert "no result of shard(s) 2/2" in err


@pytest.mark.slow
def test_a_duplicated_verdict_is_refused(fan, tmp_path):
    s1, s2 = _copy(fan, tmp_path, "s1"), _copy(fan, tmp_path, "s2")
    err = _refused(fan, tmp_path, fan["tmp"] / "plan", s1, s1)
    assert f"{s1 / 'shard.json'}: shard 1/2 again" in err
    # shard 2 also claims shard 1's candidate
    cid = json.loads((s1 / "shard.json").read_text())["candidates"][0]
    shutil.copy(s1 / "verdicts" / f"{cid}.json", s2 / "verdicts" / f"{cid}.json")
    r = json.loads((s2 / "shard.json").read_text())
    r["candidates"].append(cid)
    (s2 / "shard.json").write_text(json.dumps(r))
    err = _refused(fan, tmp_path, fan["tmp"] / "plan", s1, s2)
    assert f"{s2 / 'verdicts' / (cid + '.json')}: a second verdict for {cid}" in err and str(s1) in err


@pytest.mark.slow
def test_a_result_of_another_plan_is_refused(fan, tmp_path):
    """The run planned again: the first plan's shard results do not belong to the second plan."""
    s1, s2 = _copy(fan, tmp_path, "s1"), _copy(fan, tmp_path, "s2")
    err = _refused(fan, tmp_path, fan["tmp"] / "plan-again", s1, s2)
    first = json.loads((fan["tmp"] / "plan.json").read_text())["plan_id"]
    assert f"{s1 / 'shard.json'}: a result of plan {first[:12]}" in err and "refused" in err


@pytest.mark.slow
def test_a_verdict_for_another_commit_is_refused(fan, tmp_path):
    s1, s2 = _copy(fan, tmp_path, "s1"), _copy(fan, tmp_path, "s2")
    cid = json.loads((s2 / "shard.json").read_text())["candidates"][0]
    f = s2 / "verdicts" / f"{cid}.json"
    rec = json.loads(f.read_text())
    other = fan["planned"]["generate"]["candidates"][0]["commit_sha"]  # shard 1's commit, a real one
    rec["sha"] = rec["verdict"]["candidate_sha"] = other
    f.write_text(json.dumps(rec))
    err = _refused(fan, tmp_path, fan["tmp"] / "plan", s1, s2)
    assert f"{f}: the record's sha '{other}' is not {cid}'s planned commit" in err


@pytest.mark.slow
@pytest.mark.parametrize("tamper, says", [
    (lambda d, f: (f.unlink(), f.symlink_to("/etc/passwd")), "links"),
    (lambda d, f: (d / "verdicts" / "extra.json").write_text("{}"), "files shard.json does not name"),
    (lambda d, f: f.write_text(" " * (4 * 1024 * 1024 + 1)), "more than the 4194304 allowed"),
    (lambda d, f: f.write_text(json.dumps({**json.loads(f.read_text()), "shell": "rm -rf /"})), "expected the keys"),
    (lambda d, f: f.write_text(re.sub(r'"seconds": [0-9.]+', '"seconds": "fast"', f.read_text(), count=1)),
     "expected float, got str"),
], ids=["link", "extra-file", "oversized", "extra-key", "mistyped"])
def test_shard_results_are_untrusted_input(fan, tmp_path, tamper, says):
    s1, s2 = _copy(fan, tmp_path, "s1"), _copy(fan, tmp_path, "s2")
    cid = json.loads((s2 / "shard.json").read_text())["candidates"][0]
    tamper(s2, s2 / "verdicts" / f"{cid}.json")
    err = _refused(fan, tmp_path, fan["tmp"] / "plan", s1, s2)
    assert says in err and str(s2) in err


def test_stop_after_names_every_step_but_the_last():
    from bot.commands.optimize import command
    from bot.run.state import STEPS

    opt = next(p for p in command.params if p.name == "stop_after")
    assert tuple(opt.type.choices) == STEPS[:-1]


def test_bad_shard_specs_are_clear_errors():
    from bot.errors import OptbotError
    from bot.run.fanout import parse_shard

    assert parse_shard("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "1", "1/0", "a/b", "1/2/3", " /2"):
        with pytest.raises(OptbotError, match="--shard"):
            parse_shard(bad)


def test_strict_parsing_takes_each_scalar_as_its_type_only():
    """What merge reads from a shard is parsed strictly; the run directory's own files as before."""
    from bot.jsonable import from_json
    from bot.run.fanout import ShardResult

    good = {"plan_id": "a" * 32, "run_id": "r", "shard": 1, "shards": 2, "candidates": ["c1"], "seconds": 3}
    assert from_json(ShardResult, good, strict=True).seconds == 3.0
    for key, bad in (("shard", True), ("shard", "1"), ("seconds", "fast"), ("candidates", [1]), ("env", [])):
        with pytest.raises(TypeError, match=key):
            from_json(ShardResult, {**good, key: bad}, strict=True)
    assert from_json(ShardResult, {**good, "shard": "1"}).shard == "1"  # not strict: unchanged behaviour
