"""The harness runs the real engine model in a runner child process and reports typed JSON."""
from __future__ import annotations

import os

import pytest

from bot.jobs import child_env, run_job
from bot.workload import load_workload
from runner.job import Job


def _job(wl_name, wt, kind="step", **kw):
    wl = load_workload(wl_name)
    s = wl.preset("tiny").shapes
    base = dict(kind=kind, workload=wl.to_json(), preset="tiny", device="cpu", dtype="float32",
                engine_root=str(wt / "src"), engine_sha="test", model_class=wl.engine(None).model_class,
                shapes=[{"resolution": list(s.resolution), "text_tokens": s.text_tokens, "batch": s.batch}],
                seeds=[0], warmup=1, iters=2)
    base.update(kw)
    return Job(**base)


@pytest.mark.parametrize("wl,keys", [("flux2", {"noise_pred"}), ("qwen-image", {"cond", "uncond"})])
def test_step_job_runs_the_engine_from_the_worktree(base_worktree, tmp_path, wl, keys):
    job = _job(wl, base_worktree, seeds=[1, 2], out_dir=str(tmp_path / "out"))
    out = run_job(job, tmp_path, timeout_s=300)
    assert out.ok, out.reason() + out.log_tail
    r = out.result
    # proof that the engine came from the worktree, not site-packages
    assert r["env"]["engine_file"].startswith(str(base_worktree))
    assert r["env"]["device_kind"] == "cpu" and r["latency"]["device"] == "cpu"
    assert r["latency"]["n"] == 2 and r["latency"]["min_ms"] <= r["latency"]["median_ms"] <= r["latency"]["max_ms"]
    assert r["passes"] == (2 if wl == "qwen-image" else 1)
    assert len(r["outputs"]) == 2
    for rec in r["outputs"]:
        assert set(rec["tensors"]) == keys
        assert all(t["finite"] for t in rec["tensors"].values())
        assert os.path.isfile(rec["file"])
    # different seeds, different outputs
    first = sorted(keys)[0]
    d = [rec["tensors"][first]["digest"] for rec in r["outputs"]]
    assert d[0] != d[1]


def test_outputs_are_deterministic_across_processes(base_worktree, tmp_path):
    digests = []
    for i in range(2):
        out = run_job(_job("flux2", base_worktree, iters=0, out_dir=str(tmp_path / f"o{i}")), tmp_path / str(i))
        assert out.ok, out.log_tail
        digests.append(out.result["outputs"][0]["tensors"]["noise_pred"]["digest"])
    assert digests[0] == digests[1]


def test_missing_model_class_is_a_typed_failure(base_worktree, tmp_path):
    job = _job("flux2", base_worktree, model_class="diffusers.models.transformers.transformer_flux2.NoSuchModel",
               out_dir=str(tmp_path))
    out = run_job(job, tmp_path)
    assert out.status == "failed"
    assert out.result["error"]["kind"] == "model-class-not-found"
    assert "NoSuchModel" in out.result["error"]["message"]


def test_child_environment_has_no_secrets(monkeypatch):
    for k in ("ANTHROPIC_API_KEY", "GITHUB_TOKEN", "GH_TOKEN", "MY_SECRET", "AWS_ACCESS_KEY_ID", "HF_TOKEN"):
        monkeypatch.setenv(k, "x" * 20)
    monkeypatch.setenv("PYTHONPATH", "/carried/site")
    env = child_env("/engine/src")
    assert not {"ANTHROPIC_API_KEY", "GITHUB_TOKEN", "GH_TOKEN", "MY_SECRET", "AWS_ACCESS_KEY_ID", "HF_TOKEN"} & set(env)
    parts = env["PYTHONPATH"].split(os.pathsep)
    # optbot's runner first (an engine cannot shadow it), then the engine, then the caller's path
    from bot.paths import REPO_ROOT

    assert parts[:2] == [str(REPO_ROOT), "/engine/src"] and parts[-1] == "/carried/site"


SECRETS_A_DENY_LIST_MISSED = {  # names a runner may hold that no pattern of "secret-looking" names catches
    "STRIPE_KEY": "sk_live_x", "SSH_KEY": "-----BEGIN", "DEPLOY_KEY": "x", "MYSQL_PWD": "hunter2",
    "DATABASE_URL": "postgres://u:pw@db/x", "CI_JOB_JWT": "eyJ", "SLACK_WEBHOOK_URL": "https://hooks/x",
    "SENTRY_DSN": "https://k@sentry/1", "MY_APP_CONFIG": "anything", "TORCH_HUB_TOKEN": "t"}


def test_child_environment_is_an_allow_list(monkeypatch):
    for k, v in SECRETS_A_DENY_LIST_MISSED.items():
        monkeypatch.setenv(k, v)
    for k, v in {"CUDA_VISIBLE_DEVICES": "0", "TRITON_CACHE_DIR": "/tmp/t", "LC_ALL": "C.UTF-8",
                 "NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "4"}.items():
        monkeypatch.setenv(k, v)
    env = child_env("/engine/src", "cuda")
    assert not set(SECRETS_A_DENY_LIST_MISSED) & set(env), sorted(set(SECRETS_A_DENY_LIST_MISSED) & set(env))
    assert {"CUDA_VISIBLE_DEVICES", "TRITON_CACHE_DIR", "LC_ALL", "NCCL_NVLS_ENABLE", "OMP_NUM_THREADS", "PATH",
            "PYTHONPATH"} <= set(env)


def test_child_sees_no_secret_at_runtime(tmp_path, monkeypatch):
    """End to end: the runner process itself cannot read a key the bot holds."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-should-not-leak")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('ANTHROPIC_API_KEY'))"],
                         env=child_env(str(tmp_path)), capture_output=True, text=True)
    assert out.stdout.strip() == "None"


def test_inputs_the_forward_rejects_are_a_typed_failure_naming_the_inputs(base_worktree, tmp_path):
    """What the static check (bot/model_signature.py) cannot see, the runner still names: here a
    job whose declared inputs include one FLUX.2's forward does not take."""
    job = _job("flux2", base_worktree, iters=0, out_dir=str(tmp_path))
    job.workload["inputs"]["forward"]["img_shapes"] = {"make": "literal", "value": "[(1, h, w)]"}
    out = run_job(job, tmp_path)
    assert out.status == "failed"
    err = out.result["error"]
    assert err["kind"] == "inputs" and "Flux2Transformer2DModel.forward rejected the declared inputs" in err["message"]
    assert "img_shapes" in err["message"]
