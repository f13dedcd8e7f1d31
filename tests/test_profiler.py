"""Profiler attribution and categories on a small model whose ops we know."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import pytest

from runner.categorize import categorize
from runner.module_pattern import module_pattern
from runner.profiler import count_flops, parse_trace, profile_step


class ToyBlock(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):  # x: [B, S, D]
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))  # [B, H, S, Dh]
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.out(a)
        return torch.cat([x, x], dim=1)[:, :s] + self.mlp(x)


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([ToyBlock(), ToyBlock()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.fixture(scope="module")
def toy_profile(tmp_path_factory):
    torch.manual_seed(0)
    m = Toy().eval()
    x = torch.randn(2, 48, 64)

    def step():
        with torch.inference_mode():
            return m(x)

    return profile_step(m, step, "cpu", tmp_path_factory.mktemp("p") / "trace.json.gz"), m, step


def test_ops_are_attributed_to_the_module_that_ran_them(toy_profile):
    p, _, _ = toy_profile
    by = {}
    for k in p["kernels"]:
        by.setdefault(module_pattern(k["module"]), set()).add((k["op"], k["category"]))
    assert any(c == "gemm" for _, c in by["blocks.*.qkv"])
    assert any(c == "gemm" for _, c in by["blocks.*.mlp.*"])
    assert any(c == "normalization" for _, c in by["blocks.*.norm"])
    assert any(c == "attention" for _, c in by["blocks.*"])
    assert any(op == "aten::cat" and c == "copy" for op, c in by["blocks.*"])
    assert any(c == "elementwise" and "gelu" in op for op, c in by["blocks.*.mlp.*"])
    # both repeated blocks show up under their own concrete paths
    assert {k["module"] for k in p["kernels"] if k["module"].endswith(".qkv")} == {"blocks.0.qkv", "blocks.1.qkv"}


def test_json_shape_and_totals(toy_profile):
    p, _, _ = toy_profile
    assert p["launches"] == sum(k["calls"] for k in p["kernels"]) > 0
    assert abs(sum(p["categories"].values()) - sum(k["ms"] for k in p["kernels"])) < 1e-2
    for k in p["kernels"]:
        assert {"name", "category", "module", "calls", "ms"} <= set(k)
    assert p["profiled_idle_ms"] is None  # not meaningful on CPU


def test_flop_count_matches_hand_count(toy_profile):
    _, _, step = toy_profile
    f = count_flops(step)
    b, s, d = 2, 48, 64
    linear_per_block = 2 * b * s * (d * 3 * d + d * d + d * 4 * d + 4 * d * d)
    attn_per_block = 2 * (2 * b * 4 * s * s * (d // 4))
    assert f["linear"] == 2 * linear_per_block
    assert f["attention"] == 2 * attn_per_block


@pytest.mark.parametrize("name,op,cls,expect", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128", "aten::_scaled_dot_product_cudnn_attention", "", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "", "", "attention"),  # no op: still not GEMM
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "aten::addmm", "", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "", "", "gemm"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "", "", "attention"),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "", "", "attention"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda", "aten::copy_", "", "copy"),
    ("void at::native::CatArrayBatchedCopy<float, unsigned int, 3>", "aten::cat", "", "copy"),
    ("void at::native::vectorized_layer_norm_kernel<c10::BFloat16>", "aten::native_layer_norm", "", "normalization"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::mul_kernel", "aten::mul", "", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::pow_kernel", "aten::pow", "RMSNorm", "normalization"),
    ("triton_poi_fused_add_mul_0", "", "", "elementwise"),
    # inductor's FP8 quantization kernels (H100 profiles, 2026-12-06): named after _scaled_mm's input
    # preparation, never the GEMM; per-token (amax) and static (reciprocal scale), fused with a producer
    ("triton_red_fused__scaled_mm__to_copy_abs_amax_clamp_div_gelu_t_unsqueeze_view_4", "", "", "quantization"),
    ("triton_poi_fused__to_copy_clamp_mul_reciprocal_0", "", "", "quantization"),
    ("triton_poi_fused__scaled_mm__to_copy_cat_clamp_clone_expand_mul_reciprocal_silu_slice_split", "", "", "quantization"),
    ("triton_poi_fused__scaled_mm_clone_expand_view_0", "", "", "elementwise"),  # the repeated scale: no cast, no GEMM
    ("triton_poi_fused_clamp_mul_0", "", "", "elementwise"),  # a clamp alone is no quantization
    ("triton_tem_fused_mm_0", "", "", "gemm"),  # inductor's own matmul template is one
    ("fused_quantize_fp8_e4m3_kernel", "", "", "quantization"),
    ("Memcpy HtoD (Pageable -> Device)", "", "", "copy"),
    # CuTe-DSL kernels are all "kernel_cutlass_kernel_<module>..." (SGLang's Qwen-Image norms, H100 2026-12-07):
    # the DSL's name is no GEMM; a CuTe-DSL GEMM still says so
    ("kernel_cutlass_kernel_sglangkernelsopsdiffusionnormscale_residual_norm_cutedslScaleResidualNormScaleShift_o",
     "", "", "normalization"),
    ("kernel_cutlass_kernel_cutlassgemmsm90_dense_gemm_persistent_tile", "", "", "gemm"),
])
def test_categories(name, op, cls, expect):
    assert categorize(name, op, cls) == expect


def test_gpu_trace_attribution_via_correlation():
    """A synthetic chrome trace in torch.profiler's format: kernel -> launch -> op + module range."""
    mod = "optbot.module::blocks.3.attn.to_q|Linear"
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "optbot.step", "ts": 0, "dur": 1000, "tid": 1, "pid": 1},
        {"ph": "X", "cat": "user_annotation", "name": mod, "ts": 10, "dur": 100, "tid": 1, "pid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 20, "dur": 50, "tid": 1, "pid": 1,
         "args": {"Input Dims": [[64], [32, 16], [16, 64]], "Input type": ["float", "float", "float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 30, "dur": 5, "tid": 1, "pid": 1,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_64x8", "ts": 200, "dur": 40, "tid": 7, "pid": 0,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 500, "dur": 5, "tid": 1, "pid": 1,
         "args": {"correlation": 8}},
        {"ph": "X", "cat": "kernel", "name": "cudnn_generated_fort_native_sdpa_sm90_knob", "ts": 300, "dur": 60,
         "tid": 7, "pid": 0, "args": {"correlation": 8}},
    ]}
    p = parse_trace(trace, "cuda")
    ks = {k["name"]: k for k in p["kernels"]}
    assert ks["nvjet_sm90_tst_64x8"]["module"] == "blocks.3.attn.to_q"
    assert ks["nvjet_sm90_tst_64x8"]["op"] == "aten::addmm" and ks["nvjet_sm90_tst_64x8"]["category"] == "gemm"
    assert ks["cudnn_generated_fort_native_sdpa_sm90_knob"]["category"] == "attention"
    assert p["launches"] == 2
    assert p["profiled_span_ms"] == pytest.approx(0.16) and p["busy_ms"] == pytest.approx(0.1)
    assert p["profiled_idle_ms"] == pytest.approx(0.06)


