"""Learning without an engine run (bot/knowledge/learn.py): outcomes -> entries and lessons; a
replayed entry's verdict joins its history (and the GPU verdict the next run reuses) instead of
duplicating it; an accepted variant becomes the entry; a store check's GPU rejection is a caveat."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from bot.hardware import hardware_name
from bot.knowledge import learn
from bot.knowledge.known import known_verdict, patch_sha256
from bot.knowledge.lessons import load_lesson, search
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.records import WorkloadVerdict
from bot.knowledge.store import find_entries, get_entry
from tests.knowledge.verdicts import ENV, gpu_verdict

PATCH = """diff --git a/src/pkg/mod.py b/src/pkg/mod.py
index 1..2 100644
--- a/src/pkg/mod.py
+++ b/src/pkg/mod.py
@@ -1,2 +1,2 @@ def f(x):
-    return x * 2
+    return x + x
diff --git a/src/pkg/k.py b/src/pkg/k.py
new file mode 100644
--- /dev/null
+++ b/src/pkg/k.py
@@ -0,0 +1 @@
+K = 1
"""


def _generated(status="accepted", reason="correct", device="cpu", sha="abcdef1234567890", kind="fuse-elementwise-chain"):
    """An agent's candidate, validated (no store entry behind it)."""
    return learn.Outcome(candidate_id="c1", kind=kind, generator="agent/fuse", run_id="20261129-191500-optimize-abc123",
                         status=status, reason=reason, numbers={"speedup": 1.2, "failures": ["x differs at [0, 1]"]},
                         device=device, hardware=hardware_name(device, "NVIDIA H200"), engine="diffusers",
                         engine_source="pypi-sdist:diffusers==0.42.1", base_sha="0" * 40, commit_sha=sha,
                         title="f: add instead of multiply", patch=PATCH, changed_files=["src/pkg/mod.py", "src/pkg/k.py"],
                         added_files={"src/pkg/k.py": "K = 1\n"}, workload="flux2",
                         shapes=[{"resolution": [256, 256], "text_tokens": 32, "batch": 1}], dtype="float32",
                         validated_by="bot.validate")


def test_root_causes():
    assert "different" in learn.root_cause("correctness: noise_pred max abs 3e-2")
    assert "not run inside" in learn.root_cause("not engaged: no op changed")
    assert "not run inside" in learn.root_cause("not-engaged")  # verdict reasons are hyphenated
    assert "noise" in learn.root_cause("no change: x1.001")
    assert "hang" in learn.root_cause("timeout: after 900 s")


def test_accepted_and_rejected_outcomes(tmp_path):
    store, lessons = tmp_path / "ks", tmp_path / "ls"
    ok = learn.learn(_generated(device="cuda"), store_dir=store, lessons_dir=lessons)
    entry = yaml.safe_load((ok.entry_dir / "entry.yaml").read_text())
    assert entry["status"] == "validated-gpu" and entry["hardware"] == ["h200"]
    assert entry["provenance"]["kind"] == "generated" and entry["provenance"]["run_id"].endswith("abc123")
    assert entry["engine"]["patches"][0] == {"file": "src/pkg/mod.py", "function": "f"}
    assert (ok.entry_dir / "k.py").read_text() == "K = 1\n" and (ok.entry_dir / "patch.diff").read_text() == PATCH
    assert get_entry(ok.entry_dir.name, store).provenance.agent == "agent/fuse"  # the real loader reads it
    bench = json.loads((ok.entry_dir / "bench.json").read_text())
    assert list(bench) == ["validated_by", "device", "hardware", "verdict", "reason", "numbers", "engine_sha",
                           "base_sha", "run_id"]  # no GPU verdict in the outcome: none recorded
    assert load_lesson(ok.lesson_path).kind == "pattern"
    # the same outcome learned again (a resumed run) rewrites, never duplicates
    again = learn.learn(_generated(device="cuda"), store_dir=store, lessons_dir=lessons)
    assert again.entry_dir == ok.entry_dir and len(list(store.iterdir())) == 1 and len(list(lessons.iterdir())) == 1
    bad = learn.learn(_generated(status="rejected", reason="slower: x0.91 (cuda)", sha="9999999999", device="cuda"),
                      store_dir=store, lessons_dir=lessons)
    text = bad.lesson_path.read_text()
    assert bad.entry_dir is None and "kind: caveat" in text and "Root cause: the candidate is correct but slower" in text
    assert "- x differs at [0, 1]" in text
    # what was learned is what the next run retrieves, by pattern, engine and hardware
    got = search("", "fuse-elementwise-chain", "diffusers", "h200", root=lessons, caveats_first=True)
    assert [lesson.kind for lesson in got] == ["caveat", "pattern"]
    assert search("", "fuse-elementwise-chain", "sglang", "h200", root=lessons) == []
    assert [e.id for e in find_entries("fuse-elementwise-chain", "diffusers", "h200", store)] == [ok.entry_dir.name]


