"""FLUX.2 (Flux2Transformer2DModel): guidance-distilled, one pass per step."""
from __future__ import annotations

import torch


def image_grid(shape: dict, downsample: int) -> tuple[int, int]:
    h, w = shape["resolution"]
    return h // downsample, w // downsample


def make_passes(config: dict, shape: dict, step: dict, downsample: int, seed: int, device, dtype) -> list[dict]:
    gh, gw = image_grid(shape, downsample)
    b, t = shape["batch"], shape["text_tokens"]
    g = torch.Generator(device="cpu").manual_seed(seed)
    # Inputs are drawn on the CPU generator so they are identical on every device, then moved.
    hidden = torch.randn(b, gh * gw, config["in_channels"], generator=g)  # [B, S_img, C_in]
    text = torch.randn(b, t, config["joint_attention_dim"], generator=g)  # [B, S_txt, D_joint]
    # Position ids (t, h, w, l) as the FLUX.2 pipeline builds them: image tokens on an h x w grid,
    # text tokens along the l axis.
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(gh), torch.arange(gw), torch.arange(1))  # [S_img, 4]
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(t))  # [S_txt, 4]
    kw = dict(
        hidden_states=hidden.to(device, dtype),
        encoder_hidden_states=text.to(device, dtype),
        timestep=torch.full((b,), step["timestep"], device=device, dtype=dtype),
        img_ids=img_ids.to(device),
        txt_ids=txt_ids.to(device),
        return_dict=False,
    )
    if config.get("guidance_embeds", True):
        kw["guidance"] = torch.full((b,), step.get("guidance") or 4.0, device=device, dtype=dtype)
    return [kw]


def combine(outputs: list[torch.Tensor], step: dict) -> dict[str, torch.Tensor]:
    return {"noise_pred": outputs[0]}
