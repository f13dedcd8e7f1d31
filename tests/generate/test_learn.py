"""Learning without an engine run: outcomes -> entries and lessons, retrieval."""
from __future__ import annotations

import yaml

from bot.knowledge import learn

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


def _outcome(status="accepted", reason="correct", device="cpu", sha="abcdef1234567890", kind="fuse-elementwise-chain"):
    return learn.Outcome(candidate_id="c1", kind=kind, generator="agent/fuse", run_id="20261129-191500-optimize-abc123",
                         status=status, reason=reason, numbers={"speedup": 1.2, "failures": ["x differs at [0, 1]"]},
                         device=device, hardware=learn.hardware_name(device, "NVIDIA H200"), engine="diffusers",
                         engine_source="pypi-sdist:diffusers==0.42.1", base_sha="0" * 40, commit_sha=sha,
                         title="f: add instead of multiply", patch=PATCH, changed_files=["src/pkg/mod.py", "src/pkg/k.py"],
                         added_files={"src/pkg/k.py": "K = 1\n"}, workload="flux2",
                         shapes=[{"resolution": [256, 256], "text_tokens": 32, "batch": 1}], dtype="float32",
                         validated_by="bot.validate")


def test_root_causes_and_hardware():
    assert "different" in learn.root_cause("correctness: noise_pred max abs 3e-2")
    assert "not run inside" in learn.root_cause("not engaged: no op changed")
    assert "noise" in learn.root_cause("no change: x1.001")
    assert "hang" in learn.root_cause("timeout: after 900 s")
    assert learn.hardware_name("cuda", "NVIDIA H200") == "h200" and learn.hardware_name("cpu") == "cpu"


def test_accepted_and_rejected_outcomes(tmp_path):
    store, lessons = tmp_path / "ks", tmp_path / "ls"
    ok = learn.learn(_outcome(device="cuda"), store_dir=store, lessons_dir=lessons)
    entry = yaml.safe_load((ok.entry_dir / "entry.yaml").read_text())
    assert entry["status"] == "validated-gpu" and entry["hardware"] == ["h200"]
    assert entry["provenance"]["kind"] == "generated" and entry["provenance"]["run_id"].endswith("abc123")
    assert entry["engine"]["patches"][0] == {"file": "src/pkg/mod.py", "function": "f"}
    assert (ok.entry_dir / "k.py").read_text() == "K = 1\n" and (ok.entry_dir / "patch.diff").read_text() == PATCH
    assert "kind: pattern" in ok.lesson_path.read_text()
    # the same outcome learned again (a resumed run) rewrites, never duplicates
    again = learn.learn(_outcome(device="cuda"), store_dir=store, lessons_dir=lessons)
    assert again.entry_dir == ok.entry_dir and len(list(store.iterdir())) == 1 and len(list(lessons.iterdir())) == 1
    bad = learn.learn(_outcome(status="rejected", reason="slower: x0.91 (cuda)", sha="9999999999", device="cuda"),
                      store_dir=store, lessons_dir=lessons)
    text = bad.lesson_path.read_text()
    assert bad.entry_dir is None and "kind: caveat" in text and "Root cause: the candidate is correct but slower" in text
    assert "- x differs at [0, 1]" in text
    # retrieval by pattern, engine and hardware
    assert [lv.kind for lv in learn.find_lessons("fuse-elementwise-chain", "diffusers", "h200", lessons_dir=lessons)] == ["caveat", "pattern"]
    assert learn.find_lessons("fuse-elementwise-chain", "sglang", "h200", lessons_dir=lessons) == []
    assert learn.find_lessons("fuse-elementwise-chain", "diffusers", "cpu", lessons_dir=lessons) == []
    assert [lv.kind for lv in learn.find_lessons(None, None, None, query="slower", lessons_dir=lessons)] == ["caveat"]
    assert [e.id for e in learn.find_entries("fuse-elementwise-chain", "diffusers", "h200", store)] == [ok.entry_dir.name]
    assert learn.find_entries("merge-siblings", store_dir=store) == []
    assert "no store entry" in learn.store_entry_text("../ls", store)