def test_flops_of_a_gemm_with_an_activation_epilogue_are_counted():
    """torch._addmm_activation (cuBLASLt's bias + GELU epilogue: qwen-image-linear-gelu-epilogue) is a
    GEMM: the roofline must count it as addmm is counted."""
    import torch

    x, w, b = torch.randn(6, 8), torch.randn(16, 8), torch.randn(16)
    f = count_flops(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True))
    assert f == {"linear": 2 * 6 * 8 * 16, "attention": 0}


def test_flops_inside_a_registered_custom_op_are_counted():
    """SGLang's default-quality Qwen-Image runs its MLP up projection as a registered custom op
    (fused linear + GELU through `_addmm_activation`); the mode sees the op, not its body, so the
    roofline counted 83.5 of 125.3 linear TFLOP. The GEMMs inside any custom op count, once, and the
    op's result is its own."""
    import torch

    @torch.library.custom_op("optbot_test::linear_gelu", mutates_args=())
    def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch._addmm_activation(b, x, w.t(), use_gelu=True)

    @torch.library.custom_op("optbot_test::two_matmuls", mutates_args=())
    def two_matmuls(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w.t()) @ w  # matmul reaches the mode whole below autograd

    x, w, b = torch.randn(6, 8), torch.randn(16, 8), torch.randn(16)
    out = {}
    f = count_flops(lambda: out.setdefault("y", linear_gelu(x, w, b)))
    assert f == {"linear": 2 * 6 * 8 * 16, "attention": 0}
    torch.testing.assert_close(out["y"], torch.nn.functional.gelu(x @ w.t() + b, approximate="tanh"),
                               atol=1e-3, rtol=1e-3)
    f = count_flops(lambda: two_matmuls(x, w))
    assert f == {"linear": 2 * 6 * 8 * 16 + 2 * 6 * 16 * 8, "attention": 0}
    # an op with no tensor argument runs as itself
    assert count_flops(lambda: torch.ops.aten.scalar_tensor(1.0)) == {"linear": 0, "attention": 0}
