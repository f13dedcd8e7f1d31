"""bot/validate/correctness.py and the runner side it drives: the compare job's checks
(runner/kinds/compare.py), poisoning (runner/poison.py), the input check
(runner/kinds/validate_step.py); the kernel tests a revision names. The kernel_check job itself:
test_kernel_check.py."""
from __future__ import annotations

import pytest

from bot.errors import OptbotError
from bot.validate.correctness import correctness_summary, kernel_tests_for
from bot.validate.resolve import Revision
from bot.validate.verdict import Correctness, OutputCheck


def test_compare_reports_where_and_how_much():
    import torch

    from runner.kinds.compare import check

    tol = {"rel_l2": 1e-5, "atol": 1e-4, "rtol": 1e-3}
    b = torch.randn(1, 32, 8, generator=torch.Generator().manual_seed(3))
    assert check("y", b, b.clone(), tol, False)["ok"]
    c = b.clone()
    c[0, 17, 5] += 0.5
    r = check("y", b, c, tol, False)
    assert not r["ok"] and r["at"] == [0, 17, 5] and abs(r["max_abs"] - 0.5) < 1e-6 and r["violations"] == 1
    assert "[0, 17, 5]" in r["reason"]
    c = b.clone()
    c[0, 3, 1] = float("nan")
    r = check("y", b, c, tol, False)
    assert not r["ok"] and r["nonfinite"] == 1 and r["at"] == [0, 3, 1]
    c = b.clone()
    c[0, 0, 0] = torch.nextafter(c[0, 0, 0], torch.tensor(10.0))
    assert check("y", b, c, tol, False)["ok"] and not check("y", b, c, None, True)["ok"]
    assert not check("y", b, b[:, :31], tol, False)["ok"]


def test_no_farther_from_the_unquantized_model_than_the_base():
    """A quantized precision's second condition (runner/kinds/compare.py `farther`): the candidate's
    distance from the unquantized model against the quantized base's, within a factor. A candidate
    as far from the base as the base is from the model passes when it is no farther from the model
    (two roundings of one value); one that adds error of its own does not."""
    import torch

    from runner.kinds.compare import farther

    g = torch.Generator().manual_seed(5)
    ref = torch.randn(1, 64, 16, generator=g)
    base = ref + 0.1 * torch.randn(ref.shape, generator=g)  # the recipe's own error
    other = ref + 0.1 * torch.randn(ref.shape, generator=g)  # another rounding, as far from the model
    worse = base + 0.08 * torch.randn(ref.shape, generator=g)  # the base's error and more
    r = farther("y", ref, base, other, 1.05)
    assert r["ok"] and abs(r["rel_l2"] - r["base_rel_l2"]) < 0.02 and "the quantized base's" in r["reason"]
    assert float((other - base).norm() / base.norm()) > 0.1  # far from the base all the same
    r = farther("y", ref, base, worse, 1.05)
    assert not r["ok"] and r["rel_l2"] > 1.2 * r["base_rel_l2"] and "FAIL" in r["reason"]
    assert farther("y", ref, base, base.clone(), 1.0)["ok"]  # the base itself, with no slack
    nan = base.clone()
    nan[0, 0, 0] = float("nan")
    assert not farther("y", ref, base, nan, 1.05)["ok"]
    assert not farther("y", ref, base, base[:, :32], 1.05)["ok"]


def test_poison_makes_uninitialized_tensors_nan():
    import torch

    from runner.poison import PoisonEmpty, poison_allocator

    poison_allocator("cpu")
    with torch.inference_mode(), PoisonEmpty() as mode:
        a = torch.empty(17, 5)
        b = torch.empty_like(a)
        c = a.new_empty(3)
        d = torch.randn(4) + 1  # real work is untouched
        i = torch.empty(3, dtype=torch.long)
    assert a.isnan().all() and b.isnan().all() and c.isnan().all() and torch.isfinite(d).all()
    assert mode.filled == 3 and i.dtype == torch.long


def test_input_changes_located():
    import torch

    from runner.kinds.validate_step import input_changes

    x = torch.randn(2, 4, 3)
    before = {"pass0.hidden_states": x.clone()}
    assert input_changes(before, {"pass0.hidden_states": x}) == []
    x[1, 2, 0] = 0.0
    ch = input_changes(before, {"pass0.hidden_states": x})
    assert ch[0]["at"] == [1, 2, 0] and ch[0]["changed"] == 1


