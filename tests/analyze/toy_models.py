"""Small DiT-like models written for these tests, with module and class names unlike any real
model's, so a detector that keyed on names would miss them."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


class Squash(nn.Module):
    """A hand-written RMS normalization (pow, mean, rsqrt, mul, gain)."""

    def __init__(self, d):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * r * self.g


class Blender(nn.Module):
    """One toy DiT block: timestep modulation, norm, merged-able projections, attention with
    QK-normalization and a rotary table, gated residuals, a gated MLP."""

    def __init__(self, d=32, heads=2, qk_norm=True, rope=True, split_reads=False):
        super().__init__()
        self.d, self.h = d, heads
        self.knobs = nn.Linear(d, 6 * d)
        self.flatten_a = nn.LayerNorm(d, elementwise_affine=False)
        self.flatten_b = nn.LayerNorm(d, elementwise_affine=False)
        self.red, self.green, self.blue = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.sq_r = Squash(d // heads) if qk_norm else None
        self.sq_g = Squash(d // heads) if qk_norm else None
        self.rope = rope
        self.mix_out = nn.Linear(d, d)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)
        self.split_reads = split_reads

    def forward(self, x, emb, table, mask=None):
        b, s, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.knobs(F.silu(emb)).unsqueeze(1).chunk(6, dim=-1)
        y = self.flatten_a(x) * (1 + scale1) + shift1
        if self.split_reads:  # three projections of three different parts: not siblings
            a, c, e = y, y.flip(1), y * 0.5
            q, k, v = self.red(a), self.green(c), self.blue(e)
        else:
            q, k, v = self.red(y), self.green(y), self.blue(y)
        q, k, v = (t.unflatten(-1, (self.h, d // self.h)) for t in (q, k, v))  # [B, S, H, Dh]
        if self.sq_r is not None:
            q, k = self.sq_r(q), self.sq_g(k)
        if self.rope:
            q = q * table
            k = k * table
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        o = o.transpose(1, 2).flatten(2)
        x = x + gate1 * self.mix_out(o)
        y = self.flatten_b(x) * (1 + scale2) + shift2
        hdn = self.up(y)
        a, g = hdn.chunk(2, dim=-1)
        x = x + gate2 * self.down(F.silu(a) * g)
        return x


class Contraption(nn.Module):
    """A toy DiT: time embedding from a scalar, a text projection, N blocks."""

    def __init__(self, d=32, n=2, heads=2, txt_in_mod=False, **blk):
        super().__init__()
        self.d = d
        self.tick = nn.Linear(16, d)
        self.words = nn.Linear(24, d)
        self.pix = nn.Linear(8, d)
        self.stack_of = nn.ModuleList([Blender(d, heads, **blk) for _ in range(n)])
        self.txt_in_mod = txt_in_mod
        self.heads = heads

    def forward(self, pixels, words, tau, mask=None):
        freqs = torch.exp(-torch.arange(8, dtype=torch.float32) / 8.0)  # constant work every step
        t = tau[:, None] * freqs[None]
        emb = self.tick(torch.cat([t.sin(), t.cos()], dim=-1))
        if self.txt_in_mod:  # modulation that depends on the prompt too
            emb = emb + self.words(words).mean(1)
        w = self.words(words)
        x = torch.cat([w, self.pix(pixels)], dim=1)
        s = x.shape[1]
        dh = self.d // self.heads
        pos = torch.arange(s, dtype=torch.float32)[:, None] / (1 + torch.arange(dh, dtype=torch.float32))[None]
        table = torch.cos(pos)[None, :, None, :]  # [1, S, 1, Dh] positions only
        for blk in self.stack_of:
            x = blk(x, emb, table, mask)
        return x


def inputs(seed=0, b=1, s_img=16, s_txt=8, prompt_seed=None, mask=None):
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(b, s_img, 8, generator=g)
    words = torch.randn(b, s_txt, 24, generator=torch.Generator().manual_seed(prompt_seed if prompt_seed is not None else seed + 100))
    kw = dict(pixels=pixels, words=words, tau=torch.full((b,), 0.5))
    if mask is not None:
        kw["mask"] = mask
    return kw
