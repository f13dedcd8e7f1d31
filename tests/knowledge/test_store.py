"""kernel_store entries (bot/knowledge/store.py): the real files load; malformed ones name the file and field."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from bot.errors import ConfigError
from bot.knowledge import OPPORTUNITY_KINDS
from bot.knowledge.location import SHIPPED_STORE as STORE_DIR
from bot.knowledge.store import added_file_content, find_entries, load_entry, load_store, patch_added_files

SEEDS = {"flux2-qk-rmsnorm-rope", "flux2-swiglu", "flux2-norm-modulate", "qwen-image-drop-all-ones-mask",
         "qwen-image-absorb-bias", "flux2-qkv-norm-rope-epilogue", "qwen-image-qkv-norm-rope-epilogue",
         "flux2-merge-qkv", "qwen-image-cfg-modulation-cache", "qwen-image-hoist-host-copies",
         "qwen-image-linear-gelu-epilogue", "qwen-image-fp8-gelu-quant", "flux2-fp8-swiglu-quant",
         "qwen-image-norm-modulate"}


def test_seed_store_loads():
    entries = {e.id: e for e in load_store(STORE_DIR)}
    assert SEEDS <= set(entries)
    for e in entries.values():
        assert e.pattern in OPPORTUNITY_KINDS
        assert e.provenance.kind == "authored" and e.provenance.author
        assert e.patch_path.is_file()
        # GPU numbers come only from a GPU run: none are invented in the seed.
        gpu = e.bench().gpu
        assert gpu is None or gpu.end_to_end is None or gpu.end_to_end.get("command")
    assert entries["flux2-qk-rmsnorm-rope"].adds_kernels == ("_qk_rmsnorm_rope_kernel",)


def test_kernel_sources_are_the_files_the_patch_adds():
    for e in load_store(STORE_DIR):
        patch = e.patch_path.read_text()
        for src in e.kernel_files():
            target = next(p for p in patch_added_files(patch) if Path(p).name == src.name)
            assert added_file_content(patch, target) == src.read_text(), src


def test_find_entries_by_pattern_engine_hardware():
    found = {e.id for e in find_entries("attention-waste", "diffusers", "h200", STORE_DIR)}
    assert found >= {"flux2-qk-rmsnorm-rope", "qwen-image-qkv-norm-rope-epilogue"}
    assert "qwen-image-drop-all-ones-mask" not in found  # retired
    assert "qwen-image-drop-all-ones-mask" in {e.id for e in find_entries("attention-waste", "diffusers", "h200",
                                                                          STORE_DIR, include_rejected=True)}
    # replay matches by engine: the SGLang entry is SGLang's alone, and only on the GPU it targets;
    # retired (measured against an attention path production does not run), it is found only when asked
    assert find_entries("attention-waste", "sglang", "h200", STORE_DIR) == []
    assert [e.id for e in find_entries("attention-waste", "sglang", "h200", STORE_DIR, include_rejected=True)] == [
        "sglang-flux2-cudnn-attention"]
    assert find_entries("attention-waste", "sglang", "cpu", STORE_DIR, include_rejected=True) == []
    assert "sglang-flux2-cudnn-attention" not in found
    assert find_entries("attention-waste", "diffusers", "mi300", STORE_DIR) == []
    # None asks nothing about a condition (the agent's read_store without a pattern)
    assert {e.id for e in find_entries(None, "diffusers", None, STORE_DIR)} == \
        {e.id for e in load_store(STORE_DIR) if e.engine.name == "diffusers" and e.status not in ("rejected", "retired")}


def _copy_entry(tmp_path: Path, entry_id: str = "flux2-swiglu") -> Path:
    dst = tmp_path / "store" / entry_id
    shutil.copytree(STORE_DIR / entry_id, dst)
    return dst


@pytest.mark.parametrize("edit, field, expected", [
    (lambda d: d.pop("pattern"), "pattern", "one of merge-siblings"),
    (lambda d: d.update(pattern="make-it-fast"), "pattern", "one of merge-siblings"),
    (lambda d: d.update(id="other-id"), "id", "the folder name"),
    (lambda d: d["provenance"].pop("author"), "provenance.author", "the person"),
    (lambda d: d.update(provenance={"kind": "generated", "agent": "x"}), "provenance.run_id", "run id"),
    (lambda d: d.update(dtype=["fp8"]), "dtype", "one of float32"),
    (lambda d: d.update(status="great"), "status", "candidate"),
    (lambda d: d["engine"].update(base_sha="main"), "engine.base_sha", "sha"),
    (lambda d: d["engine"]["patches"][0].pop("function"), "engine.patches[0].function", "required"),
    (lambda d: d.update(colour="red"), "colour", "a known field"),
])
def test_entry_schema_errors_name_file_and_field(tmp_path, edit, field, expected):
    folder = _copy_entry(tmp_path)
    data = yaml.safe_load((folder / "entry.yaml").read_text())
    edit(data)
    (folder / "entry.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as ei:
        load_entry(folder)
    msg = str(ei.value)
    assert str(folder / "entry.yaml") in msg and f"key '{field}'" in msg and expected in msg


def test_entry_bad_yaml_and_missing_patch(tmp_path):
    folder = _copy_entry(tmp_path)
    (folder / "patch.diff").unlink()
    with pytest.raises(ConfigError, match="patch.diff"):
        load_entry(folder)
    (folder / "entry.yaml").write_text("id: [unclosed\n")
    with pytest.raises(ConfigError, match=r"entry.yaml: key '\(yaml\)'"):
        load_entry(folder)


def test_an_fp8_entry_is_checked_at_the_quantized_precision():
    """store check validates an entry for quantized precisions only at the device dtype's quantized
    variant (unquantized it would be "not engaged"); every other entry at the device dtype."""
    from bot.knowledge.check import _entry_precision

    fp8 = load_entry(STORE_DIR / "qwen-image-fp8-gelu-quant")
    assert fp8.dtypes == ("float32+fp8", "bfloat16+fp8") and fp8.pattern == "quantization"
    assert _entry_precision(fp8, "float32") == "float32+fp8"
    assert _entry_precision(fp8, "bfloat16") == "bfloat16+fp8"
    plain = load_entry(STORE_DIR / "flux2-swiglu")
    assert _entry_precision(plain, "bfloat16") == "bfloat16"


def test_supersedes_names_other_entries_of_the_store(tmp_path):
    """`supersedes` lists entries whose changes this one includes: ids of other entries (a store holding
    only some of them loads), and two entries cannot supersede each other (the error names the file,
    key and value)."""
    folder = _copy_entry(tmp_path, "flux2-qkv-norm-rope-epilogue")
    store = folder.parent
    assert load_entry(folder).supersedes == ("flux2-qk-rmsnorm-rope", "flux2-merge-qkv")
    assert [e.id for e in load_store(store)] == ["flux2-qkv-norm-rope-epilogue"]  # the others are not here
    for other in ("flux2-qk-rmsnorm-rope", "flux2-merge-qkv"):
        _copy_entry(tmp_path, other)
    assert len(load_store(store)) == 3
    back = store / "flux2-merge-qkv" / "entry.yaml"
    data = yaml.safe_load(back.read_text())
    back.write_text(yaml.safe_dump({**data, "supersedes": ["flux2-qkv-norm-rope-epilogue"]}))
    with pytest.raises(ConfigError, match="does not itself supersede"):
        load_store(store)
    back.write_text(yaml.safe_dump({**data, "supersedes": ["flux2-merge-qkv"]}))
    with pytest.raises(ConfigError, match=r"supersedes\[0\]'.*another entry"):
        load_store(store)


@pytest.mark.parametrize("bad,why", [(["eager"], "other than eager"), (["compile:nope"], "compile[:RECIPE]")])
def test_enables_names_production_modes_other_than_eager(tmp_path, bad, why):
    folder = _copy_entry(tmp_path, "sglang-fp8-quant-compile")
    assert load_entry(folder).enables == ("compile", "compile+graph")
    f = folder / "entry.yaml"
    f.write_text(yaml.safe_dump({**yaml.safe_load(f.read_text()), "enables": bad}))
    with pytest.raises(ConfigError) as ei:
        load_entry(folder)
    assert "enables[0]" in str(ei.value) and why in str(ei.value) and str(f) in str(ei.value)