@pytest.fixture
def entry(tmp_path):
    shutil.copytree(SHIPPED_STORE / "flux2-swiglu", tmp_path / "store" / "flux2-swiglu")
    return get_entry("flux2-swiglu", tmp_path / "store")


def _replayed(status: str, **kw) -> learn.Outcome:
    base = dict(candidate_id="replay-flux2-swiglu", kind="fuse-elementwise-chain", generator="replay", run_id="r-1",
                status=status, reason="accepted" if status == "accepted" else "no-change: 1.004x",
                numbers={"eager": {"speedup": 1.03}}, device="cuda", hardware="h200", engine="diffusers",
                engine_source="x", base_sha="b" * 40, commit_sha="c" * 40, title="Fused SwiGLU", patch="",
                workload="flux2", dtype="bfloat16", entry_id="flux2-swiglu")
    base.update(kw)
    return learn.Outcome(**base)


def _ask(entry):
    return known_verdict(entry, "flux2", "h200", "b" * 40, "full", "bfloat16", ENV)


def test_a_replayed_entry_gets_history_not_a_copy(entry, tmp_path):
    store, lessons = entry.path.parent, tmp_path / "lessons"
    before = json.loads(entry.bench_path.read_text())
    got = learn.learn(_replayed("accepted"), store_dir=store, lessons_dir=lessons)
    assert got.entry_dir is None and got.lesson_path is None  # success of a known entry: no new files
    assert sorted(p.name for p in store.iterdir()) == ["flux2-swiglu"]
    after = json.loads(entry.bench_path.read_text())
    assert [(h["run_id"], h["status"]) for h in after["history"]] == [("r-1", "accepted")]
    assert {k: v for k, v in after.items() if k != "history"} == before  # the rest of the record is kept
    learn.learn(_replayed("accepted"), store_dir=store, lessons_dir=lessons)  # a resumed run: same row rewritten
    assert len(json.loads(entry.bench_path.read_text())["history"]) == 1
    got = learn.learn(_replayed("rejected", run_id="r-2"), store_dir=store, lessons_dir=lessons)
    assert got.lesson_path is not None and "flux2-swiglu" in got.lesson_path.read_text()  # a failure is news
    assert [h["run_id"] for h in json.loads(entry.bench_path.read_text())["history"]] == ["r-1", "r-2"]


