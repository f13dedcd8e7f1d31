"""Each detector on small models written here, where the right answer is known, with negative
cases. The toy models' module and class names resemble no real model's (tests/analyze/toy_models.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from tests.analyze.toy_helpers import kinds
from toy_models import Contraption, inputs


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---- merge-siblings ----------------------------------------------------------------------
def test_merge_siblings_finds_three_projections_of_one_input(toy):
    a, g = toy(Contraption(), [inputs()], only=["merge-siblings"])
    qkv = [o for o in kinds(a, "merge-siblings") if o["facts"]["n_out"] == [32, 32, 32]]
    assert qkv, [o["summary"] for o in a["opportunities"]]
    o = qkv[0]
    assert o["location"]["instances"] == 2  # two blocks
    assert {m.rsplit(".", 1)[-1] for m in o["facts"]["members"]} == {"red", "green", "blue"}
    assert o["location"]["engine_file"].endswith("toy_models.py") and o["location"]["engine_line"]
    assert o["estimate"]["profile_device"].startswith("cpu")


def test_merge_siblings_not_for_projections_of_different_values(toy):
    a, _ = toy(Contraption(split_reads=True), [inputs()], only=["merge-siblings"])
    assert not [o for o in kinds(a, "merge-siblings") if len(o["facts"]["n_out"]) == 3 and o["facts"]["n_out"][0] == 32]


def test_merge_siblings_not_for_slices_of_one_tensor():
    """Two GEMMs reading two halves of one tensor read different data: not siblings."""
    from bot.analyze.graph import Graph

    class Halves(nn.Module):
        def __init__(self):
            super().__init__()
            self.p, self.r = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            a, b = x.chunk(2, dim=1)
            return self.p(a) + self.r(b)

    from runner.graph_capture import capture
    from tests.analyze.toy_helpers import HERE
    from bot.analyze.cost import CostModel
    from bot.analyze.detectors import Context
    from bot.analyze.detectors import merge_siblings

    m = Halves().eval()
    x = torch.randn(1, 6, 8)

    def step():
        with torch.inference_mode():
            return m(x)

    g = Graph.from_json({**capture(m, step, str(HERE)).to_json(), "probes": []})
    cost = CostModel({o.id: 0.01 for o in g.ops}, "cpu", "", 1.0, 20.0, 0.2, 1.0)
    assert merge_siblings.detect(Context(g, cost, {})) == []


# ---- fuse-norm-consumer ------------------------------------------------------------------
def test_norm_then_modulation_is_found(toy):
    a, _ = toy(Contraption(), [inputs()], only=["fuse-norm-consumer"])
    found = [o for o in kinds(a, "fuse-norm-consumer") if o["facts"]["norm"] == "op"]
    assert len(found) == 2  # both norms of the block, each over the 2 blocks
    assert all(o["facts"]["consumers"] == "mul -> add" for o in found)
    assert {o["location"]["module_pattern"] for o in found} == {"stack_of.*.flatten_a", "stack_of.*.flatten_b"}
    assert all(o["location"]["instances"] == 2 for o in found)


def test_norm_feeding_a_gemm_directly_is_not_a_fusion(toy):
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.n, self.l = nn.LayerNorm(16), nn.Linear(16, 16)

        def forward(self, pixels, words=None, tau=None):
            return self.l(self.n(pixels))

    a, _ = toy(Plain(), [{"pixels": torch.randn(1, 8, 16)}], only=["fuse-norm-consumer"])
    assert kinds(a, "fuse-norm-consumer") == []


def test_hand_written_rms_norm_is_recognized_by_pattern():
    from bot.analyze.graph import Graph
    from runner.graph_capture import capture
    from tests.analyze.toy_helpers import HERE
    from toy_models import Squash

    m = Squash(16).eval()
    x = torch.randn(2, 5, 16)

    def step():
        with torch.inference_mode():
            return m(x)

    g = Graph.from_json({**capture(m, step, str(HERE)).to_json(), "probes": []})
    assert [n.how for n in g.norm_groups] == ["rms-pattern"]
    assert {g.ops[i].name for i in g.norm_groups[0].op_ids} >= {"pow", "mean", "rsqrt", "mul"}


# ---- absorb-bias ---------------------------------------------------------------------------
def test_gemm_gate_residual_and_standalone_bias(toy):
    class Biased(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(16, 16) / 4)
            self.b = nn.Parameter(torch.randn(16) / 10)
            self.lin = nn.Linear(16, 16)
            self.gate = nn.Parameter(torch.randn(16))

        def forward(self, pixels, words=None, tau=None):
            h = torch.matmul(pixels, self.w) + self.b  # bias by a separate add
            return pixels + self.gate * self.lin(torch.relu(h))  # GEMM -> gate -> residual

    a, _ = toy(Biased(), [{"pixels": torch.randn(1, 8, 16)}], only=["absorb-bias"])
    details = {o["detail"] for o in kinds(a, "absorb-bias")}
    assert "bias-add-after-gemm" in details
    epi = kinds(a, "absorb-bias", "gemm-epilogue")
    assert epi and epi[0]["facts"]["gemm_has_bias"] is True


def test_gemm_into_activation_and_gemm_is_not_absorb_bias(toy):
    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.i, self.o = nn.Linear(16, 32), nn.Linear(32, 16)

        def forward(self, pixels, words=None, tau=None):
            return self.o(F.gelu(self.i(pixels)))

    a, _ = toy(Mlp(), [{"pixels": torch.randn(1, 8, 16)}], only=["absorb-bias"])
    assert kinds(a, "absorb-bias") == []


# ---- fuse-gemm-epilogue ---------------------------------------------------------------------
def test_linear_into_activation_is_a_gemm_epilogue(toy):
    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.i, self.o = nn.Linear(16, 32), nn.Linear(32, 16)

        def forward(self, pixels, words=None, tau=None):
            return self.o(F.gelu(self.i(pixels), approximate="tanh"))

    a, _ = toy(Mlp(), [{"pixels": torch.randn(1, 8, 16)}], only=["fuse-gemm-epilogue"])
    (f,) = kinds(a, "fuse-gemm-epilogue")
    assert f["detail"] == "gemm+gelu" and f["facts"] == {"activation": "gelu", "approximate": "tanh", "gemm_has_bias": True}


def test_activation_of_a_shared_or_weightless_gemm_is_not_an_epilogue(toy):
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.i = nn.Linear(16, 16)

        def forward(self, pixels, words=None, tau=None):
            h = self.i(pixels)
            s = torch.matmul(pixels, pixels.transpose(-1, -2))  # two activations: no weight to fuse with
            return F.silu(h) + h + torch.relu(s).sum()  # h is read twice: its store stays

    a, _ = toy(Shared(), [{"pixels": torch.randn(1, 8, 16)}], only=["fuse-gemm-epilogue"])
    assert kinds(a, "fuse-gemm-epilogue") == []


# ---- cfg-invariant-cache -------------------------------------------------------------------
def test_timestep_only_modulation_recomputed_in_second_pass(toy):
    a, g = toy(Contraption(), [inputs(0), inputs(0, prompt_seed=7)], only=["cfg-invariant-cache"])
    found = kinds(a, "cfg-invariant-cache")
    ops = {o for f in found for o in f["ops"]}
    assert any("stack_of.*.knobs" in o for o in ops), ops  # the per-block modulation GEMM
    assert all(g.ops[i].pass_idx == 1 for f in found for i in f["op_ids"])
    assert all("prompt" not in f["facts"]["depends_on"] for f in found)


def test_no_cfg_finding_with_one_pass_or_prompt_dependent_modulation(toy):
    a, _ = toy(Contraption(), [inputs(0)], only=["cfg-invariant-cache"])
    assert kinds(a, "cfg-invariant-cache") == []
    a, _ = toy(Contraption(txt_in_mod=True), [inputs(0), inputs(0, prompt_seed=7)], only=["cfg-invariant-cache"])
    assert not any("knobs" in o for f in kinds(a, "cfg-invariant-cache") for o in f["ops"])


# ---- hoist-constant ---------------------------------------------------------------------------
def test_constant_work_every_step_is_hoistable(toy):
    a, _ = toy(Contraption(), [inputs()], only=["hoist-constant"])
    load = kinds(a, "hoist-constant", "load-time")
    assert load and any("exp" in o["summary"] for o in load)


def test_no_hoist_when_everything_depends_on_the_latents(toy):
    class Pure(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(16, 16)

        def forward(self, pixels, words=None, tau=None):
            return torch.tanh(self.l(pixels)) * pixels

    a, _ = toy(Pure(), [{"pixels": torch.randn(1, 8, 16)}], only=["hoist-constant"])
    assert kinds(a, "hoist-constant") == []


# ---- cfg-invariant-cache and hoist-constant through buffers written in place -------------------
class Stash(nn.Module):
    """Two preallocated buffers, written in place and then read:
    A = temb.new_zeros(..) written by slice assignment (slice + copy_), read by tanh -> mul;
    B = torch.empty_like(self.table) written by copy_ into its two halves, read by exp -> sum.
    fill="prompt" writes a projection of the prompt into both; fill="static" writes the timestep
    embedding into A and a multiple of the weight into B (the control)."""

    def __init__(self, fill, d=16, t=6):
        super().__init__()
        self.fill = fill
        self.words_in = nn.Linear(24, d)
        self.tick = nn.Linear(16, d)
        self.table = nn.Parameter(torch.randn(t, d))
        self.head = nn.Linear(d, d)

    def forward(self, pixels, words, tau):
        b, t, h = words.shape[0], self.table.shape[0], self.table.shape[1] // 2
        f = tau[:, None] * torch.arange(8, dtype=torch.float32)[None]
        temb = self.tick(torch.cat([f.sin(), f.cos()], -1))  # [B, D] timestep
        prompt = self.words_in(words[:, :t])  # [B, T, D]
        a = temb.new_zeros(b, t + 1, temb.shape[-1])
        a[:, :t] = prompt if self.fill == "prompt" else temb[:, None] * 0.5
        a[:, t] = temb
        read_a = torch.tanh(a) * 2.0
        src = prompt[0] if self.fill == "prompt" else self.table * 3.0  # [T, D]
        bb = torch.empty_like(self.table)
        bb[:, :h].copy_(src[:, :h])
        bb[:, h:].copy_(src[:, h:])
        read_b = bb.exp().sum(0)  # [D]
        return self.head(read_a) + read_b + pixels.mean()


def _buffer_reads(g):
    return {n: [o.id for o in g.ops if o.name == n] for n in ("tanh", "exp")}


def _flagged(a, kind, detail=None):
    return {i for o in kinds(a, kind, detail) for i in o["op_ids"]}


def _passes(prompt_seeds):
    g = torch.Generator().manual_seed(0)
    pixels, tau = torch.randn(1, 4, 8, generator=g), torch.full((1,), 0.5)
    return [{"pixels": pixels, "words": torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(s)), "tau": tau}
            for s in prompt_seeds]


def test_prompt_written_into_buffers_is_neither_cached_nor_hoisted(toy):
    a, g = toy(Stash("prompt"), _passes([1, 2]), only=["cfg-invariant-cache", "hoist-constant"])
    reads = _buffer_reads(g)
    for i in reads["tanh"] + reads["exp"]:
        assert "prompt" in g.deps(g.ops[i].outputs[0]), (g.ops[i].op, g.deps(g.ops[i].outputs[0]))
    cfg = _flagged(a, "cfg-invariant-cache")
    assert not cfg & set(reads["tanh"] + reads["exp"]), "a read of a prompt-filled buffer is not prompt-independent"
    assert all("prompt" not in o["facts"]["depends_on"] for o in kinds(a, "cfg-invariant-cache"))
    assert not _flagged(a, "hoist-constant", "load-time") & set(reads["tanh"] + reads["exp"])
    # B holds the prompt and weights only: the same in every denoising step of a request
    assert set(reads["exp"]) <= _flagged(a, "hoist-constant", "per-request")
    assert not set(reads["tanh"]) & _flagged(a, "hoist-constant")  # A also holds the timestep


def test_buffers_filled_from_timestep_and_weights_are_still_found(toy):
    """The control: the same buffers filled without the prompt are cached and hoisted."""
    a, g = toy(Stash("static"), _passes([1, 2]), only=["cfg-invariant-cache", "hoist-constant"])
    reads = _buffer_reads(g)
    tanh2 = [i for i in reads["tanh"] if g.ops[i].pass_idx == 1]
    assert tanh2 and set(tanh2) <= _flagged(a, "cfg-invariant-cache"), [o["summary"] for o in a["opportunities"]]
    assert set(reads["exp"]) <= _flagged(a, "hoist-constant", "load-time"), [o["summary"] for o in a["opportunities"]]


class FusedOutsideTheDispatcher(nn.Module):
    """SGLang's FLUX.2 block, in small: its norm + modulation runs as a Triton kernel launched
    directly (here a raw memmove of the modulated latents), writing into a fresh torch.empty_strided
    tensor; two such buffers of one shape feed different projections."""

    def __init__(self):
        super().__init__()
        self.to_q, self.ff = nn.Linear(16, 16), nn.Linear(16, 16)

    def _unseen(self, h):
        import ctypes
        buf = torch.empty_strided(h.shape, h.stride(), dtype=h.dtype)
        ctypes.memmove(buf.data_ptr(), h.data_ptr(), h.numel() * h.element_size())
        return buf

    def forward(self, pixels, words=None, tau=None):
        q = self.to_q(self._unseen(pixels * 2.0))
        return self.ff(self._unseen(torch.tanh(q))) + pixels


def test_work_on_what_an_unseen_kernel_wrote_is_neither_constant_nor_shared(toy):
    """Without the capture's uninitialized-read rule both GEMMs were load-time constants and
    siblings of one input (the 2026-12-03 H200 SGLang analysis: 472 of 507 ms 'hoistable')."""
    a, g = toy(FusedOutsideTheDispatcher(), [{"pixels": torch.randn(1, 8, 16)}],
               only=["hoist-constant", "merge-siblings"])
    gemms = [o.id for o in g.ops if o.name == "linear"]
    assert len(gemms) == 2
    assert not _flagged(a, "hoist-constant") & set(gemms), [o["summary"] for o in a["opportunities"]]
    assert not kinds(a, "hoist-constant"), "an allocation alone is no work to hoist"
    assert not kinds(a, "merge-siblings"), [o["summary"] for o in a["opportunities"]]
    assert all("latents" in g.deps(g.ops[i].outputs[0]) for i in gemms)


# ---- fuse-elementwise-chain -------------------------------------------------------------------
def test_gated_activation_and_long_chain(toy):
    class Chains(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(16, 64, bias=False), nn.Linear(32, 16, bias=False)

        def forward(self, pixels, words=None, tau=None):
            a, b = self.up(pixels).chunk(2, dim=-1)
            h = self.down(F.silu(a) * b)
            return torch.tanh(torch.sin(h) * 2.0 + 1.0)  # 4 pointwise ops in a row

    a, _ = toy(Chains(), [{"pixels": torch.randn(1, 8, 16)}], only=["fuse-elementwise-chain"])
    assert kinds(a, "fuse-elementwise-chain", "gated-activation")
    chain = kinds(a, "fuse-elementwise-chain", "chain")
    assert chain and chain[0]["facts"]["ops"].count("->") >= 2


def test_two_independent_pointwise_ops_are_not_a_chain(toy):
    class Short(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, pixels, words=None, tau=None):
            return self.l2(torch.relu(self.l1(pixels)) * 2.0)

    a, _ = toy(Short(), [{"pixels": torch.randn(1, 8, 16)}], only=["fuse-elementwise-chain"])
    assert kinds(a, "fuse-elementwise-chain") == []


# ---- attention-waste --------------------------------------------------------------------------
def test_all_ones_mask_and_qk_norm_rope(toy):
    s = 24  # 8 text + 16 image tokens
    mask = torch.ones(1, 1, 1, s, dtype=torch.bool)
    a, _ = toy(Contraption(), [inputs(mask=mask)], only=["attention-waste"])
    assert kinds(a, "attention-waste", "mask-masks-nothing")
    qk = kinds(a, "attention-waste", "qk-norm-rope")
    assert qk and qk[0]["location"]["instances"] == 2


def test_a_real_mask_and_plain_qk_are_not_waste(toy):
    s = 24
    mask = torch.ones(1, 1, 1, s, dtype=torch.bool)
    mask[..., -3:] = False
    a, _ = toy(Contraption(qk_norm=False, rope=False), [inputs(mask=mask)], only=["attention-waste"])
    assert not kinds(a, "attention-waste", "mask-masks-nothing")
    assert not [o for o in kinds(a, "attention-waste") if o["detail"].startswith(("qk", "rope"))]


# ---- launch-bound ---------------------------------------------------------------------------
def test_launch_bound_from_device_idle(toy):
    a, _ = toy(Contraption(), [inputs()], only=["launch-bound"],
               profile_extra={"device": "cuda", "idle_ms": 5.0, "total_ms": 10.0})
    lb = kinds(a, "launch-bound")
    assert lb and sum(o["gain_ms"] for o in lb) <= 5.0 + 1e-6
    assert "stack_of.*" in {o["location"]["module_pattern"] for o in lb}
    a, _ = toy(Contraption(), [inputs()], only=["launch-bound"],
               profile_extra={"device": "cuda", "idle_ms": 0.0, "total_ms": 10.0})
    assert kinds(a, "launch-bound") == []


def test_host_sync_is_reported_as_graph_capture_blocker(toy):
    class Syncs(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(16, 16)

        def forward(self, pixels, words=None, tau=None):
            n = int(pixels.abs().sum().item() > 0)  # the host reads a device value
            return self.l(pixels) * (n + 1)

    a, _ = toy(Syncs(), [{"pixels": torch.randn(1, 8, 16)}], only=["launch-bound"],
               profile_extra={"device": "cuda", "idle_ms": 5.0, "total_ms": 10.0})
    lb = kinds(a, "launch-bound")
    assert lb and any("host sync" in b for b in lb[0]["facts"]["blockers"])


# ---- no name keying ---------------------------------------------------------------------------
def test_same_structure_under_other_names_gives_the_same_findings(toy):
    """Rename every module (and the block class): the findings must not change."""
    a1, _ = toy(Contraption(), [inputs(0), inputs(0, prompt_seed=7)])

    class Renamed(nn.Module):
        def __init__(self, src):
            super().__init__()
            self.inner = src

        def forward(self, **kw):
            return self.inner(**kw)

    m = Contraption()
    for blk in m.stack_of:
        blk.__class__ = type("TotallyDifferent", (type(blk),), {})
    a2, _ = toy(Renamed(m), [inputs(0), inputs(0, prompt_seed=7)])

    def sig(a):
        return sorted((o["kind"], o["detail"], o["location"]["instances"]) for o in a["opportunities"]
                      if o["kind"] != "launch-bound")

    s1, s2 = sig(a1), sig(a2)
    assert s1 == s2, (sorted(set(s1) - set(s2)), sorted(set(s2) - set(s1)))


# ---- quantization (FP8 activation quantization, issue 16) -----------------------------------
class _Fp8Block(nn.Module):
    """norm + modulation -> three sibling projections; their sum -> an MLP with a tanh GELU. With the
    FP8 recipe applied (runner/quant.apply), every linear quantizes its input per token."""

    def __init__(self):
        super().__init__()
        self.n = nn.LayerNorm(32, elementwise_affine=False)
        self.p1, self.p2, self.p3 = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, pixels, words=None, tau=None):
        h = self.n(pixels) * 1.5 + 0.25
        y = self.p1(h) + self.p2(h) + self.p3(h)
        return self.down(F.gelu(self.up(y), approximate="tanh"))


def _fp8(model):
    from runner import quant

    quant.apply(model, "fp8", "cpu")  # optbot's emulation on the CPU: the recipe's real ops
    return model


def test_fp8_activation_quantization_is_found_with_its_producer(toy):
    a, _ = toy(_fp8(_Fp8Block()), [{"pixels": torch.randn(1, 8, 32)}], only=["quantization"])
    found = {o["detail"]: o for o in kinds(a, "quantization")}
    assert set(found) == {"norm+quant", "shared-input", "quant", "activation+quant"}, [o["summary"] for o in a["opportunities"]]
    assert found["shared-input"]["facts"]["gemms"] == 3  # h quantized once per projection
    assert found["activation+quant"]["facts"]["producer"] == "gelu"
    assert found["norm+quant"]["facts"]["producer"] == "add"  # the modulation's last op, the norm above it
    assert found["quant"]["facts"]["producer"] == "add"  # the projections' sum: nothing to fuse but the pass
    # the chains hold the recipe's ops and no others: the two casts, abs, amax, clamps and divides
    assert all(o["facts"]["ops"] >= 5 for d, o in found.items() if d != "shared-input")
    assert all(o["estimate"]["estimated_ms"] > 0 for o in found.values())


def test_a_value_an_fp8_gemm_quantizes_names_that_quantization(tmp_path):
    """The norm + modulation's output is what the projections' FP8 quantization reads (data flow, through
    views): its opportunity lists those quantization findings in `quantized_by`, the thing replay reads
    to let inductor fuse the two under compile. Unquantized, the same block's norm is quantized by none."""
    from tests.analyze.toy_helpers import run_toy

    x = {"pixels": torch.randn(1, 8, 32)}
    for model, fp8 in ((_fp8(_Fp8Block()), True), (_Fp8Block(), False)):
        (tmp_path / str(fp8)).mkdir()
        a, _ = run_toy(model, [x], tmp_path / str(fp8))
        (norm,) = kinds(a, "fuse-norm-consumer")
        quant = {o["detail"]: o["id"] for o in kinds(a, "quantization")}
        if not fp8:
            assert norm["quantized_by"] == [] and not quant
            continue
        # h feeds three projections: one chain is norm+quant, the other two are its shared-input repeats
        assert norm["quantized_by"] == sorted([quant["norm+quant"], quant["shared-input"]])
        # the GELU's output is quantized too, but no other opportunity computes it; the quantizations
        # themselves name none (their chains read each other's values, which is not a producer outside)
        assert all(o["quantized_by"] == [] for o in a["opportunities"] if o["kind"] == "quantization")


