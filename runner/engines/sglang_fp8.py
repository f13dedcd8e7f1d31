"""SGLang's own FP8 path, as a team serving FLUX.2 or Qwen-Image in FP8 on SGLang runs it (issue 16).

SGLang serves FP8 diffusion checkpoints made by NVIDIA ModelOpt (`ModelOptFp8Config`,
`ModelOptFp8LinearMethod` in multimodal_gen/runtime/layers/quantization/modelopt_quant.py), and its
DiTs take FP8-only paths for them (FLUX.2: the LayerNorm + modulation kernel that writes the e4m3
input of the next projection, `_try_flux2_norm_modulate_fp8`; Qwen-Image: one Q/K/V GEMM per
stream). A ModelOpt FP8 checkpoint holds, per linear layer of the DiT: the weight in e4m3 with one
float32 scale per checkpoint tensor (amax / 448), and one static float32 input scale per tensor
(the calibrated amax of that layer's input / 448); SGLang's converter
(multimodal_gen/tools/build_modelopt_fp8_transformer.py) writes exactly that. So here:

  config(cls)          the quantization config the DiT is built with: SGLang's own, so that it
                       builds the paths it builds for such a checkpoint;
  load_weights(model)  the checkpoint's tensors from the seeded weights (runner/weights.py): each
                       base tensor of a layer (a fused layer packs several) quantized with its own
                       scale, as the converter does; input scales pending;
  calibrate(model, run)  the input scales: each layer's input amax over one run of the step's
                       passes with the e4m3 weights dequantized (SGLang's product needs the scale
                       it is computing), rounded up to a bfloat16 value so that last-bit differences
                       between a base and a candidate engine give both the same scale; then SGLang's
                       own `process_weights_after_loading` and the DiT's `post_load_weights`, which
                       switch the FP8 paths on, as its loader does.

On the GPU box sgl_kernel is stood in for, and its `fp8_scaled_mm` (the CUTLASS GEMM SGLang's FP8
linear calls on Hopper) runs as torch._scaled_mm (runner/engines/sglang_standins.py; the
environment block says so). Scales calibrated on the very inputs that are timed are the kindest
case for accuracy; the FP8 gate compares with this same baseline.
"""
from __future__ import annotations

import struct

import torch
import torch.nn.functional as F

from runner.quant import E4M3_MAX, to_e4m3

IMPLEMENTATION = ("SGLang's own ModelOpt FP8 (ModelOptFp8Config): e4m3 weights with one scale per checkpoint "
                  "tensor, static per-tensor input scales calibrated on the step's first inputs, SGLang's "
                  "FP8 linear and its FP8-only model paths")


def config(cls):
    from sglang.multimodal_gen.runtime.layers.quantization.modelopt_quant import ModelOptFp8Config

    return ModelOptFp8Config(is_checkpoint_fp8_serialized=True,
                             packed_modules_mapping=dict(getattr(cls, "packed_modules_mapping", None) or {}))


def fp8_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    from sglang.multimodal_gen.runtime.layers.quantization.modelopt_quant import ModelOptFp8LinearMethod

    return [(n, m) for n, m in model.named_modules() if isinstance(getattr(m, "quant_method", None),
                                                                   ModelOptFp8LinearMethod)]


def _param(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)


def load_weights(model: torch.nn.Module) -> int:
    """Each FP8 layer's seeded weight (in the model's dtype) becomes the checkpoint's e4m3 weight and
    per-tensor weight scales; its input scales wait for `calibrate`. Returns the number of layers."""
    layers = fp8_layers(model)
    with torch.no_grad():
        for _, layer in layers:
            parts = layer.weight.detach().split(list(layer.logical_widths), 0)
            scales = [p.abs().amax().float().clamp(min=1e-12) / E4M3_MAX for p in parts]
            layer.weight = _param(torch.cat([to_e4m3(p, s) for p, s in zip(parts, scales)]))
            layer.weight_scale = _param(torch.stack(scales))
            layer.input_scale = _param(torch.full((len(parts),), float("nan"), device=layer.weight.device))
    model.optbot_fp8_calibrated = False
    return len(layers)


def bf16_ceil(x: float) -> float:
    """The smallest bfloat16 value >= x (x > 0): float32 bits rounded up to an 8-bit mantissa."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    up = (bits + 0xFFFF) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", up))[0]


class _Calibrating:
    """A layer's product while its input scale is measured: the e4m3 weight dequantized, its input's amax kept."""

    def __init__(self, amax: dict, name: str):
        self.amax, self.name = amax, name

    def apply(self, layer, x, bias=None):
        a = float(x.detach().abs().amax())
        self.amax[self.name] = max(self.amax.get(self.name, 0.0), a)
        scale = layer.weight_scale.repeat_interleave(torch.tensor(list(layer.logical_widths),
                                                                  device=layer.weight.device))
        w = (layer.weight.float() * scale[:, None]).to(x.dtype)
        return F.linear(x, w, bias)


def calibrate(model: torch.nn.Module, run) -> dict:
    """Input scales from one call of `run` (the step's passes), then SGLang's own post-load processing.
    Returns the note for the environment block."""
    from sglang.multimodal_gen.runtime.utils.quantization_utils import process_model_weights_after_loading

    layers = fp8_layers(model)
    amax: dict[str, float] = {}
    methods = {n: m.quant_method for n, m in layers}
    try:
        for n, m in layers:
            m.quant_method = _Calibrating(amax, n)
        run()
    finally:
        for n, m in layers:
            m.quant_method = methods[n]
    unseen = [n for n, _ in layers if n not in amax]
    if unseen:
        raise RuntimeError(f"{len(unseen)} FP8 layer(s) saw no input in the calibration run, so they have no "
                           f"input scale: {', '.join(unseen[:5])}")
    scales = {}
    with torch.no_grad():
        for n, m in layers:
            scales[n] = bf16_ceil(max(amax[n], 1e-6)) / E4M3_MAX
            m.input_scale = _param(torch.full((len(m.logical_widths),), scales[n], dtype=torch.float32,
                                              device=m.weight.device))
        processed = process_model_weights_after_loading(model, quantized_only=True)
        post = getattr(model, "post_load_weights", None)
        if callable(post):
            post()
    model.optbot_fp8_calibrated = True
    lo, hi = min(scales.values()), max(scales.values())
    return {"layers": len(layers), "processed_after_loading": processed,
            "inputs": "one run of the step's passes at the first shape and seed, weights in e4m3 dequantized",
            "input_scale_range": [lo, hi], "rounding": "input amax rounded up to a bfloat16 value, / 448"}
