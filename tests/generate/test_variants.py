"""Variant search on CPU: the config space is read without importing the kernel, every config is
checked under TRITON_INTERPRET=1 in parallel runner processes, wrong configs are caught, and no speed
is claimed on CPU."""
from __future__ import annotations

from pathlib import Path

import git
import pytest
import yaml

from bot.errors import ConfigError, OptbotError
from bot.generate.variants import config_space_from_module, expand, find_config_space, search

KDIR = Path(__file__).resolve().parent / "kernels"
STORE = Path(__file__).resolve().parents[2] / "kernel_store"


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


# --- the variant-search candidate commit ------------------------------------------------------


def test_no_commit_without_gpu_timings(tmp_path, diffusers_engine):
    """On CPU nothing is timed, so no config is chosen and no commit is made; the result says so."""
    from bot.generate.variants import search_entry

    res = search_entry(STORE / "flux2-swiglu", device="cpu", run_dir=tmp_path / "v", workers=1,
                       space={"block_n": [256], "num_warps": [2]}, checkout=diffusers_engine)
    assert [r["correct"] for r in res.rows] == [True]
    assert res.chosen == {} and res.candidate is None and "speed needs a GPU" in res.commit_note
    assert "speed needs a GPU" in (tmp_path / "v" / "variants.json").read_text()


def fake_choice_for_test(res):
    """TEST SEAM: a CPU run has no timings, so the test names the winner itself (the first correct
    config) in the shape choose_config returns; the commit path after it is the real one."""
    row = next(r for r in res.rows if r["correct"])
    return {"label": row["label"], "config": row["config"], "total_ms": 0.0, "by": "fake_choice_for_test",
            "per_shape_ms": {}, "reference_ms": {}}