class _StaticScaleFp8(nn.Module):
    """An FP8 GEMM with scales fixed at load (static quantization): no per-call quantization chain."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w8", torch.randn(32, 32).to(torch.float8_e4m3fn))
        self.register_buffer("sa", torch.ones(1, 1))
        self.register_buffer("sw", torch.ones(1, 1))

    def forward(self, pixels, words=None, tau=None):
        x8 = pixels.reshape(-1, 32).to(torch.float8_e4m3fn)
        return torch._scaled_mm(x8, self.w8.t(), scale_a=self.sa, scale_b=self.sw, out_dtype=torch.float32)


def test_no_quantization_finding_without_fp8_or_a_per_token_chain(toy):
    a, _ = toy(_Fp8Block(), [{"pixels": torch.randn(1, 8, 32)}], only=["quantization"])
    assert kinds(a, "quantization") == []  # unquantized: nothing
    a, _ = toy(_StaticScaleFp8(), [{"pixels": torch.randn(1, 8, 32)}], only=["quantization"])
    assert kinds(a, "quantization") == []  # the scale is a buffer: the chain does not close on the input


class _StaticQuantGeluFp8(nn.Module):
    """SGLang's ModelOpt FP8 as its CPU path runs it: the MLP's GELU output divided by the down
    projection's own static input_scale (a parameter calibrated ahead), clamped, cast to float8; the GEMM
    gets that scale broadcast to rows. `other` divides by another parameter than the GEMM's scale."""

    def __init__(self, other: bool = False):
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.w8 = nn.Parameter(torch.randn(32, 64).to(torch.float8_e4m3fn), requires_grad=False)
        self.input_scale = nn.Parameter(torch.tensor(0.01), requires_grad=False)
        self.other_scale = nn.Parameter(torch.tensor(0.02), requires_grad=False)
        self.w_scale = nn.Parameter(torch.tensor(0.05), requires_grad=False)
        self.other = other

    def forward(self, pixels, words=None, tau=None):
        g = F.gelu(self.up(pixels), approximate="tanh").reshape(-1, 64)
        div = self.other_scale if self.other else self.input_scale
        x8 = (g.float() / div.float()).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        sa = self.input_scale.float().reshape(1, 1).expand(x8.shape[0], 1).contiguous()
        sb = self.w_scale.float().reshape(1, 1).expand(1, 32).contiguous()
        return torch._scaled_mm(x8, self.w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)


