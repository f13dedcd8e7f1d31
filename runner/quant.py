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
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.job import QUANT_RECIPES as RECIPES

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


class QuantError(Exception):
    pass


def eligible(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (e4m3 [M, K], float32 scales [M, 1]) with x ~= e4m3 * scale, one scale per row."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


class Fp8Linear(torch.nn.Linear):
    """The fp8 recipe without torchao: weight e4m3 with per-output-channel scales, made once
    (`from_linear`); per-token activation scales on every call. The bf16 weight is dropped, as a
    deployment drops it."""

    w8: torch.Tensor      # [N, K] e4m3
    w_scale: torch.Tensor  # [1, N] float32

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear) -> "Fp8Linear":
        w8, s = quantize_rows(lin.weight.detach())  # [N, K], [N, 1]
        lin.__class__ = cls
        lin.register_buffer("w8", w8, persistent=False)
        lin.register_buffer("w_scale", s.reshape(1, -1).contiguous(), persistent=False)
        # the bf16 values go (a deployment does not keep them); the dtype stays readable for code
        # that asks for it, and an empty tensor fails loudly wherever the values would be used
        lin.weight = torch.nn.Parameter(torch.empty(0, dtype=lin.weight.dtype, device=lin.weight.device),
                                        requires_grad=False)
        return lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        a8, a_scale = quantize_rows(x.reshape(-1, shape[-1]))  # [M, K], [M, 1]
        out = torch._scaled_mm(a8, self.w8.t(), scale_a=a_scale, scale_b=self.w_scale, out_dtype=x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], out.shape[-1])


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


def apply(model: torch.nn.Module, recipe: str, device: str) -> dict:
    if recipe not in RECIPES:
        raise QuantError(f"unknown quantization recipe {recipe!r}; one of {list(RECIPES)}")
    names = [n for n, m in model.named_modules() if eligible(m)]
    skipped = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not eligible(m)]
    if not names and not skipped:
        raise QuantError(f"{type(model).__name__} has no torch.nn.Linear layer: an engine with linear layers of its "
                         "own (SGLang's) needs its own FP8 path, not wired yet (docs/fp8.md)")
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
        mods = dict(model.named_modules())
        with torch.no_grad():
            for n in names:
                Fp8Linear.from_linear(mods[n])
        impl = f"optbot emulation of that recipe (torchao not used: {why_not})"
    return {"recipe": recipe, "implementation": impl, "form": "e4m3 weights, per-channel scales made at load; "
            "e4m3 activations, per-token scales per call; torch._scaled_mm; attention unchanged",
            "linear_layers": len(names), "left_unquantized": skipped[:20] + (["..."] if len(skipped) > 20 else [])}
