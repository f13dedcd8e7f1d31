"""SGLang's own FLUX.2 and Qwen-Image DiTs at the tiny preset on CPU, in real runner processes:
`optbot profile --engine sglang` through the CLI, and the same seeded weights and inputs giving
diffusers' outputs."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bot.jobs import run_job
from bot.target import base_worktree, resolve_target
from runner.engines.sglang import missing_light_set
from runner.job import Job

ROOT = Path(__file__).resolve().parents[2]
MISSING = missing_light_set()
# CI installs the light set (pip install -e '.[test,sglang]'); elsewhere these skip with the reason.
needs_light_set = pytest.mark.skipif(
    bool(MISSING), reason=f"SGLang's light dependency set is not installed (missing: {', '.join(MISSING)}): "
                          f"pip install -r requirements-sglang.txt")
pytestmark = [needs_light_set, pytest.mark.slow]


# the repository first, then whatever the caller's PYTHONPATH holds (on the GPU box, gpu_sglang.sh's
# /tmp/site: the light set and gitpython, which the image lacks)
PATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def optbot(*args):
    env = dict(os.environ, PYTHONPATH=PATH, COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "bot", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=900)


@pytest.mark.parametrize("wl", ["flux2", "qwen-image"])
def test_profile_sglang_dit_through_the_cli(sglang_engine, tmp_path, wl):
    out = tmp_path / f"{wl}-sglang.json"
    r = optbot("profile", wl, "--engine", "sglang", "--preset", "tiny", "--device", "cpu", "--iters", "1",
               "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"engine sglang: {sglang_engine.repo_path}" in r.stderr
    p = json.loads(out.read_text())
    env = p["env"]
    # proof the model came from the engine worktree of the materialized commit
    assert env["engine_sha"] == sglang_engine.base_sha
    assert "/python/sglang/multimodal_gen/runtime/models/dits/" in env["engine_file"]
    assert env["sglang_setup"]["attention_backend"] == "torch_sdpa" and env["sglang_setup"]["tp_size"] == 1
    # on the CPU torch SDPA is SGLang's own choice too: nothing stands in for its attention
    assert env["sglang_setup"]["attention_backend_production"] == "torch_sdpa" and "sglang_attention" not in env
    # every CPU monkeypatch is reported, and none touched the engine tree
    assert any("forward_native" in x for x in env["sglang_cpu_patches"])
    assert "sgl_kernel" not in env  # the sgl_kernel stand-in is for CUDA only
    assert p["categories"]["gemm"] > 0 and p["categories"]["attention"] > 0
    assert p["passes"] == (2 if wl == "qwen-image" else 1)
    mods = {k["module"] for k in p["kernels"]}
    assert any(m.startswith("transformer_blocks.") for m in mods)
    # what SGLang's denoising stage mounts for a request of its default quality: FLUX.2 marks a site only
    # under NVFP4 (none here); Qwen-Image's packed text QKV mounts, and its GELU epilogue's guard refuses
    # float32 weights (the tiny preset's; in bf16 it mounts, and acts on CUDA inputs only)
    q = env["sglang_quality"]
    assert q["quality"] == "lossless" and q["table"].endswith("_QUALITY_FUSION_HANDLERS"), q
    if wl == "flux2":
        assert q["mounted"] == q["refused_by_its_guards"] == [], q
    if wl == "qwen-image":
        assert "Qwen-Image fused added-QKV" in q["mounted"], q
        assert ("fused linear+GELU" in q["refused_by_its_guards"]) == (p["meta"]["dtype"] == "float32"), (p["meta"], q)
        # SGLang's fused text-stream projection, seeded from the base add_q/k/v_proj names
        assert "to_added_qkv" in env["sglang_packed_params"]
        # SGLang's pipeline hands both CFG passes one timestep tensor, and its blocks reuse the first
        # pass's modulation by that identity: one modulation GEMM per block per step, as in production
        # (with a timestep per pass the cache missed and the step did the work twice)
        mod = [k for k in p["kernels"] if k["module"].endswith((".img_mod.1", ".txt_mod.1")) and k["op"] == "aten::linear"]
        assert mod and all(k["calls"] == 1 for k in mod), [(k["module"], k["calls"]) for k in mod]
    wt = Path(env["engine_file"]).parents[6]
    assert subprocess.run(["git", "status", "--porcelain"], cwd=wt, capture_output=True, text=True).stdout == ""


def _step_job(wl: str, engine: str, out_dir: Path, dtype: str = "float32") -> Job:
    t = resolve_target(wl, engine, None, "tiny", "cpu")
    wt = base_worktree(t)
    s = t.workload.preset("tiny").shapes
    return Job(kind="step", workload=t.workload.to_json(), preset="tiny", device="cpu", dtype=dtype,
               engine_root=t.engine_root(wt), engine_sha=t.checkout.base_sha, model_class=t.model_class,
               shapes=[{"resolution": list(s.resolution), "text_tokens": s.text_tokens, "batch": s.batch}],
               seeds=[3], weight_seed=5, iters=0, out_dir=str(out_dir))


def _step_outputs(wl: str, engine: str, out_dir: Path, dtype: str = "float32") -> dict:
    job = _step_job(wl, engine, out_dir, dtype)
    o = run_job(job, out_dir, timeout_s=900, name=f"step-{engine}")
    assert o.ok, o.reason() + "\n" + o.log_tail
    return torch.load(o.result["outputs"][0]["file"])


@pytest.mark.parametrize("wl", ["flux2", "qwen-image"])
def test_sglang_matches_diffusers_in_fp32(sglang_engine, diffusers_engine, tmp_path, wl):
    ref = _step_outputs(wl, "diffusers", tmp_path / "d")
    got = _step_outputs(wl, "sglang", tmp_path / "s")
    assert set(ref) == set(got)
    for k in ref:
        a, b = ref[k], got[k]
        assert a.shape == b.shape and torch.isfinite(b).all()
        if wl == "flux2":
            # the same GEMMs in the same order: bit-identical
            assert torch.equal(a, b), f"{k}: max abs diff {(a - b).abs().max().item():.3g}"
        else:
            # Measured: max abs 2.4e-6 (rel 1.7e-7): float32 rounding of differently ordered ops;
            # the workload's fp32 tolerance is the bar, and a real difference (a wrong weight, a
            # missing timestep scale) is orders of magnitude above it.
            rel = ((a - b).norm() / a.norm()).item()
            assert rel <= 1e-5, f"{k}: rel l2 {rel:.3g}"
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3)


NOOP_EDITS = {  # a line of SGLang's real source, rewritten without changing what runs
    "flux2": ("python/sglang/multimodal_gen/runtime/models/dits/flux_2.py",
              "        timestep = timestep.to(hidden_states.dtype)\n",
              "        timestep = timestep.to(dtype=hidden_states.dtype)  # optbot test: same op\n"),
    "qwen-image": ("python/sglang/multimodal_gen/runtime/models/dits/qwen_image.py",
                   "        hidden_states, _ = self.img_in(hidden_states)\n",
                   "        hidden_states, _ = self.img_in(hidden_states)  # optbot test: same op\n"),
}


# FLUX.2 only: the validator's SGLang path is the same for both models (Qwen-Image's adapter
# translation is covered by the fp32 and profile tests above), and Qwen-Image's run cost 46 s of the
# 30-minute CI budget
@pytest.mark.parametrize("wl", ["flux2"])
def test_validate_a_patch_of_sglang_s_source(sglang_engine, tmp_path, wl):
    """`optbot validate --engine sglang` on a patch of SGLang's own file: outputs bit-identical on
    every seed and shape, and the validator sees that nothing new runs (not engaged)."""
    import difflib

    rel, old, new = NOOP_EDITS[wl]
    text = (sglang_engine.repo_path / rel).read_text()
    assert text.count(old) == 1
    diff = "".join(difflib.unified_diff(text.splitlines(True), text.replace(old, new).splitlines(True),
                                        f"a/{rel}", f"b/{rel}"))
    patch = tmp_path / "noop.patch"
    patch.write_text(f"diff --git a/{rel} b/{rel}\n" + diff)
    out = tmp_path / "verdict.json"
    r = optbot("validate", wl, "--engine", "sglang", "--preset", "tiny", "--device", "cpu",
               "--candidate", str(patch), "--json", str(out))
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # rejected
    assert "correctness: PASS" in r.stdout and "not-engaged" in r.stdout
    assert "Traceback" not in r.stderr


FP8_BUILD = """
import dataclasses, json, sys
import torch
from runner import env as envmod, harness
from runner.job import Job
from runner.weights import seeded_tensor
job = Job(**json.loads(sys.argv[1]))
sys.path.insert(0, job.engine_root)  # as the runner's main does before building
from runner.engines import sglang_fp8
plain = harness.build(dataclasses.replace(job, dtype="float32"))
ref = harness.make_step(plain, job, job.shapes[0], job.seeds[0])[0]()
built = harness.build(job)
layers = sglang_fp8.fp8_layers(built.model)
pending = all(bool(torch.isnan(m.input_scale).all()) for _, m in layers)
mapping = type(built.model).packed_modules_mapping
# the checkpoint's weight scales: each base tensor's amax / 448, as SGLang's converter writes them
worst = 0.0
for name, m in layers:
    leaf = name.rsplit(".", 1)[-1]
    parent = name[: -len(leaf)]
    bases = [f"{parent}{b}" for b in mapping[leaf]] if leaf in mapping else [name]
    for base, width, s in zip(bases, m.logical_widths, m.weight_scale.tolist()):
        w = seeded_tensor(base + ".weight", (width, m.weight.shape[1]), job.weight_seed, "cpu", torch.float32)
        worst = max(worst, abs(s - float(w.abs().amax()) / 448) / s)