def test_a_gpu_verdict_learned_in_a_run_is_known_to_the_next(entry, tmp_path):
    """The loop closes: a verdict measured in one run (learn) is what the next run looks up (known)."""
    store, lessons = entry.path.parent, tmp_path / "lessons"
    entry.bench_path.unlink(missing_ok=True)
    verdict = gpu_verdict(base_ms=(550.0, 552.0), candidate_ms=(530.0, 531.0), speedup=1.04).to_json()
    learn.learn(_replayed("accepted", verdict=verdict, command="optbot optimize flux2 --device cuda"),
                store_dir=store, lessons_dir=lessons)
    rec = json.loads(entry.bench_path.read_text())["gpu"]["validation"]
    assert list(rec) == ["command", "run_id", "recorded_at", "device", "workloads"]
    assert rec["run_id"] == "r-1" and rec["command"] == "optbot optimize flux2 --device cuda"
    k, why = _ask(entry)
    assert k is not None, why
    assert k.status == "accepted" and k.speedup == 1.04 and k.numbers["speed"]["eager"]["base_process_ms"] == [550.0, 552.0]
    # an accepted GPU verdict promotes a candidate entry, as `store check --record` does; a rejection does not
    yml = entry.path / "entry.yaml"
    yml.write_text(yml.read_text().replace("status: validated-gpu", "status: candidate"))
    learn.learn(_replayed("rejected", run_id="r-0", verdict=gpu_verdict(status="rejected", reason="no-change").to_json()),
                store_dir=store, lessons_dir=lessons)
    assert "status: candidate" in yml.read_text()
    learn.learn(_replayed("accepted", verdict=verdict), store_dir=store, lessons_dir=lessons)
    assert "status: validated-gpu" in yml.read_text()
    # a CPU verdict is not a GPU verdict: nothing recorded for reuse
    entry.bench_path.unlink()
    learn.learn(_replayed("accepted", device="cpu", hardware="cpu", verdict=verdict), store_dir=store, lessons_dir=lessons)
    assert "gpu" not in json.loads(entry.bench_path.read_text())


def test_an_accepted_variant_becomes_the_entry(entry, tmp_path):
    """Variant search's winner, accepted on a GPU: the entry adopts its patch and kernel source, the
    verdict is recorded against the new patch, and the search is recorded so it is not repeated."""
    store, lessons = entry.path.parent, tmp_path / "lessons"
    entry.bench_path.unlink(missing_ok=True)
    old_patch = entry.patch_path.read_text()
    kernel = next(p for p in entry.path.glob("*.py") if not p.name.startswith("test_"))
    new_src = kernel.read_text() + "\n# tuned by variant search (test)\n"
    new_patch = old_patch + "\n"  # the variant commit's diff (test data: any change will do)
    verdict = gpu_verdict(base_ms=(550.0,), candidate_ms=(524.0,), speedup=1.05).to_json()
    o = _replayed("accepted", generator="variant-search", candidate_id="variant-flux2-swiglu", patch=new_patch,
                  added_files={f"src/diffusers/models/optbot_kernels/{kernel.name}": new_src}, verdict=verdict,
                  config="block_n=2048,num_warps=8")
    learn.learn(o, store_dir=store, lessons_dir=lessons)
    assert entry.patch_path.read_text() == new_patch and kernel.read_text() == new_src
    gpu = json.loads(entry.bench_path.read_text())["gpu"]
    vs = gpu["variant_search"]["h200"]
    assert vs["adopted"] and vs["config"] == "block_n=2048,num_warps=8" and vs["patch_sha256"] == patch_sha256(entry)
    assert (vs["torch"], vs["triton"]) == (ENV["torch"], ENV["triton"])
    assert gpu["validation"]["workloads"]["flux2"]["patch_sha256"] == patch_sha256(entry)
    k, why = _ask(entry)
    assert k is not None and k.speedup == 1.05, why

    # a rejected variant changes nothing in the entry, but its search is remembered
    rejected = gpu_verdict(status="rejected", reason="no-change").to_json()
    o2 = _replayed("rejected", generator="variant-search", run_id="r-2", patch=new_patch + "\n", verdict=rejected,
                   config="block_n=256,num_warps=2")
    learn.learn(o2, store_dir=store, lessons_dir=lessons)
    assert entry.patch_path.read_text() == new_patch
    vs = json.loads(entry.bench_path.read_text())["gpu"]["variant_search"]["h200"]
    assert vs["run_id"] == "r-2" and not vs["adopted"] and vs["status"] == "rejected"


