"""The engine file of the template generator's tests: small models whose fused result is known.
Written into a temp git repo as `toyeng/model.py` (the "engine"); each class has `example(seed)`,
its step's keyword inputs."""
import torch
import torch.nn as nn


def _inputs(seed, d=32, s=5):
    g = torch.Generator().manual_seed(seed)
    return {"pixels": torch.randn(2, s, d, generator=g), "words": torch.randn(2, d, generator=g)}


def _inputs_tau(seed, d=32, s=5):
    g = torch.Generator().manual_seed(seed)
    return {"pixels": torch.randn(2, s, d, generator=g), "tau": torch.randn(2, d, generator=g)}


class ModBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mod = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x, c):
        scale, shift = self.mod(c).unsqueeze(1).chunk(2, dim=-1)  # [B, 1, D] each
        h = (1 + scale) * self.norm(x) + shift
        return x + self.proj(h)


class NormModulate(nn.Module):
    """LayerNorm (no affine) then (1 + scale) * x + shift, scale/shift broadcast [B, 1, N] from the
    timestep (so the `1 + scale` add is not hoisted: it is one of the fused ops)."""

    def __init__(self, d=32):
        super().__init__()
        self.blocks = nn.ModuleList([ModBlock(d), ModBlock(d)])

    def forward(self, pixels, tau):
        for b in self.blocks:
            pixels = b(pixels, tau)
        return pixels

    example = staticmethod(_inputs_tau)


class AffineGelu(nn.Module):
    """LayerNorm with weight and bias, tanh-GELU, times a per-sample gate."""

    def __init__(self, d=32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        with torch.no_grad():  # not ones and zeros, so the affine part is checked
            self.norm.weight.copy_(torch.linspace(0.5, 1.5, d))
            self.norm.bias.copy_(torch.linspace(-0.2, 0.2, d))
        self.mod = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, pixels, words):
        gate = self.mod(words).unsqueeze(1)
        h = torch.nn.functional.gelu(self.norm(pixels), approximate="tanh") * gate
        return self.proj(h)

    example = staticmethod(_inputs)


class RmsWeight(nn.Module):
    """The hand-written RMS pattern times a weight, then a broadcast shift."""

    def __init__(self, d=32):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.mod = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, pixels, words):
        shift = self.mod(words).unsqueeze(1)
        h = self.proj(pixels)
        r = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w + shift
        return self.proj(r)

    example = staticmethod(_inputs)


class Chain(nn.Module):
    """x * sigmoid(x) * y: three memory-bound ops in a row."""

    def __init__(self, d=32):
        super().__init__()
        self.mod = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, pixels, words):
        y = self.mod(words).unsqueeze(1)
        g = pixels * torch.sigmoid(pixels) * y
        return self.proj(g)

    example = staticmethod(_inputs)


class TwoStatements(nn.Module):
    """The norm and its consumers on two lines, FLUX.2's way: the template joins the two statements."""

    def __init__(self, d=32):
        super().__init__()
        self.norm = nn.LayerNorm(d, elementwise_affine=False)
        self.mod = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, pixels, words):
        scale, shift = self.mod(words).unsqueeze(1).chunk(2, dim=-1)
        h = self.norm(pixels)
        h = h * (1 + scale) + shift
        return self.proj(h)

    example = staticmethod(_inputs)


class NotAdjacent(nn.Module):
    """As TwoStatements with an unrelated statement between the norm and its consumers: joining the
    two would move the norm past it, so the template refuses."""

    def __init__(self, d=32):
        super().__init__()
        self.norm = nn.LayerNorm(d, elementwise_affine=False)
        self.mod = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, pixels, words):
        scale, shift = self.mod(words).unsqueeze(1).chunk(2, dim=-1)
        h = self.norm(pixels)
        g = self.proj(words).unsqueeze(1)
        h = shift + h * (1 + scale)
        return self.proj(h) + g

    example = staticmethod(_inputs)


class Clamped(nn.Module):
    """A chain holding an op outside the template's table (clamp): refused."""

    def __init__(self, d=32):
        super().__init__()
        self.mod = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, pixels, words):
        y = self.mod(words).unsqueeze(1)
        g = torch.clamp(pixels * torch.sigmoid(pixels), -1.0, 1.0) * y
        return self.proj(g)

    example = staticmethod(_inputs)