got = harness.make_step(built, job, job.shapes[0], job.seeds[0])[0]()
after = sglang_fp8.fp8_layers(built.model)
print(json.dumps({
    "layers": len(layers), "packed": sum(len(m.logical_widths) > 1 for _, m in layers),
    "pending_before_calls": pending, "worst_weight_scale_rel": worst,
    "e4m3": all(m.weight.dtype == torch.float8_e4m3fn for _, m in after),
    "input_scales": [float(m.input_scale) for _, m in after],
    "methods": sorted({type(m.quant_method).__name__ for _, m in after}),
    "rel": {k: ((got[k] - ref[k]).norm() / ref[k].norm()).item() for k in ref},
    "quant": envmod.noted("quant")}))
"""


@pytest.mark.parametrize("wl", ["flux2", "qwen-image"])
def test_sglang_in_fp8_runs_its_own_modelopt_path(sglang_engine, tmp_path, wl):
    """`--quant fp8` on SGLang is what a team serving FP8 on SGLang runs: a ModelOpt FP8 checkpoint
    (e4m3 weights with one scale per checkpoint tensor, static input scales) through SGLang's own
    FP8 linear and its FP8-only model paths (runner/engines/sglang_fp8.py). Built from the seeds:
    every quantized layer's weight scales are its base tensors' amax / 448 (a fused layer one per
    packed tensor), its input scale is pending until the first step's inputs calibrate it, then a
    finite positive scalar after SGLang's own post-load processing. The step differs from the
    unquantized one by what e4m3 costs (measured 2026-12-05 on the CPU, tiny: rel L2 FLUX.2 0.059,
    Qwen-Image 0.056 per pass, mostly the per-tensor weight scales: input scales 16x too large give
    the same 0.059, 4x too small clip the inputs and give 0.396), and the result says which FP8 ran,
    what stayed unquantized and how the scales were calibrated."""
    job = _step_job(wl, "sglang", tmp_path, "float32+fp8")
    r = subprocess.run([sys.executable, "-c", FP8_BUILD, json.dumps(dataclasses.asdict(job))],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=PATH),
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["layers"] > 20 and got["packed"] > 0 and got["pending_before_calls"]
    assert got["worst_weight_scale_rel"] < 1e-6
    assert got["e4m3"] and got["methods"] == ["ModelOptFp8LinearMethod"]
    assert all(0 < s < 1 for s in got["input_scales"])
    assert all(1e-3 < v < 0.1 for v in got["rel"].values()), got["rel"]
    quant = got["quant"]
    cal = quant["calibration"]
    assert quant["implementation"].startswith("SGLang's own ModelOpt FP8")
    assert quant["left_unquantized"] and "without its quantization config" in quant["left_unquantized_why"]
    assert cal["layers"] == cal["processed_after_loading"] == quant["linear_layers"] == got["layers"]


CUDNN_FIRST = """
import dataclasses, json, sys
from runner import harness
from runner.engines import sglang
from runner.job import Job
job = Job(**json.loads(sys.argv[1]))
sys.path.insert(0, job.engine_root)  # as the runner's main does before building
built = harness.build(job)
layers = [m for m in built.model.modules() if hasattr(m, "attn_impl")]
before = [m.allow_cudnn_sdp for m in layers]
n = sglang.cudnn_first(built.model)
print(json.dumps({"n": n, "layers": len(layers), "before": any(before),
                  "layer_set": all(m.allow_cudnn_sdp for m in layers),
                  "impls": sorted({type(m.attn_impl).__name__ for m in layers}),
                  "impl_set": all(m.attn_impl.allow_cudnn_sdp for m in layers),
                  "later_impls_set": all(m._attn_impl_ctor_kwargs["allow_cudnn_sdp"] for m in layers)}))
