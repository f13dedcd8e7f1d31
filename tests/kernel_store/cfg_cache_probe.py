"""Test helper, run as a child process with a patched Qwen-Image engine first on PYTHONPATH: counts
the blocks' modulation linears over passes, to show the CFG modulation cache hits and misses when
it should.  PYTHONPATH=<engine_root>:<optbot root> python tests/kernel_store/cfg_cache_probe.py ENGINE_ROOT"""
from __future__ import annotations

import json
import sys

import torch

from bot.workload import load_workload
from runner.harness import build, make_step
from runner.job import Job


def main(engine_root: str) -> None:
    wl = load_workload("qwen-image")
    s = wl.preset("tiny").shapes
    job = Job(kind="step", workload=wl.to_json(), preset="tiny", device="cpu", dtype="float32", engine_root=engine_root,
              engine_sha="", model_class=wl.engine(None).model_class,
              shapes=[{"resolution": list(s.resolution), "text_tokens": s.text_tokens, "batch": s.batch}])
    built = build(job)
    model = built.model
    calls = {"n": 0}
    blocks = model.transformer_blocks
    # the runner's load hook merged every block's modulation linear into one (the tiny model's fit one run)
    one_run = len(model._optbot_mod_linears) == 1
    # merged again with runs of at most 3 block linears' bytes (a quantizer's peak at full size): the blocks'
    # linears, views of the first merge, merge again into views of the new runs, whole linears per run
    part = blocks[0].img_mod[1].weight
    model._optbot_mod_chunk_bytes = 3 * part.numel() * part.element_size()
    model.optbot_after_load_modulation()
    merged = model._optbot_mod_linears
    runs = [lin.out_features // part.shape[0] for lin in merged]
    merged[0].register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    storages = {lin.weight.untyped_storage().data_ptr() for lin in merged}
    views = all(m[1].weight.untyped_storage().data_ptr() in storages for b in blocks for m in (b.img_mod, b.txt_mod))
    temb = torch.randn(2, merged[0].in_features, generator=torch.Generator().manual_seed(1))

    def model_mods_vs_blocks(same) -> bool:  # the model's modulation of temb against each block's own
        with torch.inference_mode():
            got, want = model._optbot_mods(temb, model._optbot_merged_mod_linears()), [b.mod_params(temb) for b in blocks]
        return all(same(g, w) for gw, ww in zip(got, want) for g, w in zip(gw, ww))

    mods_match = True
    for zero_cond_t in (False, True):  # Qwen-Image-Edit's zero_cond_t: the text stream takes temb's first half
        for b in blocks:
            b.zero_cond_t = zero_cond_t
        mods_match &= model_mods_vs_blocks(lambda g, w: torch.allclose(g, w, rtol=1e-5, atol=1e-6)
                                           and g.shape == w.shape and g.is_contiguous())
    for b in blocks:
        b.zero_cond_t = model.zero_cond_t
    # a block's linear replaced after the merge (a LoRA wrapper, a swapped module): every block computes its own
    old = blocks[1].txt_mod[1]
    blocks[1].txt_mod[1] = torch.nn.Linear(old.in_features, old.out_features)
    replaced_ok = model_mods_vs_blocks(torch.equal)
    blocks[1].txt_mod[1] = old
    calls["n"] = 0
    _, passes = make_step(built, job, job.shapes[0], seed=0)
    counts, outs = [], []
    with torch.inference_mode():
        for kw in (passes[0], passes[1]):  # cond, uncond: same timestep
            outs.append(built.model(**kw)[0])
            counts.append(calls["n"])
        other = dict(passes[0], timestep=passes[0]["timestep"] * 0.5)  # another step's timestep
        out_t = built.model(**other)[0]
        counts.append(calls["n"])
        built.model._optbot_mod_cache = None  # uncached reference for the changed timestep
        ref_t = built.model(**other)[0]
    print(json.dumps({"blocks": len(blocks), "one_run": one_run, "runs": runs, "counts": counts, "views": views,
                      "mods_match": mods_match, "replaced_ok": replaced_ok,
                      "changed_t_equal": bool(torch.equal(out_t, ref_t)), "cond_ne_uncond": not torch.equal(*outs)}))


if __name__ == "__main__":
    main(sys.argv[1])