def test_a_static_quantization_is_found_with_its_producer(toy):
    """One scale fixed ahead (ModelOpt FP8): no scale path, and the value path divides by the GEMM's own
    scale parameter: found as activation+quant with `scale: static` (sglang-qwen-image-fp8-gelu-quant
    replays for it). Dividing by another parameter than the one the GEMM is told is not this chain."""
    a, _ = toy(_StaticQuantGeluFp8(), [{"pixels": torch.randn(1, 8, 32)}], only=["quantization"])
    (found,) = kinds(a, "quantization")
    assert found["detail"] == "activation+quant" and found["facts"]["producer"] == "gelu", found["summary"]
    assert found["facts"]["scale"] == "static" and found["facts"]["ops"] >= 2
    assert "static scale" in found["summary"] and found["estimate"]["estimated_ms"] > 0
    a, _ = toy(_StaticQuantGeluFp8(other=True), [{"pixels": torch.randn(1, 8, 32)}], only=["quantization"])
    assert kinds(a, "quantization") == []


class _UnseenStaticQuantFp8(nn.Module):
    """SGLang's ModelOpt FP8 on the GPU: `static_quant_fp8` allocates the float8 buffer like its input
    (`empty_like`) and a Triton kernel the dispatcher never sees writes it; the GEMM takes the static
    input_scale parameter (`per_row_scale`: a per-row buffer the kernel writes too, as with
    repeat_scale). The unseen kernel is the same arithmetic run with the capture's modes off."""

    def __init__(self, per_row_scale: bool = False):
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.w8 = nn.Parameter(torch.randn(32, 64).to(torch.float8_e4m3fn), requires_grad=False)
        self.input_scale = nn.Parameter(torch.tensor(0.01), requires_grad=False)
        self.w_scale = nn.Parameter(torch.tensor(0.05).reshape(1, 1), requires_grad=False)
        self.per_row_scale = per_row_scale

    def forward(self, pixels, words=None, tau=None):
        from torch.utils._python_dispatch import _disable_current_modes

        g = F.gelu(self.up(pixels), approximate="tanh").reshape(-1, 64)
        x8 = torch.empty_like(g, dtype=torch.float8_e4m3fn)
        sa = torch.empty((g.shape[0], 1), dtype=torch.float32) if self.per_row_scale else self.input_scale
        with _disable_current_modes():  # the "kernel": invisible to the capture
            x8.copy_((g / self.input_scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn))
            if self.per_row_scale:
                sa.fill_(self.input_scale.item())
        sa2 = sa if self.per_row_scale else sa.reshape(1, 1)
        if not self.per_row_scale:
            sa2 = sa2.expand(x8.shape[0], 1).contiguous()
        return torch._scaled_mm(x8, self.w8.t(), scale_a=sa2, scale_b=self.w_scale.expand(1, 32).contiguous(),
                                out_dtype=torch.float32)


