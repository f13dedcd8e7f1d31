"""runner/quant.py: the fp8 recipe applied to a built model (issue 16). On the CPU torchao refuses
float8, so what runs here is optbot's emulation of torchao's recipe on the same torch._scaled_mm:
checked against the recipe's arithmetic done in float32, against the unquantized layer (an error
of e4m3's size, never zero), under torch.compile, and on what it must leave alone."""
from __future__ import annotations

import pytest
import torch

from runner import quant


def _model(dtype, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=bias), torch.nn.GELU(), torch.nn.Linear(96, 48, bias=bias),
                            torch.nn.Linear(48, 10))  # the last: 10 outputs, not a multiple of 16
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m.to(dtype)


CASES = [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)]


@pytest.mark.parametrize("dtype, tol", CASES)
@pytest.mark.parametrize("tokens", [1, 37, 128])
def test_fp8_linear_is_the_recipe_and_close_to_the_unquantized_layer(dtype, tol, tokens):
    for seed in (0, 1):
        m = _model(dtype, seed)
        lin = m[0]
        w, b = lin.weight.detach().clone(), lin.bias.detach().clone()
        x = (3.0 * torch.randn(2, tokens, 64, generator=torch.Generator().manual_seed(seed + 10))).to(dtype)
        exact = torch.nn.functional.linear(x.float(), w.float(), b.float())
        note = quant.apply(m, "fp8", "cpu")
        assert isinstance(lin, quant.Fp8Linear) and lin.w8.dtype == torch.float8_e4m3fn
        assert lin.weight.numel() == 0 and lin.weight.dtype == dtype  # the unquantized values are gone
        x_before = x.clone()
        out = lin(x)
        assert torch.equal(x, x_before) and out.dtype == dtype and out.shape == (2, tokens, 96)
        torch.testing.assert_close(out.float(), quant.reference_linear(x.float(), w.float(), b.float()), atol=tol, rtol=tol)
        rel = ((out.float() - exact).norm() / exact.norm()).item()
        assert 1e-4 < rel < 0.1, rel  # e4m3 has 3 mantissa bits: a real, bounded error
        assert note["linear_layers"] == 2 and note["left_unquantized"] == ["3"]
        assert note["implementation"].startswith("optbot emulation") and "refuses the CPU" in note["implementation"]


def test_per_token_scales_keep_a_small_token_beside_a_large_one():
    """Dynamic per-token scales: a token 1000x smaller than its neighbour keeps its precision (one
    scale for the whole tensor would flush it to e4m3's subnormals)."""
    m = _model(torch.float32, 3, bias=False)
    lin = m[0]
    w = lin.weight.detach().clone()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(4))
    x[1] *= 1e-3
    quant.apply(m, "fp8", "cpu")
    out, exact = lin(x), x @ w.t()
    rel_small = ((out[1] - exact[1]).norm() / exact[1].norm()).item()
    assert rel_small < 0.1, rel_small


def test_the_quantized_model_compiles_whole_and_gives_the_eager_numbers():
    m = _model(torch.float32, 5)
    quant.apply(m, "fp8", "cpu")
    x = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(6))
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.inference_mode():  # as the harness runs every step (_scaled_mm has no backward)
        torch.testing.assert_close(compiled(x), m(x), atol=1e-5, rtol=1e-5)


def test_refusals_name_what_is_wrong():
    with pytest.raises(quant.QuantError, match="unknown quantization recipe 'int4'"):
        quant.apply(_model(torch.float32, 0), "int4", "cpu")
    with pytest.raises(quant.QuantError, match="no linear layer has both feature counts a multiple of 16"):
        quant.apply(torch.nn.Sequential(torch.nn.Linear(10, 20)), "fp8", "cpu")
    with pytest.raises(quant.QuantError, match=r"Sequential has no linear layer \(torch.nn.Linear\)"):
        quant.apply(torch.nn.Sequential(torch.nn.Conv1d(16, 16, 1)), "fp8", "cpu")


class UnquantizedLinearMethod:
    """SGLang's protocol (sglang/multimodal_gen/runtime/layers/linear.py): the layer's product goes
    through quant_method.apply(layer, x, bias); the unquantized method is F.linear."""

    def apply(self, layer, x, bias=None):
        return torch.nn.functional.linear(x, layer.weight, bias)


class EngineLinear(torch.nn.Module):
    """As SGLang's ReplicatedLinear: weight [out, in], forward returns (output, output_bias)."""

    def __init__(self, k, n, skip_bias_add=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k, generator=torch.Generator().manual_seed(n)) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(n, generator=torch.Generator().manual_seed(k)) * 0.2)
        self.skip_bias_add = skip_bias_add
        self.quant_method = UnquantizedLinearMethod()

    def forward(self, x):
        bias = None if self.skip_bias_add else self.bias
        return self.quant_method.apply(self, x, bias), (self.bias if self.skip_bias_add else None)