class Gate(nn.Module):
    def forward(self, x):
        y = x * torch.sigmoid(x) * x
        return y


class SharedStatement(nn.Module):
    """One module class at two module paths (FLUX.2's SwiGLU in ff and ff_context): two
    opportunities, one engine statement; the template writes it once."""

    def __init__(self, d=32):
        super().__init__()
        self.img_gate = Gate()
        self.txt_gate = Gate()
        self.img_proj = nn.Linear(d, d)
        self.txt_proj = nn.Linear(d, d)

    def forward(self, pixels, words):
        a = self.img_gate(self.img_proj(pixels))
        b = self.txt_gate(self.txt_proj(pixels))
        return a + b

    example = staticmethod(_inputs)


def _inputs_two(seed, d=32, s=5, t=3):  # streams of two lengths (Qwen-Image: 4096 and 512 rows): one kernel
    g = torch.Generator().manual_seed(seed)
    return {"pixels": torch.randn(2, s, d, generator=g), "words": torch.randn(2, t, d, generator=g),
            "tau": torch.randn(2, d, generator=g)}


class HelperModulate(nn.Module):
    """Qwen-Image's block: each stream's norm on its own line in forward, its modulation in a helper
    method that returns (modulated, gate); the helper is called twice (image and text stream)."""

    def __init__(self, d=32):
        super().__init__()
        self.img_norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.txt_norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mod = nn.Linear(d, 6 * d)
        self.proj = nn.Linear(d, d)

    def _modulate(self, x, mod_params, index=None):
        shift, scale, gate = mod_params.chunk(3, dim=-1)
        shift_result, scale_result, gate_result = shift.unsqueeze(1), scale.unsqueeze(1), gate.unsqueeze(1)
        return x * (1 + scale_result) + shift_result, gate_result

    def forward(self, pixels, words, tau):
        img_mod, txt_mod = self.mod(tau).chunk(2, dim=-1)
        img_normed = self.img_norm(pixels)
        img_modulated, img_gate = self._modulate(img_normed, img_mod)
        txt_in = words + pixels[:, :1]  # not the prompt alone: that norm would be hoisted, not fused
        txt_normed = self.txt_norm(txt_in)
        txt_modulated, txt_gate = self._modulate(txt_normed, txt_mod)
        return pixels + img_gate * self.proj(img_modulated), words + txt_gate * self.proj(txt_modulated)

    example = staticmethod(_inputs_two)


class HelperReadsInput(nn.Module):
    """As HelperModulate, but the helper also reads its parameter outside the modulation (its shape):
    with the norm moved into the helper it would see the norm's input, so the template refuses."""

    def __init__(self, d=32):
        super().__init__()
        self.norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mod = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)

    def _modulate(self, x, mod_params):
        scale, shift = mod_params.view(x.shape[0], 1, -1).chunk(2, dim=-1)
        return x * (1 + scale) + shift

    def forward(self, pixels, words, tau):
        normed = self.norm(pixels)
        out = self._modulate(normed, self.mod(tau))
        return self.proj(out)

    example = staticmethod(_inputs_two)


class HelperAffine(nn.Module):
    """As HelperModulate with an affine norm: the helper would have to name one norm module's weight."""

    def __init__(self, d=32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mod = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)

    def _modulate(self, x, mod_params):
        scale, shift = mod_params.unsqueeze(1).chunk(2, dim=-1)
        return x * (1 + scale) + shift

    def forward(self, pixels, words, tau):
        normed = self.norm(pixels)
        out = self._modulate(normed, self.mod(tau))
        return self.proj(out)

    example = staticmethod(_inputs_two)


class ReturnBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mod = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)

    def _modulate(self, x, scale, shift):
        return self.norm(x) * (1 + scale) + shift

    def forward(self, x, c):
        scale, shift = self.mod(c).unsqueeze(1).chunk(2, dim=-1)
        return x + self.proj(self._modulate(x, scale, shift))


class ReturnModulate(nn.Module):
    """The norm and its modulation in one `return` of a helper (SGLang's `_flux2_norm_modulate`):
    the statement is a return, not an assignment."""

    def __init__(self, d=32):
        super().__init__()
        self.blocks = nn.ModuleList([ReturnBlock(d), ReturnBlock(d)])

    def forward(self, pixels, tau):
        for b in self.blocks:
            pixels = b(pixels, tau)
        return pixels

    example = staticmethod(_inputs_tau)
