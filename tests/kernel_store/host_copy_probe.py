"""Test helper, run as a child process with a Qwen-Image engine first on PYTHONPATH: which ops of a
tiny-preset step would copy host data to the device, or wait for the device, on a GPU.

    PYTHONPATH=<engine_root>:<optbot root> python tests/kernel_store/host_copy_probe.py ENGINE_ROOT OUT

There is no GPU here, so each CUDA event is recognized by the op it dispatches on CPU:

- host data made into a tensor (torch.tensor / torch.as_tensor of a Python list or number): the
  factory builds the tensor on the CPU, moves it to the target device with .to, then calls
  aten::lift_fresh; the first two steps run with all modes disabled (torch/csrc/utils/tensor_new.h,
  NOTE [torch.tensor, lift_fresh, and device movement]), so a dispatch mode sees only the
  lift_fresh. Every lift_fresh is one tensor from host data: with a CUDA device, one pageable
  host-to-device copy, which CUDA graph capture refuses ("Cannot copy between CPU and CUDA tensors
  during CUDA graph capture unless the CPU tensor is pinned");
- a host sync (item(), bool()/int() of a tensor, tolist(), torch.equal, an op whose output size
  depends on the data): aten::_local_scalar_dense / aten::item / aten::is_nonzero, aten::equal,
  aten::nonzero, ... (SYNC_OPS), and Tensor.tolist (which dispatches nothing: wrapped); on CUDA each
  is a device-to-host read, which capture refuses ("operation not permitted when stream is capturing");
- a CPU tensor moved to the device (`.to(device)` of a tensor cached on a module, not a buffer):
  on CPU the model's device *is* the host, so `.to` returns the tensor itself and dispatches
  nothing. The probe therefore also runs the model on the meta device, which plays the GPU: the
  model's parameters and buffers move there (as `.to("cuda")` moves them), plain tensor attributes
  stay on the CPU (as they do on a GPU), and a copy from CPU to meta is a dispatched
  aten::_to_copy / aten::copy_ (the meta factory path skips lift_fresh: that is the CPU run's part).

Each run calls the step twice (a step is the two CFG passes) and records the first (cold: caches
fill) and the second (warm: what a CUDA graph would capture) separately; then the same under
torch.compile(backend="aot_eager") on meta, three calls (the second recompiles when a cache changed);
and torch._dynamo.explain on CPU (graph breaks). Outputs of both CPU steps are saved.
Writes OUT.json (the findings) and OUT.pt (the outputs)."""
from __future__ import annotations

import json
import sys
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from runner.harness import build, make_step
from tests.kernel_store.run_tiny import tiny_cpu_job

LIFT = "lift_fresh"
# ops that return host values computed on the device, or whose output size depends on device data.
# Under inference_mode (the harness's step) the composite ops reach a dispatch mode undecomposed:
# item() and int()/float() of a tensor arrive as aten::item, bool() as aten::is_nonzero; outside it
# all three arrive as aten::_local_scalar_dense.
SYNC_OPS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select", "_unique2",
            "unique_dim", "unique_consecutive", "_assert_async"}
COPY_OPS = {"_to_copy", "copy_", "to", "_copy_from", "_copy_from_and_resize"}


def _where() -> str:
    """The innermost engine frame (file:line function) of the op being dispatched."""
    for f in reversed(traceback.extract_stack()[:-2]):
        if "/diffusers/" in f.filename:
            return f"{f.filename.split('/diffusers/')[-1]}:{f.lineno} {f.name}"
    return "(no engine frame: a compiled graph's op)"


class HostDataMode(TorchDispatchMode):
    """Records each op that, with the model on a GPU, would move host data to it or sync with it.
    Tensor.tolist() reads the data without dispatching an op, so it is wrapped while the mode is on."""

    def __init__(self):
        super().__init__()
        self.found: list[dict] = []
        self._tolist = None

    def __enter__(self):
        orig = self._tolist = torch.Tensor.tolist
        self._own_tolist = "tolist" in vars(torch.Tensor)

        def tolist(t):
            self.found.append({"what": "host-sync", "op": "Tensor.tolist", "at": _where(),
                               "tensors": [f"{list(t.shape)} {str(t.dtype).replace('torch.', '')} {t.device.type}"]})
            return orig(t)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        if self._own_tolist:
            torch.Tensor.tolist = self._tolist
        else:  # inherited from TensorBase: remove the wrapper, do not shadow it
            del torch.Tensor.tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        what = None
        if name == LIFT:
            what = "tensor-from-host-data"
        elif name in SYNC_OPS:
            what = "host-sync"
        elif name in COPY_OPS:
            devs = {a.device.type for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)}
            if kwargs.get("device") is not None:
                devs.add(torch.device(kwargs["device"]).type)
            if "cpu" in devs and len(devs) > 1:
                what = "copy-from-host"
        if what:
            tensors = [f"{list(a.shape)} {str(a.dtype).replace('torch.', '')} {a.device.type}"
                       for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)]
            self.found.append({"what": what, "op": str(func), "at": _where(), "tensors": tensors})
        return func(*args, **kwargs)


