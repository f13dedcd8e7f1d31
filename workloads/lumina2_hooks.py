"""Inputs of the lumina2 workload that no declaration can express (docs/workloads.md, "Hooks").

A hook gets a runner.inputs.HookContext (dims, config, step, the step's seeded CPU generator,
device, model dtype, pass_index, name) and returns the input's value. It runs in the runner
child, which imports only torch and the engine.
"""
import torch


def padded_prompt_mask(ctx):
    """Gemma's tokenizer pads every prompt to `text_tokens`; the mask marks the real tokens.
    The prompt fills three quarters of the length, the negative prompt (pass 1) a quarter: a
    mask that masks something, as in serving."""
    b, t = ctx.dims["batch"], ctx.dims["text_tokens"]
    real = max(1, (3 * t) // 4 if ctx.pass_index == 0 else t // 4)
    mask = torch.zeros(b, t, dtype=torch.bool)
    mask[:, :real] = True
    return mask.to(ctx.device)