def test_a_store_checks_gpu_rejection_is_a_caveat_until_accepted(entry, tmp_path):
    lessons = tmp_path / "lessons"
    rejected = WorkloadVerdict.from_verdict(gpu_verdict(status="rejected", reason="no-change", speedup=1.002).to_json())
    f = learn.check_lesson(entry, "flux2", "h200", rejected, "optbot store check --device cuda --record", lessons)
    lesson = load_lesson(f)
    assert f.name == "flux2-swiglu-on-h200-flux2.md" and lesson.kind == "caveat"
    assert lesson.applies_to == {"pattern": "fuse-elementwise-chain", "engine": "diffusers", "hardware": "h200"}
    assert "eager 1.002x (base 551.0 -> 531.7 ms per step" in lesson.body and "inside the measurement noise" in lesson.body
    accepted = WorkloadVerdict.from_verdict(gpu_verdict().to_json())
    assert learn.check_lesson(entry, "flux2", "h200", accepted, "c", lessons) is None and not f.exists()


def test_a_verdict_with_kernels_aside_under_compile_is_not_the_entrys(entry, tmp_path):
    """A replay or tuned variant whose kernels stepped aside under torch.compile (replay.under_compile)
    is another patch than the entry's: its GPU verdict is not recorded as the entry's and the entry
    does not adopt its sources, so a later run that keeps the op cannot reuse or inherit it."""
    store, lessons = entry.path.parent, tmp_path / "lessons"
    entry.bench_path.unlink(missing_ok=True)
    old_patch = entry.patch_path.read_text()
    aside_patch = old_patch.replace('UNDER_COMPILE = "op"', 'UNDER_COMPILE = "reference"')
    assert aside_patch != old_patch
    verdict = gpu_verdict(base_ms=(550.0,), candidate_ms=(524.0,), speedup=1.05).to_json()
    learn.learn(_replayed("accepted", verdict=verdict, patch=aside_patch), store_dir=store, lessons_dir=lessons)
    assert "validation" not in (json.loads(entry.bench_path.read_text()).get("gpu") or {})
    kernel = next(p for p in entry.path.glob("*.py") if not p.name.startswith("test_"))
    src = kernel.read_text()
    o = _replayed("accepted", generator="variant-search", candidate_id="variant-flux2-swiglu", patch=aside_patch,
                  added_files={f"src/diffusers/models/optbot_kernels/{kernel.name}": src.replace('"op"', '"reference"')},
                  verdict=verdict, config="block_n=2048,num_warps=8")
    learn.learn(o, store_dir=store, lessons_dir=lessons)
    assert entry.patch_path.read_text() == old_patch and kernel.read_text() == src
    assert json.loads(entry.bench_path.read_text())["gpu"]["variant_search"]["h200"]["adopted"] is False
    # the same verdict of the entry's own patch is recorded, as before
    learn.learn(_replayed("accepted", verdict=verdict, patch=old_patch), store_dir=store, lessons_dir=lessons)
    assert json.loads(entry.bench_path.read_text())["gpu"]["validation"]["workloads"]["flux2"]


