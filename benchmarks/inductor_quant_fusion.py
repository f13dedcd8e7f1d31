"""Does inductor compute a norm + modulation and the FP8 per-token quantization after it in one
kernel, and does an opaque op in front of the quantization split them? (replay's FP8 step-aside,
docs/fp8.md.) One Qwen-Image-sized place: LayerNorm without affine, x * (1 + scale) + shift, then a
linear under optbot's FP8 recipe (runner/quant.apply: torchao on a CUDA GPU with compute capability
>= 8.9, the emulation elsewhere; on the CPU also torchao's own Float8Tensor, built directly), compiled twice: the reference ops, and the same norm + modulation
as a registered op inductor cannot look into. Prints the kernels inductor generated for each (from
its output code) and, on CUDA, inductor's bytes-accessed metric and the compiled step's time.

    python benchmarks/inductor_quant_fusion.py [cpu|cuda] [TOKENS]
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import quant  # noqa: E402

D = 3072


def _norm_mod(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],)) * (1 + scale) + shift


try:  # one registration per process (a test may load this file twice)
    norm_mod = torch.ops.probe.norm_mod
except (AttributeError, RuntimeError):
    norm_mod = torch.library.custom_op("probe::norm_mod", mutates_args=())(_norm_mod)
    norm_mod.register_fake(lambda x, shift, scale: torch.empty_like(x))


class Place(nn.Module):
    def __init__(self, opaque: bool):
        super().__init__()
        self.opaque = opaque
        self.n = nn.LayerNorm(D, elementwise_affine=False)
        self.p = nn.Linear(D, D)

    def forward(self, x, shift, scale):
        h = norm_mod(x, shift, scale) if self.opaque else self.n(x) * (1 + scale) + shift
        return self.p(h)


def _recipes(device: str) -> list[str]:
    """On a GPU the recipe runner/quant.apply picks (torchao there); on the CPU the emulation, and
    torchao's form too when torchao imports."""
    if device == "cuda":
        return ["apply"]
    try:
        import torchao.quantization  # noqa: F401
    except ImportError:
        return ["apply"]
    return ["apply", "torchao"]


def main(device: str = "cpu", tokens: int = 4096) -> dict:
    from torch._inductor import metrics
    from torch._inductor.utils import run_and_get_code  # the compiled module's source, as inductor's tests read it

    out = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "tokens": tokens, "width": D, "recipes": {}}
    for recipe in _recipes(device):
        # the emulation computes in float32 on the CPU; torchao's form and the GPU in bf16
        dtype = torch.bfloat16 if device == "cuda" or recipe == "torchao" else torch.float32
        rows = {"dtype": str(dtype).removeprefix("torch.")}
        for opaque in (False, True):
            torch._dynamo.reset()
            m = Place(opaque).to(device, dtype)
            # torchao's form on the CPU: its Float8Tensor built directly (quantize_ refuses the CPU)
            name = quant.torchao_weights(m) if recipe == "torchao" else quant.apply(m, "fp8", device)["implementation"]
            x = torch.randn(1, tokens, D, device=device, dtype=dtype)
            shift, scale = (torch.randn(1, 1, D, device=device, dtype=dtype) for _ in range(2))
            metrics.reset()
            c = torch.compile(m)
            with torch.no_grad():
                _, sources = run_and_get_code(c, x, shift, scale)
                text = "\n".join(sources)
                row = {"kernels": sorted(set(re.findall(r"\b(?:triton_[a-z]+_fused_[A-Za-z0-9_]+|cpp_fused_[A-Za-z0-9_]+)", text))),
                       "opaque_calls": sorted(set(re.findall(r"torch\.ops\.probe\.[a-z_]+", text)))}
                if device == "cuda":
                    row["inductor_bytes_accessed_MB"] = round(metrics.num_bytes_accessed / 1e6, 1)
                    for _ in range(5):
                        c(x, shift, scale)
                    torch.cuda.synchronize()
                    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0.record()
                    for _ in range(50):
                        c(x, shift, scale)
                    t1.record()
                    torch.cuda.synchronize()
                    row["ms_per_call"] = round(t0.elapsed_time(t1) / 50, 4)
            rows["opaque op" if opaque else "reference ops"] = row
        out["recipes"][name] = rows
    return out


if __name__ == "__main__":
    print(json.dumps(main(*(sys.argv[1:2] or ["cpu"]), *[int(a) for a in sys.argv[2:3]]), indent=1))
