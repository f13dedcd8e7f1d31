"""bench.json typed (bot/knowledge/records.py): every committed file loads and dumps byte-identical,
typed parts read as their records, bad values name the file and the key, and the writers write the
format the commands always wrote."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bot.errors import ConfigError
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.records import (Bench, ModeSpeed, VariantSearch, WorkloadVerdict, load_bench, patch_file_sha256,
                                   read_bench, record_search, save_bench)
from tests.knowledge.verdicts import ENV, gpu_verdict

BENCH_FILES = sorted(SHIPPED_STORE.glob("*/bench.json"))


def test_there_are_records_to_check():
    assert len(BENCH_FILES) >= 9


@pytest.mark.parametrize("file", BENCH_FILES, ids=lambda f: f.parent.name)
def test_every_committed_bench_json_round_trips_byte_identical(file: Path, tmp_path):
    bench = read_bench(file)
    assert bench.dumps() == file.read_text()
    save_bench(tmp_path, bench)  # and through the writer
    assert (tmp_path / "bench.json").read_bytes() == file.read_bytes()


@pytest.mark.parametrize("file", BENCH_FILES, ids=lambda f: f.parent.name)
def test_the_typed_parts_read_as_records(file: Path):
    bench, raw = read_bench(file), json.loads(file.read_text())
    assert bench.entry == raw["entry"] == file.parent.name
    for rec, part in ((bench.gpu and bench.gpu.validation, raw.get("gpu", {}).get("validation")),
                      (bench.correctness and bench.correctness.cpu_validation,
                       raw.get("correctness", {}).get("cpu_validation"))):
        if part is None:
            continue
        for wl, w in rec.workloads.items():
            assert isinstance(w, WorkloadVerdict) and w.status == part["workloads"][wl]["status"]
            assert w.patch_sha256 == part["workloads"][wl]["patch_sha256"]
            for mode, sp in w.speed.items():
                assert isinstance(sp, ModeSpeed) and sp.speedup == part["workloads"][wl]["speed"][mode]["speedup"]


def test_a_changed_record_keeps_the_files_key_order_and_unknown_keys(tmp_path):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"gpu": {"later": 1, "validation": {"device": "cuda", "command": "c", "workloads": {}}},
                             "entry": "e", "extra": [1, 2]}, indent=2) + "\n")
    bench = read_bench(f)
    bench.gpu.validation.command = "d"
    bench.gpu.variant_search["h200"] = VariantSearch(run_id="r")
    out = json.loads(bench.dumps())
    assert list(out) == ["gpu", "entry", "extra"] and out["extra"] == [1, 2]
    assert list(out["gpu"]) == ["later", "validation", "variant_search"]
    assert out["gpu"]["validation"] == {"device": "cuda", "command": "d", "workloads": {}}  # no keys added


def test_a_new_record_writes_its_fields_in_order_and_leaves_unset_optional_ones_out():
    w = WorkloadVerdict.from_verdict(gpu_verdict().to_json())
    assert list(w.to_json()) == ["status", "reason", "summary", "preset", "dtype", "base_sha", "candidate_sha", "seeds",
                                 "shapes", "rule", "worst_output", "speed", "env", "seconds"]
    w.patch_sha256 = "p" * 64
    assert list(w.to_json())[-1] == "patch_sha256"
    assert Bench(entry="x").to_json() == {"entry": "x"}


def test_from_verdict_copies_the_verdicts_numbers():
    v = gpu_verdict(base_ms=(550.0, 552.0), candidate_ms=(530.0, 531.0), speedup=1.04)
    w = WorkloadVerdict.from_verdict(v.to_json())
    eager = w.speed["eager"]
    assert (eager.base_step_ms, eager.patched_step_ms, eager.speedup) == (551.0, 530.5, 1.04)
    assert eager.base_process_ms == [550.0, 552.0] and eager.trials_per_process == 10 and eager.passes == 1
    assert w.worst_output.rel_l2 == 0.003 and w.env == ENV and w.base_sha == v.base_sha
    assert w.seeds == v.correctness.seeds and w.rule == v.correctness.rule


@pytest.mark.parametrize("doc, key, expected", [
    ({"gpu": []}, "gpu", "a mapping"),
    ({"gpu": {"validation": {"workloads": {"flux2": {"speed": {"eager": {"speedup": "fast"}}}}}}},
     "gpu.validation.workloads.flux2.speed.eager.speedup", "a number"),
    ({"gpu": {"variant_search": {"h200": {"adopted": "yes"}}}}, "gpu.variant_search.h200.adopted", "true or false"),
    ({"history": [{"run_id": 7}]}, "history[0].run_id", "a string"),
    ({"gpu": {"ablation": {"flux2": {"rows": {}}}}}, "gpu.ablation.flux2.rows", "a list"),
])
def test_bad_values_name_the_file_the_key_and_the_value(tmp_path, doc, key, expected):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as ei:
        read_bench(f)
    msg = str(ei.value)
    assert msg.startswith(f"{f}: key '{key}': got ") and expected in msg, msg


def test_bad_json_names_the_file(tmp_path):
    (tmp_path / "bench.json").write_text("{nope")
    with pytest.raises(ConfigError, match=r"bench.json: key '\(json\)'"):
        load_bench(tmp_path)


def test_record_search_ties_the_search_to_the_patch(tmp_path):
    d = tmp_path / "flux2-swiglu"
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", d)
    before = json.loads((d / "bench.json").read_text())
    record_search(d, "h200", VariantSearch(run_id="r-1", config="block_n=1024", status="kept", reason="within 3%",
                                           adopted=False, torch=ENV["torch"], triton=ENV["triton"]))
    after = json.loads((d / "bench.json").read_text())
    vs = after["gpu"]["variant_search"]["h200"]
    assert list(vs) == ["run_id", "config", "status", "reason", "adopted", "torch", "triton", "patch_sha256", "date"]
    assert vs["patch_sha256"] == patch_file_sha256(d / "patch.diff")
    after["gpu"].pop("variant_search")
    assert after == before  # nothing else changed


def test_an_entry_without_bench_json_reads_as_a_new_one(tmp_path):
    assert read_bench(tmp_path / "bench.json") is None
    assert load_bench(tmp_path / "e1") == Bench(entry="e1")


def test_a_bench_json_that_is_a_list_is_a_clear_error(tmp_path):
    (tmp_path / "bench.json").write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match=r"bench\.json: key '\(top level\)': got \[1, 2\]; expected a mapping"):
        load_bench(tmp_path)