def test_the_same_outcome_of_two_runs_is_one_lesson_seen_twice(tmp_path):
    """Merged by signature: a second run's same rejection updates the first run's lesson (evidence of
    both, seen 2, last-seen the later day); the same run again (a resumed learn) counts once; another
    result (slower vs no-change) or another hardware is a lesson of its own."""
    import dataclasses
    import datetime as dt

    from bot.knowledge.lessons import write_lesson

    lessons = tmp_path / "ls"
    first = _generated(status="rejected", reason="slower: x0.91", sha="1111111111", device="cuda")
    second = dataclasses.replace(first, run_id="20261202-101500-optimize-def456", commit_sha="2222222222")
    assert learn.outcome_signature(first) == learn.outcome_signature(second)  # shas and numbers do not split it
    # the first run's lesson, dated a day earlier (write_outcome_lesson dates today)
    f1 = write_lesson(lessons, "first-run", "caveat", {"pattern": first.kind}, [f"run:{first.run_id}"], "medium",
                      "# Failed", signature=learn.outcome_signature(first), today=dt.date.today() - dt.timedelta(days=1))
    f2 = learn.write_outcome_lesson(second, lessons)
    le = load_lesson(f2)
    assert f2 == f1 and len(list(lessons.iterdir())) == 1
    assert le.seen == 2 and le.last_seen == dt.date.today().isoformat() and le.first_seen < le.last_seen
    assert {f"run:{first.run_id}", f"run:{second.run_id}"} <= set(le.evidence)
    assert le.body.startswith("# Failed: f: add instead of multiply")  # the newest body
    assert load_lesson(learn.write_outcome_lesson(second, lessons)).seen == 2  # the same run again counts once
    other = learn.write_outcome_lesson(dataclasses.replace(second, reason="no-change: 1.004x", commit_sha="33333333"),
                                       lessons)
    on_cpu = learn.write_outcome_lesson(dataclasses.replace(second, device="cpu", hardware="cpu", commit_sha="44444444"),
                                        lessons)
    assert len({f1, other, on_cpu}) == 3 and len(list(lessons.iterdir())) == 3


def test_a_lesson_not_seen_for_long_ranks_after_the_fresh_and_says_so(tmp_path):
    import datetime as dt

    from bot.generate.agent.prompts import knowledge_block
    from bot.knowledge.lessons import STALE_DAYS, write_lesson

    lessons = tmp_path / "ls"
    today = dt.date.today()
    applies = {"pattern": "fuse-elementwise-chain", "engine": "diffusers", "hardware": "h200"}
    write_lesson(lessons, "a-old", "caveat", applies, ["run:r1"], "medium", "# Old failure",
                 signature="s-old", today=today - dt.timedelta(days=STALE_DAYS + 30))
    write_lesson(lessons, "b-new", "caveat", applies, ["run:r2"], "medium", "# New failure",
                 signature="s-new", today=today)
    write_lesson(lessons, "c-person", "caveat", applies, ["test:x"], "high", "# Written by a person")
    got = search("", "fuse-elementwise-chain", "diffusers", "h200", root=lessons)
    assert [le.slug for le in got] == ["b-new", "c-person", "a-old"]
    assert got[-1].stale() and not got[0].stale() and got[1].age_days() is None
    block = knowledge_block("fuse-elementwise-chain", "diffusers", "h200", lessons_dir=lessons,
                            store_dir=tmp_path / "empty")
    assert f"stale: {STALE_DAYS + 30} days ago] a-old" in block and "seen 1 time, last" in block
    assert block.index("b-new") < block.index("a-old")


def test_a_generated_entry_is_named_after_what_it_changes(tmp_path):
    """Not after the opportunity's kind (a SwiGLU edit once became gen-attention-waste-...): the
    kernels it adds, else its title; another commit's entry of that name is not overwritten."""
    import dataclasses

    store = tmp_path / "ks"
    swiglu = dataclasses.replace(_generated(device="cuda", kind="attention-waste"), adds_kernels=["_fused_swiglu_kernel"],
                                 title="optbot: fuse SwiGLU")
    first = learn.learn(swiglu, store_dir=store, lessons_dir=tmp_path / "ls").entry_dir
    assert first.name == "flux2-fused-swiglu"
    assert learn.learn(swiglu, store_dir=store, lessons_dir=tmp_path / "ls").entry_dir == first  # re-learned: same
    other = learn.learn(dataclasses.replace(swiglu, commit_sha="feedfacefeedface"), store_dir=store,
                        lessons_dir=tmp_path / "ls").entry_dir
    assert other != first and other.name.startswith("flux2-fused-swiglu-abc123-feedface") and first.is_dir()
    titled = learn.learn(dataclasses.replace(_generated(device="cuda"), title="optbot: merge the Q/K/V projections",
                                             commit_sha="0123456789ab"), store_dir=store, lessons_dir=tmp_path / "ls")
    assert titled.entry_dir.name == "flux2-merge-the-q-k-v-projections"
