"""Fast unit tests of the validator's parts (no model builds)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bot.paths import REPO_ROOT


def test_bot_side_never_imports_torch():
    code = ("import sys, bot.validate, bot.validate.verdict, bot.validate.ablate, bot.validate.resolve, bot.commands.validate, "
            "bot.commands.ablate; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_trailers_parsed_and_merged():
    from bot.validate.resolve import parse_trailers

    msg = "Subject\n\nbody\n\nOptbot-Kind: merge-siblings\nOptbot-Adds-Kernels: a, b\nOptbot-Adds-Kernels: b, c\n"
    assert parse_trailers(msg) == {"Optbot-Kind": ["merge-siblings"], "Optbot-Adds-Kernels": ["a", "b", "c"]}


def test_one_trailer_parser_for_validator_and_generators():
    """bot/candidate (lists) and bot/generate/candidate (text) read the same trailers: the last
    paragraph only, "none" = no values, folded lines joined."""
    from bot.validate.resolve import parse_trailers as lists
    from bot.generate.candidate import commit_message, make_trailers, parse_trailers as text, split_kernels

    msg = commit_message("t", "prose\nOptbot-Kind: not-a-trailer", make_trailers("", "absorb-bias", ["k1", "k2"], []))
    msg += "Optbot-Generator: variant-search,\n  extra\n"
    assert text(msg)["Optbot-Kind"] == "absorb-bias" and text(msg)["Optbot-Removes-Kernels"] == "none"
    assert lists(msg)["Optbot-Kind"] == ["absorb-bias"] and lists(msg)["Optbot-Removes-Kernels"] == []
    assert lists(msg)["Optbot-Generator"] == ["variant-search", "extra"]
    assert {k: split_kernels(v) for k, v in text(msg).items()} == lists(msg)


def test_fresh_seeds_are_random_and_never_zero():
    from bot.validate import fresh_seeds

    a, b = fresh_seeds(3), fresh_seeds(3)
    assert len(set(a)) == 3 and 0 not in a and a != b


def test_declared_kernel_matching():
    from bot.validate.validator import declared_matches

    e = ("aten::linear", "aten::linear", "transformer_blocks.*.attn.to_qkv")
    assert declared_matches("attn.to_qkv", e)
    assert not declared_matches("attn.to_qkv", ("aten::linear", "aten::linear", "single.*.attn.to_qkv_mlp_proj"))
    assert not declared_matches("attn.to_q", e)
    assert declared_matches("fused_rms", ("triton_red_fused_rms_norm_0", "", ""))
    # scoped: the SiLU inside SwiGLU, not the one in the modulation MLP
    assert declared_matches("aten::silu@*gate_fn", ("aten::silu", "aten::silu", "transformer_blocks.0.ff.act_fn.gate_fn"))
    assert not declared_matches("aten::silu@*gate_fn", ("aten::silu", "aten::silu", "double_stream_modulation_img.act_fn"))
    assert not declared_matches("aten::gelu@*gate_fn", ("aten::silu", "aten::silu", "blocks.0.gate_fn"))


def _cand(trailers):
    from pathlib import Path

    from bot.validate.resolve import Candidate

    return Candidate("x", "c" * 40, "b" * 40, Path("."), [], trailers)


def test_engagement_rules():
    from bot.validate.validator import _engagement

    base = {"histogram": [["aten::linear", "aten::linear", "blocks.*.attn.to_q", 2],
                          ["aten::linear", "aten::linear", "blocks.*.attn.to_k", 2]]}
    same = _engagement(_cand({}), base, base)
    assert not same.ok and "identical" in same.reason
    cand = {"histogram": [["aten::linear", "aten::linear", "blocks.*.attn.to_qkv", 2]]}
    assert _engagement(_cand({}), base, cand).ok
    ok = _engagement(_cand({"Optbot-Adds-Kernels": ["attn.to_qkv"], "Optbot-Removes-Kernels": ["attn.to_k"]}), base, cand)
    assert ok.ok, ok.reason
    missing = _engagement(_cand({"Optbot-Adds-Kernels": ["my_triton_kernel"]}), base, cand)
    assert not missing.ok and missing.missing == ["my_triton_kernel"]
    kept = _engagement(_cand({"Optbot-Removes-Kernels": ["attn.to_k"]}), base, base)
    assert not kept.ok and kept.still_present == ["attn.to_k"]


@pytest.mark.parametrize("base,cand,within,outcome", [
    ([10.0, 10.1], [8.0, 8.05], 0.01, "faster"),
    ([10.0, 10.1], [10.05, 10.0], 0.01, "no-change"),
    ([10.0, 10.0], [9.9, 9.9], 0.0, "no-change"),  # 1% gain, but under the 2% cpu floor
    ([10.0, 12.0], [9.9, 10.2], 0.01, "no-change"),  # 9% gain inside 18% A/A noise
    ([10.0, 10.0], [12.0, 12.1], 0.01, "slower"),
    ([10.0, 10.0], [9.0, 9.0], 0.3, "no-change"),  # 11% gain inside a 15% within-process spread
])
def test_speed_outcome_uses_aa_noise(base, cand, within, outcome):
    from bot.validate.validator import speed_outcome

    speedup, noise, got, aside = speed_outcome(base, cand, [within] * len(base), [within] * len(cand), "cpu")
    assert got == outcome, (speedup, noise)
    assert aside == []  # two processes a side: nothing is set aside


def test_a_lone_disturbed_process_is_set_aside_once_there_are_three():
    """The H200 loop of 2026-11-30 (benchmarks/results/h200-loop-20261130-b): a candidate 7% faster
    measured 389.8 vs 407.4 ms, one of its processes slowed to 400.1 ms by a co-tenant, a 10% A/A
    band: rejected no-change. A third pair of processes outvotes the disturbed one (per-process
    medians from that run; the third pair is what a quiet retime gives)."""
    from bot.validate.validator import speed_outcome

    base, cand = [407.4142, 407.4421], [379.4959, 400.0923]
    _, noise, got, _ = speed_outcome(base, cand, [0.01] * 2, [0.01, 0.2], "cuda")
    assert got == "no-change" and noise > 5
    speedup, noise, got, aside = speed_outcome(base + [407.0], cand + [378.9], [0.01] * 3, [0.01, 0.2, 0.01], "cuda")
    assert got == "faster" and noise < 1.0 and speedup > 1.07, (speedup, noise)
    assert aside == ["base process 3 (407 ms)", "candidate process 2 (400.1 ms)"]
    # a real slowdown is not set aside: two of three processes agree on it
    _, _, got, _ = speed_outcome([407.0, 407.2, 406.9], [440.0, 441.0, 400.0], [0.01] * 3, [0.01] * 3, "cuda")
    assert got == "slower"


def test_implausible_speedup_and_roofline():
    from bot.validate.validator import _implausible
    from bot.validate.verdict import Speed

    assert "over 10x" in _implausible([Speed("eager", "cuda", [100.0], [5.0], speedup=20.0)], None)
    fl = {"compute_floor_ms": 358.0, "linear": 253e12, "attention": 29e12, "peaks": {"matmul_tflops": 790}}
    assert "roofline" in _implausible([Speed("eager", "cuda", [533.0], [300.0], speedup=1.7)], fl)
    assert _implausible([Speed("eager", "cuda", [533.0], [480.0], speedup=1.1)], fl) == ""


def test_verdict_json_roundtrip_and_render():
    from bot.validate.verdict import Correctness, Engagement, OutputCheck, Speed, Verdict

    v = Verdict(status="rejected", reason="correctness", summary="bad", workload="flux2", preset="tiny", device="cpu",
                dtype="float32", base_sha="a" * 40, candidate_sha="b" * 40, candidate="x.patch",
                correctness=Correctness(ok=False, seeds=[5, 6, 7], shapes=["256x256/txt32/b1"], rule="bit-exact",
                                        checks=[OutputCheck("256x256/txt32/b1 seed 5", "noise_pred", False,
                                                            "noise_pred: max abs 0.5 at [0, 17, 5]", 0.5, [0, 17, 5],
                                                            0.1, 3)]),
                engagement=Engagement(ok=True, reason="r"), speed=[Speed("eager", "cpu", [1.0, 1.1], [0.9, 0.95])])
    d = json.loads(json.dumps(v.to_json()))
    assert Verdict.from_json(d).to_json() == v.to_json()
    text = v.render()
    assert "REJECTED (correctness)" in text and "[0, 17, 5]" in text and "cpu" in text
    with pytest.raises(ValueError):
        Verdict(status="maybe", reason=None, summary="", workload="", preset="", device="", dtype="", base_sha="",
                candidate_sha="", candidate="")


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


def test_cli_errors_are_one_line_exit_2(cli_runner, diffusers_engine, tmp_path):
    from bot.cli import cli

    r = cli_runner.invoke(cli, ["validate", "flux2", "--preset", "tiny", "--device", "cpu", "--candidate", "no-such-ref"])
    assert r.exit_code != 0
    assert "neither a patch file nor a commit" in str(r.exception) or "neither a patch file" in r.output
    bad = tmp_path / "bad.patch"
    bad.write_text("msg\n\ndiff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    r = cli_runner.invoke(cli, ["validate", "flux2", "--preset", "tiny", "--device", "cpu", "--candidate", str(bad)])
    assert "does not apply" in str(r.exception)
    r = cli_runner.invoke(cli, ["validate", "--help"])
    assert r.exit_code == 0 and "Examples" in r.output and "held" in r.output


def test_tamper_scan_flags_reaching_for_the_runner(tmp_path):
    import git

    from bot.validate.validator import tamper_lines

    repo = git.Repo.init(tmp_path)
    (tmp_path / "m.py").write_text("x = 1\n")
    repo.git.add("-A")
    repo.git.commit("-qm", "base", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                         "GIT_COMMITTER_EMAIL": "t@t"})
    base = repo.head.commit.hexsha
    (tmp_path / "m.py").write_text("x = 1\ndef optbot_after_load(self): pass\nimport runner.timing as t\n")
    repo.git.commit("-qam", "cand", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                         "GIT_COMMITTER_EMAIL": "t@t"})
    hits = tamper_lines(repo, base, repo.head.commit.hexsha)
    assert hits == ["m.py: import runner.timing as t"]
