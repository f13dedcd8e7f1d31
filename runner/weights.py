"""Build a model at a preset with one seeded state dict, made on the target device.

The state dict is in the *base* model's format: one tensor per parameter name, each drawn from its
own generator seeded by (weight_seed, name). Base and candidate therefore get bit-identical weights
for every parameter they share by name. A candidate that changes the layout (e.g. merged QKV) must
convert at load time, as engines do with real checkpoints (see ``load_state_dict`` in its patch).

Parameters are never materialized in host memory: construction registers them on the meta device
(FLUX.2 in fp32 would be 129 GB), then each is created on the target device in the target dtype.
Buffers and plain tensor attributes (e.g. RoPE tables) are built normally and moved.
"""
from __future__ import annotations

import contextlib
import hashlib
import math

import torch
from torch import nn


@contextlib.contextmanager
def params_on_meta():
    orig = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        orig(self, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = orig


def name_seed(weight_seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{weight_seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def seeded_tensor(name: str, shape: tuple[int, ...], weight_seed: int, device, dtype) -> torch.Tensor:
    """The value of parameter `name`: scaled so activations stay O(1) through deep stacks."""
    g = torch.Generator(device=device)
    g.manual_seed(name_seed(weight_seed, name))
    t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) == 1 and ("norm" in name or leaf in ("scale", "gamma")):
        t = 1.0 + 0.05 * t  # norm gains around one
    elif len(shape) == 1:
        t = 0.02 * t  # biases: small, never zero
    else:
        t = t / math.sqrt(shape[-1])  # fan-in scaling for linear (and conv) weights
    return t.to(dtype)


def seeded_state_dict(model: nn.Module, weight_seed: int, device, dtype) -> dict[str, torch.Tensor]:
    return {n: seeded_tensor(n, tuple(p.shape), weight_seed, device, dtype) for n, p in model.named_parameters()}


def build_model(cls, config: dict, device: str, dtype: torch.dtype, weight_seed: int, weights: str = "seeded") -> nn.Module:
    if weights != "seeded":
        model = cls.from_pretrained(weights, torch_dtype=dtype).to(device).requires_grad_(False)
        after_load(model)
        return model.eval()
    with params_on_meta():
        model = cls(**config)
    model.requires_grad_(False)
    for mod_name, mod in model.named_modules():
        for pname, p in list(mod._parameters.items()):
            if p is None:
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            mod._parameters[pname] = nn.Parameter(
                seeded_tensor(full, tuple(p.shape), weight_seed, device, dtype), requires_grad=False)
        for bname, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[bname] = b.to(device=device, dtype=dtype if b.is_floating_point() else b.dtype)
    after_load(model)
    return model.eval()


def after_load(model: nn.Module) -> list[str]:
    """A candidate that changed the parameter layout converts from the base format here: the model's
    `optbot_after_load` and then every `optbot_after_load_<name>` method, in name order (one per store
    entry that converts, so that entries which each convert at load compose in one stack). Runs before
    any quantization (runner/quant.py), so what they build is quantized like the base's layers."""
    names = sorted((n for n in dir(type(model))
                    if (n == "optbot_after_load" or n.startswith("optbot_after_load_")) and callable(getattr(model, n))),
                   key=lambda n: (n != "optbot_after_load", n))
    for n in names:
        getattr(model, n)()
    return names