def test_kernel_tests_a_revision_names(tmp_path):
    """From the kernel store it is given (the run's knowledge, bot/knowledge/location.py), not cwd's."""
    wt, root = tmp_path / "wt", tmp_path / "optbot"
    (wt / "tests").mkdir(parents=True)
    (wt / "tests" / "test_rms.py").write_text("")
    entry = root / "kernel_store" / "no-such-entry-in-the-real-store"
    entry.mkdir(parents=True)
    for name in ("test_b.py", "test_a.py", "helper.py"):
        (entry / name).write_text("")
    rev = Revision("x", "c" * 40, "b" * 40, wt, [], {"Optbot-Kernel-Tests": ["tests/test_rms.py"],
                                                     "Optbot-Entry": [entry.name]})
    assert kernel_tests_for(rev, root / "kernel_store") == sorted([str((wt / "tests" / "test_rms.py").resolve()),
                                                  str(entry / "test_a.py"), str(entry / "test_b.py")])
    (tmp_path / "outside.py").write_text("")
    outside = Revision("x", "c" * 40, "b" * 40, wt, [], {"Optbot-Kernel-Tests": ["../outside.py"]})
    with pytest.raises(OptbotError, match="not a file inside the candidate's worktree"):
        kernel_tests_for(outside, root / "kernel_store")


def _check(label: str, ok: bool) -> OutputCheck:
    return OutputCheck(label, "noise_pred", ok, "" if ok else f"noise_pred: max abs 0.5 at [0, 1, 2] ({label})",
                       max_abs=0.0 if ok else 0.5, at=None if ok else [0, 1, 2], rel_l2=1e-7 if ok else 0.2)


def test_a_correctness_rejection_says_the_first_thing_wrong():
    corr = Correctness(ok=False, seeds=[5, 6], shapes=["256x256/txt32/b1", "176x240/txt19/b1"], rule="bit-exact",
                       checks=[_check("256x256/txt32/b1 seed 5", True), _check("176x240/txt19/b1 seed 5", False),
                               _check("176x240/txt19/b1 seed 6", False)])
    assert correctness_summary(corr) == ("2 of 3 output checks fail (shapes 176x240/txt19/b1); first: "
                                         "176x240/txt19/b1 seed 5: noise_pred: max abs 0.5 at [0, 1, 2] "
                                         "(176x240/txt19/b1 seed 5)")
    corr.inputs_modified = ["256x256/txt32/b1 seed 5: pass0.hidden_states changed in place"]
    assert correctness_summary(corr).startswith("modified its inputs in place: 256x256/txt32/b1 seed 5")
    kernel = Correctness(ok=False, seeds=[5], shapes=[], rule="bit-exact", checks=[_check("a seed 5", True)],
                         kernels=[{"name": "rms", "ok": False, "cases": [
                             {"ok": True, "shape": [64, 96], "seed": 5, "reason": ""},
                             {"ok": False, "shape": [37, 96], "seed": 5, "reason": "3 NaN"}]}])
    assert correctness_summary(kernel) == "kernel rms differs from its reference at shape [37, 96] seed 5: 3 NaN"


@pytest.mark.parametrize("engine,bound", [("sglang", 4.8e-2), ("diffusers", 9.0e-2)])
def test_the_compare_job_gets_the_engines_own_fp8_bound(monkeypatch, tmp_path, engine, bound):
    """A FLUX.2 candidate at bfloat16+fp8 is judged by its engine's bound: SGLang's FP8 path has its
    own error (workloads/flux2.yaml, engines.sglang), so its compare job gets half of that, not the
    torchao-derived bound the diffusers engine keeps."""
    from types import SimpleNamespace

    import bot.validate.correctness as correctness
    from bot.jobs import JobOutcome
    from bot.workload import load_workload

    sent = {}
    ctx = SimpleNamespace(target=SimpleNamespace(workload=load_workload("flux2"), dtype="bfloat16+fp8", engine_name=engine),
                          seeds=[1], shapes=[], run_dir=tmp_path, say=lambda *_: None,
                          job=lambda kind, wt, sha, name, params: sent.update(params) or SimpleNamespace(),
                          run_job=lambda *a, **k: JobOutcome("ok", {"checks": []}))
    corr = correctness.check_outputs(ctx, {"runs": []}, {"runs": []})
    assert sent["tolerance"]["rel_l2"] == bound and f"rel_l2 <= {bound:g}" in corr.rule
