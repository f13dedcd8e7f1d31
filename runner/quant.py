"""Quantization recipes applied to a built model, the way a user of the engine deploys it (issue 16).

`apply(model, recipe, device)` changes the model's linear layers in place, after its weights are
loaded, and returns the note the result's environment block records (which implementation ran,
how many layers it took, which it left in their dtype and why).

Recipe `fp8`: what FP8 deployments of these DiTs run. Every eligible `nn.Linear` computes in float8
e4m3: its weight quantized once, here, with one float32 scale per output channel (row-wise);
its input quantized on every call with one scale per token (dynamic, row-wise); one
`torch._scaled_mm` with both scales and the input's dtype out; attention and everything else stay
in the model's dtype.
  - where torchao can (a CUDA device of compute capability 8.9 or newer, torchao importable): torchao's
    `Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())`, the config behind diffusers'
    `TorchAoConfig("float8dq_e4m3_row")`: what a diffusers user would run today;
  - elsewhere (the CPU, where torchao refuses float8; a GPU without torchao): optbot's emulation of
    the same recipe, `Fp8Linear` below, on the same `_scaled_mm`. The note names which one ran;
    numbers of the two are never mixed up.
Eligible: both feature counts multiples of 16 (what `_scaled_mm` takes; torchao skips the rest too).

Which layers are linear: `nn.Linear`. Any other module with a 2-D weight parameter that is not an
embedding is refused by name: a result labelled FP8 never leaves a linear layer of unknown kind in
its dtype. An engine with an FP8 path of its own deploys that instead of this recipe (the adapter's
`quantize`, runner/harness.build): SGLang runs its ModelOpt FP8 (runner/engines/sglang_fp8.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.job import QUANT_RECIPES as RECIPES

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


class QuantError(Exception):
    pass


def linear(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear)


def eligible(module: torch.nn.Module) -> bool:
    return linear(module) and module.weight.shape[0] % 16 == 0 and module.weight.shape[1] % 16 == 0


def _unknown_linear_like(model: torch.nn.Module) -> list[str]:
    """Modules with a 2-D weight parameter that are neither linear layers this recipe takes nor
    embeddings: "Class (path)" each."""
    out = []
    for n, m in model.named_modules():
        w = getattr(m, "weight", None)
        if (isinstance(w, torch.nn.Parameter) and w.dim() == 2 and not linear(m)
                and not isinstance(m, torch.nn.Embedding) and "Embedding" not in type(m).__name__):
            out.append(f"{type(m).__module__}.{type(m).__name__} ({n})")
    return out


def _fp8_product(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The recipe's product: per-token e4m3 activations times the e4m3 weight [N, K] with its
    per-channel scales [1, N], in x's dtype."""
    shape = x.shape
    a8, a_scale = quantize_rows(x.reshape(-1, shape[-1]))  # [M, K], [M, 1]
    out = torch._scaled_mm(a8, w8.t(), scale_a=a_scale, scale_b=w_scale, out_dtype=x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*shape[:-1], out.shape[-1])


def _keep_fp8_weight(layer: torch.nn.Module) -> None:
    """e4m3 weight and per-channel scales as buffers of `layer`; the unquantized values go (a
    deployment does not keep them): the dtype stays readable for code that asks for it, and an empty
    tensor fails loudly wherever the values would be used."""
    w8, s = quantize_rows(layer.weight.detach())  # [N, K], [N, 1]
    layer.register_buffer("w8", w8, persistent=False)
    layer.register_buffer("w_scale", s.reshape(1, -1).contiguous(), persistent=False)
    layer.weight = torch.nn.Parameter(torch.empty(0, dtype=layer.weight.dtype, device=layer.weight.device),
                                      requires_grad=False)


def to_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale in float8 e4m3, saturated at +-448 (the cast itself would give NaN above it)."""
    return (x.float() / scale.float()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (e4m3 [M, K], float32 scales [M, 1]) with x ~= e4m3 * scale, one scale per row."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return to_e4m3(x, scale), scale


class Fp8Linear(torch.nn.Linear):
    """The fp8 recipe without torchao: weight e4m3 with per-output-channel scales, made once
    (`from_linear`); per-token activation scales on every call. The bf16 weight is dropped, as a
    deployment drops it."""

    w8: torch.Tensor      # [N, K] e4m3
    w_scale: torch.Tensor  # [1, N] float32

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear) -> "Fp8Linear":
        _keep_fp8_weight(lin)
        lin.__class__ = cls
        return lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _fp8_product(x, self.w8, self.w_scale, self.bias)


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The fp8 recipe's arithmetic in float32, for tests: quantize-dequantize both operands, then F.linear."""
    xs = x.reshape(-1, x.shape[-1])
    a8, sa = quantize_rows(xs)
    w8, sw = quantize_rows(weight)
    out = F.linear(a8.float() * sa, w8.float() * sw, None if bias is None else bias.float())
    return out.reshape(*x.shape[:-1], -1)


