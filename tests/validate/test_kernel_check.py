"""kernel_check job: a Triton kernel (TRITON_INTERPRET=1 on CPU) against its reference, with the
M=1 and odd-M shapes the validator adds; one process for both modules."""
from __future__ import annotations

from pathlib import Path

from bot.jobs import run_job
from bot.paths import REPO_ROOT
from runner.job import Job

HERE = Path(__file__).resolve().parent / "kernels"


def test_kernel_check_odd_shapes(tmp_path):
    job = Job(kind="kernel_check", workload={}, preset="tiny", device="cpu", dtype="float32",
              engine_root=str(REPO_ROOT), engine_sha="", model_class="", shapes=[], seeds=[11, 12345],
              out_dir=str(tmp_path), params={"tests": [str(HERE / "test_rowscale_good.py"),
                                                       str(HERE / "test_rowscale_bad.py")],
                                             "tolerance": {"float32": {"atol": 1e-5, "rtol": 1e-5}}})
    out = run_job(job, tmp_path, timeout_s=300, name="kernels")
    assert out.ok, out.log_tail
    good, bad = out.result["tests"]
    assert good["ok"] and good["micro"] == "speed needs a GPU"
    shapes = {tuple(c["shape"]) for c in good["cases"]}
    assert {(64, 96), (48, 40), (1, 96), (37, 96)} <= shapes
    assert not bad["ok"]
    failed = {tuple(c["shape"]) for c in bad["cases"] if not c["ok"]}
    assert failed == {(1, 96), (37, 96)}, bad["cases"]
    assert all("NaN" in c["reason"] for c in bad["cases"] if not c["ok"])
