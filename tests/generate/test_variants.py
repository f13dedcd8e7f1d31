"""Variant search on CPU: the config space is read without importing the kernel, every config is
checked under TRITON_INTERPRET=1 in parallel runner processes, wrong configs are caught, and no speed
is claimed on CPU."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bot.errors import ConfigError, OptbotError
from bot.generate.variants import config_space_from_module, expand, find_config_space, search

KDIR = Path(__file__).resolve().parent / "kernels"


def test_space_from_module_and_entry(tmp_path):
    space, where = find_config_space(test_module=KDIR / "test_scaled_add.py")
    assert space == {"BLOCK": [16, 64, 256], "num_warps": [1, 4], "buggy": [False, True]} and where.endswith("scaled_add.py")
    assert len(expand(space)) == 12
    entry = tmp_path / "e"
    entry.mkdir()
    (entry / "entry.yaml").write_text(yaml.safe_dump({"id": "e", "config_space": {"BLOCK": [32]}}))
    assert find_config_space(entry, KDIR / "test_scaled_add.py")[0] == {"BLOCK": [32]}
    bad = tmp_path / "bad.py"
    bad.write_text("CONFIG_SPACE = {'BLOCK': []}\n")
    with pytest.raises(ConfigError, match="CONFIG_SPACE"):
        config_space_from_module(bad)
    with pytest.raises(OptbotError, match="over the limit"):
        expand({"a": list(range(20)), "b": list(range(20))})


def test_variant_search_cpu(tmp_path):
    space = {"BLOCK": [16, 256], "num_warps": [1], "buggy": [False, True]}
    res = search(KDIR / "test_scaled_add.py", space, device="cpu", run_dir=tmp_path / "v", workers=2, seeds=(0,))
    assert res.failures == [] and res.workers == 2 and len(res.rows) == 4
    by = {r["label"]: r for r in res.rows}
    assert by["BLOCK=16,buggy=False,num_warps=1"]["correct"] and by["BLOCK=256,buggy=False,num_warps=1"]["correct"]
    wrong = by["BLOCK=16,buggy=True,num_warps=1"]
    assert not wrong["correct"] and "max abs err" in wrong["reason"]
    assert res.best == {} and res.timings == {} and "speed needs a GPU" in res.note
    assert (tmp_path / "v" / "variants.json").is_file()
    assert "speed needs a GPU" in res.table()


@pytest.mark.gpu
def test_variant_search_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    space = {"BLOCK": [256, 1024, 4096], "num_warps": [4, 8], "buggy": [False]}
    res = search(KDIR / "test_scaled_add.py", space, device="cuda", run_dir=tmp_path / "v", gpus=torch.cuda.device_count(),
                 dtype="bfloat16", seeds=(0,), shapes=[[1 << 24]])
    assert res.failures == [] and all(r["correct"] for r in res.rows)
    assert list(res.best) == ["[16777216]"] and res.best["[16777216]"]["median_ms"] > 0
    print(res.table())


def test_config_reaches_the_kernel_source_function(tmp_path):
    """A test module whose kernel(*inputs) takes no config (the store's seed entries): the one public
    function of the kernel source that takes every config key is called instead."""
    import shutil

    d = tmp_path / "entry"
    d.mkdir()
    shutil.copy(KDIR / "scaled_add.py", d / "scaled_add.py")
    src = (KDIR / "test_scaled_add.py").read_text()
    src = src.replace("def kernel_with_config(x, y, alpha, **config):\n    return op.scaled_add(x, y, alpha, **config)\n", "")
    assert "kernel_with_config" not in src
    (d / "test_scaled_add.py").write_text(src)
    res = search(d / "test_scaled_add.py", {"BLOCK": [32], "buggy": [True]}, device="cpu", run_dir=tmp_path / "v",
                 workers=1, seeds=(0,), shapes=[[37]])
    assert res.failures == [] and [r["correct"] for r in res.rows] == [False]  # buggy=True reached the kernel
