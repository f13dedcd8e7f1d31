"""Qwen-Image (QwenImageTransformer2DModel): true CFG, two passes per step."""
from __future__ import annotations

import torch

def make_passes(config: dict, shape: dict, step: dict, downsample: int, seed: int, device, dtype) -> list[dict]:
    h, w = shape["resolution"]
    gh, gw = h // downsample, w // downsample
    b, t = shape["batch"], shape["text_tokens"]
    g = torch.Generator(device="cpu").manual_seed(seed)
    latents = torch.randn(b, gh * gw, config["in_channels"], generator=g)  # [B, S_img, C_in] packed 2x2 patches
    prompt = torch.randn(b, t, config["joint_attention_dim"], generator=g)  # [B, S_txt, D_joint]
    negative = torch.randn(b, t, config["joint_attention_dim"], generator=g)
    passes = []
    for text in (prompt, negative) if step["cfg"] == "true-cfg" else (prompt,):
        kw = dict(
            hidden_states=latents.to(device, dtype),
            encoder_hidden_states=text.to(device, dtype),
            timestep=torch.full((b,), step["timestep"], device=device, dtype=dtype),
            img_shapes=[(1, gh, gw)] * b,
            return_dict=False,
        )
        if step.get("text_mask") == "all-ones":
            # What a text encoder hands over for an unpadded prompt (int64 ones, as tokenizers do).
            kw["encoder_hidden_states_mask"] = torch.ones(b, t, dtype=torch.long, device=device)
        passes.append(kw)
    return passes


def combine(outputs: list[torch.Tensor], step: dict) -> dict[str, torch.Tensor]:
    """The step's outputs are the two model passes. The true-CFG combination
    (uncond + scale * (cond - uncond), norm-rescaled) is pipeline arithmetic outside the model,
    identical for base and candidate; it amplifies the cond-uncond difference (on seeded random
    weights, 4x), so judging it would judge the pipeline's amplification, not the candidate."""
    if len(outputs) == 1:
        return {"noise_pred": outputs[0]}
    return {"cond": outputs[0], "uncond": outputs[1]}