def _on(kw: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def _steps(model, passes, n: int) -> tuple[list[list[dict]], list[list[torch.Tensor]]]:
    found, outs = [], []
    with torch.inference_mode():
        for _ in range(n):
            with HostDataMode() as m:
                outs.append([model(**kw)[0].clone() for kw in passes])
            found.append(m.found)
    return found, outs


def _compiled_steps(model, passes, n: int) -> dict:
    """The steps under torch.compile(backend=aot_eager). Dynamo does not compile a frame while a
    dispatch mode is active, so the mode is entered inside the compiled graphs' callable instead:
    it sees the aten ops the graphs run (a tensor the graph was traced with, e.g. a module's CPU
    attribute, is the graph's input; its copy to the device is the graph's op)."""
    from torch._dynamo.backends.debugging import aot_eager

    calls: list[list[dict]] = []

    def backend(gm, example_inputs):
        fn = aot_eager(gm, example_inputs)

        def run(*args):
            with HostDataMode() as m:
                out = fn(*args)
            calls[-1].extend(m.found)
            return out

        return run

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.inference_mode():
        for _ in range(n):
            calls.append([])
            for kw in passes:
                compiled(**kw)
    return {"cold": calls[0], "warm": [f for c in calls[1:] for f in c]}


def _explain(model, kw: dict) -> tuple[list[dict], list[bool]]:
    """torch._dynamo.explain of two forwards on CPU (graphs, graph breaks and their reasons; the second
    sees what the first cached), then torch.compile(backend="aot_eager"): each of three calls == eager."""
    found = []
    torch._dynamo.reset()
    with torch.inference_mode():
        for _ in range(2):
            e = torch._dynamo.explain(model)(**kw)
            found.append({"graphs": e.graph_count, "breaks": e.graph_break_count,
                          "reasons": [r.reason.splitlines()[0] for r in e.break_reasons]})
        torch._dynamo.reset()
        ref = model(**kw)[0]
        compiled = torch.compile(model, backend="aot_eager")
        equal = [bool(torch.equal(compiled(**kw)[0], ref)) for _ in range(3)]
    return found, equal


def main(engine_root: str, out: str) -> None:
    job = tiny_cpu_job("qwen-image", engine_root)
    built = build(job)
    res: dict = {"engine_file": built.engine_file}
    outputs = {}
    for si, shape in enumerate(job.shapes):  # one model, both shapes: a second shape is a new cache entry
        _, passes = make_step(built, job, shape, seed=si)
        found, outs = _steps(built.model, passes, 2)
        res[f"cpu.{si}"] = {"cold": found[0], "warm": found[1]}
        for call, o in enumerate(outs):
            for p, t in enumerate(o):
                outputs[f"{si}.call{call}.pass{p}"] = t
    _, passes = make_step(built, job, job.shapes[0], seed=0)
    # With a text mask (the workload passes none, as the pipelines drop an all-ones one; a batch of padded
    # prompts passes one): the path through compute_text_seq_len_from_mask
    masked = [dict(kw, encoder_hidden_states_mask=torch.ones(kw["encoder_hidden_states"].shape[:2], dtype=torch.int64))
              for kw in passes]
    found, _ = _steps(built.model, masked, 2)
    res["cpu.masked"] = {"cold": found[0], "warm": found[1]}
    passes = [_on(kw, "meta") for kw in passes]
    # a fresh model for each meta run: caches filled by one run must not make the other's cold call warm.
    # A meta run fails where the step reads device data (item() has no value on meta): recorded, not raised,
    # so a probe of a stack with such an entry still reports its CPU runs.
    try:
        found, _ = _steps(build(job).model.to("meta"), passes, 2)
        res["meta"] = {"cold": found[0], "warm": found[1]}
    except Exception as e:  # noqa: BLE001
        res["meta"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    # Without a text mask (as the workload runs): dynamo (torch 2.13) fails to trace upstream's
    # torch.as_tensor(int, device="meta") (a real meta tensor among fake ones), which the mask path runs.
    try:
        res["meta.compiled"] = _compiled_steps(build(job).model.to("meta"), passes, 3)
    except Exception as e:  # noqa: BLE001
        res["meta.compiled"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    res["explain"], res["aot_eager_equal"] = _explain(build(job).model, make_step(built, job, job.shapes[0], seed=0)[1][0])
    torch.save(outputs, out + ".pt")
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