"""


@pytest.mark.parametrize("wl", ["flux2", "qwen-image"])
def test_the_fa3_stand_in_reaches_every_attention_layer(sglang_engine, tmp_path, wl):
    """On the GPU box SGLang's FlashAttention 3 cannot load, and its stand-in is torch SDPA with
    cuDNN first (runner/engines/sglang.py FA3_NOTE). SGLang leaves that switch to each attention
    layer and its implementation; `cudnn_first` must reach every one of the real DiT's (here built
    on the CPU, where the switch changes nothing: it acts on CUDA tensors only)."""
    job = _step_job(wl, "sglang", tmp_path)
    r = subprocess.run([sys.executable, "-c", CUDNN_FIRST, json.dumps(dataclasses.asdict(job))],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=PATH),
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["layers"] > 0 and got["n"] == got["layers"] and not got["before"]
    assert got["layer_set"] and got["impl_set"] and got["later_impls_set"] and got["impls"] == ["SDPAImpl"]


@pytest.mark.gpu
def test_on_hopper_sglangs_attention_is_a_recorded_stand_in_for_fa3(sglang_engine, tmp_path):
    """On a GPU whose SGLang default is FlashAttention 3 and where sgl_kernel is stood in, the
    result says what ran in its place, on how many layers."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper GPU (SGLang's default there is FA3)")
    out = tmp_path / "p.json"
    r = optbot("profile", "flux2", "--engine", "sglang", "--preset", "tiny", "--device", "cuda", "--iters", "1",
               "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    env = json.loads(out.read_text())["env"]
    assert env["sglang_setup"]["attention_backend_production"] == "fa"
    assert env["sglang_attention"].startswith("torch SDPA with cuDNN's kernel first on ")
    # the analyzer leaves the code that runs only for the stand-ins alone (bot/analyze/rank.mark_stand_ins)
    assert set(env["stand_in_code"]) >= {"attention"} and all(env["stand_in_code"].values())