def test_a_linear_layer_of_unknown_kind_is_refused_by_name():
    """A module with a 2-D weight that the recipe cannot take (here: an engine's own linear layer, as
    SGLang's; that engine deploys its own FP8 path instead, runner/engines/sglang_fp8.py) stops the
    run: a result labelled FP8 with unquantized linears in it would be a false label. Embeddings are
    not linear layers."""
    odd = EngineLinear(64, 96)
    m = torch.nn.ModuleDict({"a": torch.nn.Linear(64, 96), "emb": torch.nn.Embedding(10, 64), "blocks": torch.nn.ModuleList([odd])})
    with pytest.raises(quant.QuantError, match=r"1 layer\(s\) of ModuleDict hold a 2-D weight .*EngineLinear \(blocks.0\)"):
        quant.apply(m, "fp8", "cpu")
    assert quant.apply(torch.nn.ModuleDict({"a": torch.nn.Linear(64, 96), "emb": torch.nn.Embedding(10, 64)}),
                       "fp8", "cpu")["linear_layers"] == 1


def test_a_precision_names_the_dtype_and_the_recipe():
    from runner.job import precision, split_precision

    assert split_precision("bfloat16+fp8") == ("bfloat16", "fp8") and split_precision("float32") == ("float32", None)
    assert precision("bfloat16", "fp8") == "bfloat16+fp8" and precision("bfloat16", None) == "bfloat16"
    with pytest.raises(ValueError, match="unknown quantization recipe 'int4'"):
        split_precision("bfloat16+int4")


def test_validate_at_the_fp8_precision_judges_against_the_fp8_baseline(diffusers_engine, tmp_path):
    """`optbot validate --quant fp8`: base and candidate both run the recipe (the runner's note says
    which implementation), and the verdict is decided under the workload's float32+fp8 tolerance."""
    import json

    from tests.test_cli_profile import ROOT, optbot

    out = tmp_path / "v.json"
    r = optbot("validate", "flux2", "--quant", "fp8", "--candidate",
               str(ROOT / "tests" / "validate" / "adversarial" / "honest_merge_qkv.patch"), "--no-speed",
               "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(out.read_text())
    assert v["status"] == "accepted" and v["dtype"] == "float32+fp8"
    assert "(float32+fp8)" in v["correctness"]["rule"] and "rel_l2 <= 0.037" in v["correctness"]["rule"]
    # and each output against the unquantized model (a base job at float32): as far as the FP8 base's
    ref = [c for c in v["correctness"]["checks"] if c["against"] == "unquantized"]
    assert len(ref) == 6 and all(c["ok"] and c["rel_l2"] == pytest.approx(c["base_rel_l2"]) for c in ref)
    assert all(0.01 < c["base_rel_l2"] < 0.2 for c in ref)  # the recipe's own error, measured


def test_a_quantized_run_gets_branches_of_its_own():
    """An FP8 run and an unquantized run of one base deliver to different branches (and so pull
    requests): the workload's name in them carries the recipe."""
    from bot.steps.combine import branch_name
    from bot.steps.deliver import knowledge_branch_name
    from bot.target import run_label

    base = "d93305b4891d04798bee514d0a7e1e162a8e067e"
    assert run_label("flux2", "bfloat16") == "flux2" and run_label("flux2", "bfloat16+fp8") == "flux2+fp8"
    assert branch_name(run_label("flux2", "float32+fp8"), base) == "optbot/flux2+fp8/d93305b4891d"
    assert knowledge_branch_name(run_label("flux2", "float32+fp8"), base) == "optbot/knowledge/flux2+fp8/d93305b4891d"
    assert branch_name(run_label("flux2", "float32"), base) == "optbot/flux2/d93305b4891d"


def test_what_an_fp8_run_learns_loads_back_as_a_store_entry(tmp_path):
    """The learn step records the run's precision in an entry's dtype list ("float32+fp8"): the
    store reads it back (it refused it before), and still refuses a bare recipe name."""
    import shutil

    import yaml

    from bot.errors import ConfigError
    from bot.knowledge.store import load_entry
    from tests.test_cli_profile import ROOT

    d = tmp_path / "flux2-swiglu"
    shutil.copytree(ROOT / "kernel_store" / "flux2-swiglu", d)
    data = yaml.safe_load((d / "entry.yaml").read_text())
    data["dtype"] = ["float32+fp8", "bfloat16+fp8"]
    (d / "entry.yaml").write_text(yaml.safe_dump(data))
    assert load_entry(d).dtypes == ("float32+fp8", "bfloat16+fp8")
    data["dtype"] = ["fp8"]
    (d / "entry.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="key 'dtype'"):
        load_entry(d)


def test_the_bench_says_what_each_fp8_row_ran_and_what_it_left_unquantized():
    """`optbot bench --quant fp8` prints what each FP8 row ran, its reach, and why layers stayed in
    their dtype (SGLang's own FP8 leaves the embedders and modulations in bfloat16, as its checkpoints do)."""
    from bot.commands.bench import BenchResult
    from bot.bench_report import _quant_lines

    m = torch.nn.ModuleDict({"proj": torch.nn.Linear(64, 96), "head": torch.nn.Linear(96, 32), "odd": torch.nn.Linear(64, 10)})
    note = quant.apply(m, "fp8", "cpu")
    res = BenchResult(workload="w", preset="tiny", device="cpu", dtype="float32", shape={}, passes=1,
                      quant={"upstream+fp8": note, "sglang+fp8": {**note, "implementation": "SGLang's own",
                                                                   "left_unquantized_why": "built without it"}})
    first, second = _quant_lines(res)
    assert first.startswith("upstream+fp8: optbot emulation") and "; 2 linear layers (" in first
    assert first.endswith("; left unquantized: odd")
    assert second.startswith("sglang+fp8: SGLang's own") and second.endswith("left unquantized: odd (built without it)")