def fp8_unsupported(device: str) -> str:
    """Why `torch._scaled_mm` on float8 cannot run on `device`, or "" when it can (torch emulates it
    on the CPU; on CUDA it needs FP8 matrix units)."""
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn / _scaled_mm"
    if device.startswith("cuda"):
        cap = torch.cuda.get_device_capability(torch.device(device))
        if cap < (8, 9):
            return f"compute capability {cap[0]}.{cap[1]}: FP8 matrix units need 8.9 (Ada) or newer"
    return ""


def _torchao_why_not(device: str) -> str:
    """"" when torchao's float8 recipe runs here, else why not."""
    if not device.startswith("cuda"):
        return "torchao's float8 needs CUDA compute capability 8.9+ (it refuses the CPU)"
    why = fp8_unsupported(device)
    if why:
        return why
    try:
        import torchao  # noqa: F401
    except ImportError:
        return "torchao is not installed"
    return ""


def torchao_weights(model: torch.nn.Module) -> str:
    """Every nn.Linear's weight as torchao's Float8Tensor, built with torchao's own constructors and
    Float8DynamicActivationFloat8WeightConfig(PerRow)'s settings: what its quantize_ makes on a GPU,
    for a CPU, where quantize_ refuses float8 but the tensor and its linear run (the analyzer's and the
    inductor probe's tests of the GPU's recipe form; tests/kernel_store/compile_blocks.py's
    `--fp8-form torchao`: the store's FP8 stacks on the weight type the GPU gives them). Only the
    eligible layers, as quantize_'s filter in `apply`. Returns the implementation's name."""
    import torchao
    import torchao.quantization as ao
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor, QuantizeTensorToFloat8Kwargs

    cfg = ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow())
    act_g, w_g = cfg.granularity
    act = QuantizeTensorToFloat8Kwargs(cfg.activation_dtype, act_g, hp_value_lb=cfg.activation_value_lb,
                                       hp_value_ub=cfg.activation_value_ub, kernel_preference=cfg.kernel_preference)
    for lin in [m for m in model.modules() if eligible(m)]:
        lin.weight = torch.nn.Parameter(Float8Tensor.from_hp(
            lin.weight.detach(), float8_dtype=cfg.weight_dtype, granularity=w_g, mm_config=cfg.mm_config,
            kernel_preference=cfg.kernel_preference, act_quant_kwargs=act), requires_grad=False)
    return f"torchao {torchao.__version__} Float8Tensor (PerRow), built directly"


def apply(model: torch.nn.Module, recipe: str, device: str) -> dict:
    if recipe not in RECIPES:
        raise QuantError(f"unknown quantization recipe {recipe!r}; one of {list(RECIPES)}")
    unknown = _unknown_linear_like(model)
    if unknown:
        raise QuantError(f"{len(unknown)} layer(s) of {type(model).__name__} hold a 2-D weight but are not "
                         f"torch.nn.Linear, so the fp8 recipe would leave them unquantized: {', '.join(unknown[:5])}"
                         f"{' ...' if len(unknown) > 5 else ''} (docs/fp8.md)")
    mods = dict(model.named_modules())
    names = [n for n, m in mods.items() if eligible(m)]
    skipped = [n for n, m in mods.items() if linear(m) and not eligible(m)]
    if not names and not skipped:
        raise QuantError(f"{type(model).__name__} has no linear layer (torch.nn.Linear): "
                         "nothing for the fp8 recipe to quantize")
    if not names:
        raise QuantError("no linear layer has both feature counts a multiple of 16: nothing to quantize")
    why_not = _torchao_why_not(device)
    if not why_not:
        import torchao
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

        quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
                  filter_fn=lambda m, fqn: eligible(m))
        impl = f"torchao {torchao.__version__} Float8DynamicActivationFloat8WeightConfig(PerRow)"
    else:
        with torch.no_grad():
            for n in names:
                Fp8Linear.from_linear(mods[n])
        impl = f"optbot emulation of that recipe (torchao not used: {why_not})"
    note = {"recipe": recipe, "implementation": impl, "form": "e4m3 weights, per-channel scales made at load; "
            "e4m3 activations, per-token scales per call; torch._scaled_mm; attention unchanged",
            "linear_layers": len(names), "left_unquantized": skipped[:20] + (["..."] if len(skipped) > 20 else [])}
    return note