@pytest.mark.parametrize("entry_id, space, function", [
    ("flux2-swiglu", {"block_n": [512], "num_warps": [2]}, "swiglu"),
    ("flux2-norm-modulate", {"num_warps": [8]}, "_launch"),  # num_warps only reachable as _launch's default
])
def test_best_config_becomes_a_commit(tmp_path, diffusers_engine, entry_id, space, function):
    import difflib

    import git

    from bot.trailers import parse_trailers
    from bot.generate.replay import apply_entry
    from bot.generate.variants import config_site, search_entry
    from bot.knowledge.store import get_entry

    entry = get_entry(entry_id)
    res = search_entry(entry.path, device="cpu", run_dir=tmp_path / "v", workers=1, space=space,
                       checkout=diffusers_engine, opportunity_id="opp-7", choose=fake_choice_for_test)
    assert all(r["correct"] for r in res.rows), res.table()  # the config reached the kernel and is right
    c = res.candidate
    assert c is not None, res.commit_note
    assert c.generator == "variant-search" and c.entry_id == entry_id and c.kind == entry.pattern
    repo = diffusers_engine.repo
    commit = repo.commit(c.commit_sha)
    # one commit on top of the engine base, and it cherry-picks onto the base cleanly
    assert commit.parents[0].hexsha == diffusers_engine.base_sha
    wt = git.Repo(c.worktree)
    assert not wt.is_dirty(untracked_files=True)
    tr = parse_trailers(commit.message)
    assert tr["Optbot-Kind"] == entry.pattern and tr["Optbot-Entry"] == entry_id
    assert tr["Optbot-Generator"] == "variant-search" and tr["Optbot-Opportunity"] == "opp-7"
    assert tr["Optbot-Config"] == res.chosen["label"] and "Config: " in commit.message
    # the kernel file differs from the entry's only in the config: the def's line(s) and a comment
    (kfile,) = entry.kernel_files()
    engine_path = next(p for p in commit.stats.files if p.endswith("/" + kfile.name))
    old, new = kfile.read_text(), repo.git.show(f"{c.commit_sha}:{engine_path}") + "\n"
    changed = [ln for ln in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    site_old, site_new = config_site(old, list(space)), config_site(new, list(space))
    assert site_old.function == site_new.function == function
    assert {k: site_new.defaults[k] for k in space} == {k: repr(v[0]) for k, v in space.items()}
    minus, plus = [ln for ln in changed if ln[0] == "-"], [ln for ln in changed if ln[0] == "+"]
    assert changed == minus + plus and len(plus) == len(minus) + 1, changed  # one hunk: the def, then the comment
    assert "variant search" in plus[0] and f"def {function}(" in plus[1] and f"def {function}(" in minus[0]
    assert [ln[1:].split(":")[0] for ln in minus] == [ln[1:].split(":")[0] for ln in plus[1:]], changed  # only values
    # everything else is the entry's patch as replay applies it
    plain = apply_entry(diffusers_engine, entry, "opp-7", name=f"test-plain-{entry_id}")
    assert repo.git.diff(plain.candidate.commit_sha, c.commit_sha, "--name-only").split() == [engine_path]


def test_choose_config_sums_over_shapes_and_skips_wrong_configs():
    from bot.generate.variants import VariantResult, choose_config

    def t(ms):
        return {"median_ms": ms}

    res = VariantResult("t.py", {}, "", "cuda", 1, rows=[
        {"label": "a", "config": {"n": 1}, "correct": True}, {"label": "b", "config": {"n": 2}, "correct": True},
        {"label": "c", "config": {"n": 3}, "correct": False}])
    # b wins the small shape, a the large one; c is fastest but wrong
    res.timings = {"[big]": {"reference": t(9.0), "a": t(4.0), "b": t(5.0), "c": t(0.1)},
                   "[small]": {"reference": t(1.0), "a": t(0.6), "b": t(0.2), "c": t(0.1)}}
    chosen = choose_config(res)
    assert chosen["config"] == {"n": 1} and chosen["total_ms"] == pytest.approx(4.6)
    assert chosen["reference_ms"] == {"[big]": 9.0, "[small]": 1.0}
    res.device = "cpu"
    assert choose_config(res) is None


def test_a_job_device_without_an_index_is_left_to_cuda_visible_devices():
    """bot/jobs.py runs a `cuda:N` job with CUDA_VISIBLE_DEVICES=N and the device "cuda": the worker
    must not ask torch.cuda.set_device for an index there is none of (it raised ValueError on the
    H200, and every variant-search worker failed)."""
    from runner.kinds.variant_bench import cuda_index

    assert cuda_index("cuda") is None and cuda_index("cuda:1") == 1 and cuda_index("cuda:0") == 0


def test_a_tuned_config_must_beat_the_entrys_own_by_the_margin(tmp_path, diffusers_engine):
    """A config whose microbenchmark total is within MIN_TUNE_GAIN_PCT of the entry's own config is
    no candidate (it cannot pay for an end-to-end validation): nothing is committed and the search
    says it kept the entry's config; a config beyond the margin is committed. Timings are test data
    in the shape the GPU workers write (a CPU run has none)."""
    from bot.generate.variants import MIN_TUNE_GAIN_PCT, VariantResult, _label, _literal, commit_config, config_site
    from bot.knowledge.store import get_entry

    entry = get_entry("flux2-swiglu")
    (kfile,) = entry.kernel_files()
    site = config_site(kfile.read_text(), ["block_n", "num_warps"])
    own_cfg = {k: _literal(v) for k, v in site.defaults.items()}
    other_cfg = {**own_cfg, "num_warps": 16 if own_cfg["num_warps"] != 16 else 2}
    own, other = _label(own_cfg), _label(other_cfg)

    def result(other_ms):
        res = VariantResult("t.py", {}, "test", "cuda", 1, device_name="NVIDIA H200",
                            rows=[{"label": own, "config": own_cfg, "correct": True},
                                  {"label": other, "config": other_cfg, "correct": True}])
        res.timings = {"[1, 4096, 6144]": {"reference": {"median_ms": 2.0}, own: {"median_ms": 1.0},
                                           other: {"median_ms": other_ms}}}
        res.chosen = {"label": other, "config": other_cfg, "total_ms": other_ms, "by": "test",
                      "per_shape_ms": {"[1, 4096, 6144]": other_ms}, "reference_ms": {}}
        return res

    close = result(1.0 - (MIN_TUNE_GAIN_PCT / 2) / 100)
    r = commit_config(diffusers_engine, entry, close, "opp-1", name="test-close-variant")
    assert r.status == "unchanged" and r.candidate is None and close.kept == own, r.reason
    assert f"within {MIN_TUNE_GAIN_PCT:g}%" in r.reason
    far = result(1.0 - (2 * MIN_TUNE_GAIN_PCT) / 100)
    r = commit_config(diffusers_engine, entry, far, "opp-1", name="test-far-variant")
    assert r.candidate is not None and far.kept == "", r.reason
    assert r.candidate.trailers["Optbot-Config"] == other
    # the replay's choice under compile for this opportunity is kept by the tuned commit (an output an
    # FP8 GEMM quantizes: replay.under_compile); without one the entry alone decides (here: the op)
    assert r.under_compile == "op"
    r = commit_config(diffusers_engine, entry, far, "opp-1", name="test-far-variant-aside",
                      aside=("reference", "test: quantized for an FP8 GEMM"))
    assert r.candidate is not None and r.under_compile == "reference", r.reason
    assert "test: quantized for an FP8 GEMM" in git.Repo(r.worktree).head.commit.message
