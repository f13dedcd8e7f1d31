"""Test helper, run as a child process: the tiny preset of a workload from an engine import root, one
step eager on the preset's smallest shape (or --shape H,W,TEXT_TOKENS), then the same step with the model's repeated blocks
compiled (diffusers' compile_repeated_blocks, backend aot_eager; fullgraph unless --no-fullgraph),
then once more under an emulated CUDA-graph capture (_capture_emulated).
Writes OUT.pt (eager, compiled and captured outputs) and OUT.json: the graph breaks, the optbot ops the
compiled graphs hold and the kernel module that registered each, user-Triton wrappers traced inline,
which path each optbot kernel module took, the graphs compiled anew under the emulated capture (a
recompile there) and its error, or the error that stopped the compiled step.

    PYTHONPATH=<engine_root>:<optbot root> python tests/kernel_store/compile_blocks.py WORKLOAD ENGINE_ROOT OUT [--no-fullgraph] [--shape H,W,T] [--eager-only]

--eager-only: the eager step alone (OUT.pt holds only "eager"): the base engine's reference for the
stacks' outputs.
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch._library.custom_ops import OPDEFS

from bot.workload import load_workload
from runner.harness import build, make_step
from runner.job import Job


def _op_module(target: str) -> str:
    """'optbot.swiglu.default' -> the module whose function torch.library.custom_op registered."""
    opdef = OPDEFS.get("::".join(target.split(".")[:2]))
    return opdef._init_fn.__module__ if opdef is not None else "?"


class DeviceRead(RuntimeError):
    pass


def _no_read(*_a, **_k):
    raise DeviceRead("a device read during CUDA-graph capture (capture forbids it)")


@contextmanager
def _capture_emulated():
    """What a CUDA-graph capture changes for the model's Python code, on CPU: tensors say is_cuda,
    torch.cuda.is_current_stream_capturing() says True, and reading a tensor's value on the host
    raises (on the GPU such a read makes the capture fail). Code that branches on capture (the
    store's CFG cache and mask drop) must then call the compiled blocks as the warm-up did: a
    recompile inside a real capture fails (inductor, on the H200: BackendCompilerFailed)."""
    saved = {n: getattr(torch.Tensor, n) for n in ("__bool__", "item", "tolist")}
    saved_equal, saved_capturing = torch.equal, torch.cuda.is_current_stream_capturing
    torch.Tensor.is_cuda = property(lambda self: True)  # shadows the C property on torch.Tensor only
    try:
        for n in saved:
            setattr(torch.Tensor, n, _no_read)
        torch.equal, torch.cuda.is_current_stream_capturing = _no_read, lambda: True
        yield
    finally:
        del torch.Tensor.is_cuda
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)
        torch.equal, torch.cuda.is_current_stream_capturing = saved_equal, saved_capturing


def main(workload: str, engine_root: str, out: str, fullgraph: bool, shape: list[int] | None,
         precision: str = "float32", eager_only: bool = False, fp8_form: str = "") -> None:
    if fp8_form == "torchao":
        # the weight type torchao's recipe gives on a GPU (an nn.Linear whose weight is a Float8Tensor),
        # not optbot's emulation (an Fp8Linear): a patch that tells a quantized linear apart by its
        # module type misses torchao's, which only the GPU showed (2026-12-06: the absorb-bias entry
        # took torchao's MLPs away from the GELU + quantization entry)
        from runner import quant

        def _torchao(model, recipe, device):
            return {"recipe": recipe, "implementation": quant.torchao_weights(model)}
        quant.apply = _torchao
    wl = load_workload(workload)
    pre = wl.preset("tiny")
    s = min([pre.shapes, *pre.extra_shapes], key=lambda s: s.resolution[0] * s.resolution[1] + s.text_tokens)
    s = {"resolution": list(s.resolution), "text_tokens": s.text_tokens, "batch": s.batch}
    if shape:
        s.update(resolution=shape[:2], text_tokens=shape[2])
    job = Job(kind="step", workload=wl.to_json(), preset="tiny", device="cpu", dtype=precision,
              engine_root=engine_root, engine_sha="", model_class=wl.engine(None).model_class, shapes=[s])
    t0 = time.monotonic()
    built = build(job)
    step, _ = make_step(built, job, job.shapes[0], seed=0)
    eager = step()
    t1 = time.monotonic()
    if eager_only:
        torch.save({"eager": eager}, out + ".pt")
        Path(out + ".json").write_text(json.dumps({"shape": job.shapes[0], "seconds": {"build+eager": round(t1 - t0, 1)}}))
        return

    targets: set[str] = set()
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):  # what dynamo put in each graph, then aot_eager runs it
        targets.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    counters.clear()
    for m in sys.modules.values():  # the compiled step must set the paths itself
        if getattr(m, "__name__", "").startswith("diffusers.models.optbot_kernels.") and hasattr(m, "_last_path"):
            m._last_path = ""
    built.model.compile_repeated_blocks(fullgraph=fullgraph, backend=backend)
    res: dict = {"blocks": sorted(built.model._repeated_blocks), "shape": job.shapes[0], "error": None}
    try:
        compiled = step()
        saved = {"eager": eager, "compiled": compiled}
        graphs = counters["stats"]["unique_graphs"]
        try:  # the compiled step again, as a CUDA-graph capture after that warm-up would run it
            with _capture_emulated():
                saved["captured"] = step()
        except Exception as e:  # noqa: BLE001 - the error is the result
            res["capture_error"] = f"{type(e).__name__}: {str(e)[:3000]}"
        res["capture_new_graphs"] = counters["stats"]["unique_graphs"] - graphs
        torch.save(saved, out + ".pt")
    except Exception as e:  # noqa: BLE001 - the error is the result (a graph break under fullgraph)
        res["error"] = f"{type(e).__name__}: {str(e)[:3000]}"
    res["seconds"] = {"build+eager": round(t1 - t0, 1), "compiled": round(time.monotonic() - t1, 1)}
    res["graph_breaks"] = sum(counters["graph_break"].values())
    res["break_reasons"] = sorted({r.splitlines()[0] for r in counters["graph_break"]})
    res["unique_graphs"] = counters["stats"]["unique_graphs"]
    res["optbot_ops"] = {t: _op_module(t) for t in sorted(targets) if t.startswith("optbot.")}
    res["user_triton"] = sorted(t for t in targets if "triton_kernel_wrapper" in t)
    res["kernel_paths"] = {name: mod.last_path() for name, mod in sys.modules.items()
                           if name.startswith("diffusers.models.optbot_kernels.") and hasattr(mod, "last_path")}
    Path(out + ".json").write_text(json.dumps(res))


if __name__ == "__main__":
    opts = sys.argv[4:]
    main(*sys.argv[1:4], fullgraph="--no-fullgraph" not in opts,
         shape=[int(v) for v in opts[opts.index("--shape") + 1].split(",")] if "--shape" in opts else None,
         precision=opts[opts.index("--precision") + 1] if "--precision" in opts else "float32",
         eager_only="--eager-only" in opts,
         fp8_form=opts[opts.index("--fp8-form") + 1] if "--fp8-form" in opts else "")