@pytest.mark.parametrize("per_row_scale", [False, True])
def test_a_quantization_by_an_unseen_kernel_is_found_from_its_buffers(toy, per_row_scale):
    """On the GPU SGLang's static quantization is a Triton kernel the capture cannot see: the FP8 GEMM
    reads a float8 buffer made `empty_like` the GELU's output. Found as activation+quant, its estimate
    the bytes that kernel must move (no op carries its time)."""
    a, _ = toy(_UnseenStaticQuantFp8(per_row_scale), [{"pixels": torch.randn(1, 8, 32)}], only=["quantization"])
    (found,) = kinds(a, "quantization")
    assert found["detail"] == "activation+quant" and found["facts"]["producer"] == "gelu", found["summary"]
    assert found["facts"]["unseen"] and found["facts"]["scale"] == ("unseen" if per_row_scale else "static")
    assert "cannot see" in found["summary"] and "copy bandwidth" in found["estimate"]["basis"]


def _torchao_fp8(model):
    """The FP8 recipe as torchao applies it on a GPU, built with torchao's own constructors
    (runner/quant.torchao_weights). torchao computes the per-row scale in one op of its own
    (torchao::choose_scale_float8)."""
    pytest.importorskip("torchao.quantization")
    from runner import quant

    model = model.to(torch.bfloat16)
    quant.torchao_weights(model)
    return model


def test_torchaos_quantization_is_found_too(toy):
    """On the GPU the recipe is torchao's, whose scale is one op (choose_scale_float8: abs, amax and the
    division inside, decomposed by inductor) rather than the emulation's abs -> amax -> divide: the
    same findings, and the norm's output is still the one the projections quantize."""
    a, g = toy(_torchao_fp8(_Fp8Block()), [{"pixels": torch.randn(1, 8, 32, dtype=torch.bfloat16)}])
    assert any(o.op == "torchao::choose_scale_float8" for o in g.ops)  # else this test no longer tests torchao's form
    found = {o["detail"]: o for o in kinds(a, "quantization")}
    assert set(found) == {"norm+quant", "shared-input", "quant", "activation+quant"}, [o["summary"] for o in a["opportunities"]]
    (norm,) = kinds(a, "fuse-norm-consumer")
    assert norm["quantized_by"] == sorted([found["norm+quant"]["id"], found["shared-input"]["id"]])
