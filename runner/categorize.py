"""Kernel / op categories for the profile.

A kernel is categorized from three clues, in this order:
1. its own name, for attention: cuDNN's attention kernels are called e.g.
   ``cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_...``: they contain "sm90" and
   "wgmma" like GEMMs do, so attention must be recognized before any GEMM rule looks at the name;
2. the aten op that launched it (aten::addmm -> gemm, aten::cat -> copy, ...), the most reliable
   clue for library kernels whose names say little;
3. keywords in the kernel name (cuBLAS ``nvjet``/``xmma``/``gemm``, ``elementwise``, Triton's
   ``triton_poi``/``triton_red``...);
and finally, elementwise/reduction work launched inside a module whose class is a normalization
(e.g. diffusers' hand-written RMSNorm: pow, mean, rsqrt, mul) counts as normalization.
"""
from __future__ import annotations

CATEGORIES = ("gemm", "attention", "normalization", "elementwise", "copy", "quantization", "other")
MEMORY_BOUND = ("normalization", "elementwise", "copy", "quantization")

_ATTN_NAME = ("sdpa", "fmha", "flash_fwd", "flash::", "pytorch_flash", "attention", "attn_fwd", "flash_attn")
_OP_RULES = (
    (("scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention", "flash_attn"), "attention"),
    (("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_scaled_mm",
      "aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::mkldnn_convolution",
      "aten::_addmm_activation"), "gemm"),
    (("quantize", "aten::_scaled_mm_v2", "fp8"), "quantization"),
    (("layer_norm", "rms_norm", "group_norm", "batch_norm"), "normalization"),
    (("aten::cat", "aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::stack",
      "aten::index", "aten::fill_", "aten::zero_", "aten::repeat", "aten::expand_copy", "aten::_unsafe_view",
      "aten::narrow_copy", "aten::split_with_sizes_copy"), "copy"),
)
_NAME_RULES = (
    (("quant", "e4m3", "fp8"), "quantization"),
    (("gemm", "nvjet", "xmma", "s16816", "s1688", "cublas", "cutlass", "wgmma", "hgmma", "matmul", "_mm_"), "gemm"),
    (("layer_norm", "layernorm", "rms_norm", "rmsnorm", "rowwisemoments", "group_norm", "_norm_"), "normalization"),
    (("copy", "memcpy", "memset", "catarray", "cat_", "concat", "transpose", "permute", "fill"), "copy"),
    (("elementwise", "triton_poi", "triton_red", "triton_per", "reduce_kernel", "vectorized", "unrolled",
      "silu", "gelu", "swiglu", "rope", "rotary", "add", "mul", "softmax"), "elementwise"),
)


# inductor's generated pointwise / reduction kernels (its matmul templates are triton_tem_*): named
# after the aten ops they fuse, so a name holding "_scaled_mm" is the scale or input preparation of an
# FP8 GEMM, never the GEMM itself (cuBLAS runs it)
_INDUCTOR_GENERATED = ("triton_poi_", "triton_red_", "triton_per_")


# CuTe-DSL (nvidia-cutlass-dsl) names every kernel it compiles "kernel_cutlass_kernel_" + the Python
# module path and function: "cutlass" there is the DSL, not a GEMM. SGLang's Qwen-Image norms on the GPU
# are such kernels (..._scale_residual_norm_cutedsl...): 7.2 ms of its step filed as GEMM before
# (benchmarks/results/h100-sglang-qwen-image-20261207/). The rest of the name still says what it is.
_CUTE_DSL = "kernel_cutlass_kernel_"


def _inductor_quantization(n: str) -> bool:
    """An inductor kernel that casts to float8 with a scale: per-token dynamic (abs, amax, clamp) or
    static (a reciprocal scale, clamp, cast), fused or not with the op that produced its input."""
    return "clamp" in n and "_to_copy" in n and ("amax" in n or "reciprocal" in n)


def categorize(name: str, op: str = "", module_class: str = "") -> str:
    n, o = name.lower(), op.lower()
    if any(k in n for k in _ATTN_NAME):
        return "attention"
    if n.startswith(_INDUCTOR_GENERATED):
        if _inductor_quantization(n):
            return "quantization"
        # the GEMM keywords of the name rules below would catch "_scaled_mm" and "_mm_"
        n = n.replace("_scaled_mm", "").replace("_mm_", "_")
    if n.startswith(_CUTE_DSL):
        n = n[len(_CUTE_DSL):].replace("cutlass", "")
    cat = None
    for keys, c in _OP_RULES:
        if o and any(k in o for k in keys):
            cat = c
            break
    if cat is None:
        for keys, c in _NAME_RULES:
            if any(k in n for k in keys):
                cat = c
                break
    if cat is None and o.startswith("aten::"):
        cat = "elementwise"  # remaining aten ops on tensors (add, mul, silu, pow, mean, rsqrt, ...)
    if cat is None:
        cat = "other"
    if cat in ("elementwise", "other") and "norm" in module_class.lower():
        cat = "normalization"
    return cat
