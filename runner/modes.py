"""The production modes a step runs in: one definition for every runner kind that times or checks a
whole step (bench, validate_step), so that "compile" means the same thing in a verdict and in a bench
table.

  eager           the step as the engine runs it
  graph           the eager step captured once into a CUDA graph and replayed
  compile         torch.compile the way a user would write it: a compile RECIPE (below) applied to
                  the model in place; "compile" alone is the regional recipe
  compile+graph   the compiled step captured into a CUDA graph

A mode string is ``compile[:RECIPE][+graph]``, e.g. ``compile:max-autotune+graph``. Recipes:
  regional        torch.compile of each repeated block (diffusers' compile_repeated_blocks, the way
                  diffusers recommends for DiTs; whole model when the class declares no blocks)
  whole           torch.compile of the whole model
  max-autotune    regional, mode="max-autotune-no-cudagraphs" (GEMM and Triton autotuning; CUDA
                  graphs are the +graph suffix's job, not inductor's: ours capture the whole step)

Modes run in the order given on ONE built model. Compiling changes the model in place, so a recipe
switch first undoes the last one (uncompile) and resets dynamo.
"""
from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Callable

import torch

from runner.job import parse_mode  # the mode grammar lives with the job schema: the bot parses modes too
from runner.timing import capture_graph

_BREAKS: list[str] = []  # dynamo's graph-break records since the last recipe was applied
_WATCHED = [True]  # whether they are recorded: not where the user's TORCH_LOGS leaves graph_breaks out


class _BreakLog(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _BREAKS.append(record.getMessage())


def _watch_breaks() -> None:
    """Count dynamo's graphs and record its graph breaks (where, why) from here on: a break splits the
    compiled step, and inductor fuses nothing across one (a quantization left as its own kernel next
    to its producer, 2026-12-06). Dynamo's own `graph_breaks` log records, kept here, not printed."""
    import torch._dynamo.convert_frame  # noqa: F401  (the modules whose artifact loggers report breaks)
    import torch._dynamo.symbolic_convert  # noqa: F401
    from torch._dynamo.utils import counters

    counters.clear()
    _BREAKS.clear()
    user = os.environ.get("TORCH_LOGS", "")  # set_logs would replace what the user asked for
    if not user:
        torch._logging.set_logs(graph_breaks=True)
    _WATCHED[0] = not user or "graph_breaks" in user
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch._dynamo.") and n.endswith("__graph_breaks")]:
        lg = logging.getLogger(name)
        lg.propagate = bool(user)  # ours: kept here, not printed; the user's: printed as asked too
        if not any(isinstance(h, _BreakLog) for h in lg.handlers):
            lg.addHandler(_BreakLog())


def compile_report(top: int = 8) -> dict:
    """What dynamo made of the model since the recipe was applied: graphs compiled, graph breaks (None:
    not recorded, the user's TORCH_LOGS leaves them out), and the most frequent break sites (`at`
    file:line of the user code, `why` dynamo's explanation)."""
    from torch._dynamo.utils import counters

    sites: Counter = Counter()
    for msg in _BREAKS:
        lines = [ln.strip() for ln in msg.splitlines()]
        at = lines[0].removeprefix("Graph break in user code at ") if lines else "?"
        why = next((ln.removeprefix("Explanation: ") for ln in lines if ln.startswith("Explanation:")),
                   next((ln for ln in lines[1:] if ln), ""))
        sites[("/".join(at.split("/")[-3:]), why[:240])] += 1
    return {"graphs": int(counters["stats"].get("unique_graphs", 0)), "breaks": sum(sites.values()) if _WATCHED[0] else None,
            "top": [{"at": a, "why": w, "count": n} for (a, w), n in sites.most_common(top)] if _WATCHED[0] else []}


def compile_model(model: torch.nn.Module, recipe: str = "regional", backend: str = "inductor") -> str:
    """Apply a compile recipe to `model` in place; returns how it was compiled, for the report."""
    _watch_breaks()
    kw: dict = {"backend": backend}
    if recipe == "max-autotune" and backend == "inductor":
        kw["mode"] = "max-autotune-no-cudagraphs"
    regional = recipe in ("regional", "max-autotune")
    if regional and hasattr(model, "compile_repeated_blocks") and getattr(model, "_repeated_blocks", None):
        model.compile_repeated_blocks(fullgraph=False, **kw)
        how = "regional (compile_repeated_blocks)"
    else:
        model.compile(**kw)
        how = "whole model"
    return how + (f", {kw['mode']}" if "mode" in kw else "") + ("" if backend == "inductor" else f", backend {backend}")


def uncompile(model: torch.nn.Module) -> None:
    """Undo compile_model: every module back to its eager call, dynamo's caches dropped."""
    for m in model.modules():
        if getattr(m, "_compiled_call_impl", None) is not None:
            m._compiled_call_impl = None
    torch._dynamo.reset()


class ModeWalk:
    """Hands out the step's callable per mode, in order, on one model: compiles when a mode needs a
    recipe the model does not have yet, captures a CUDA graph for +graph modes."""

    def __init__(self, model: torch.nn.Module, step: Callable[[], object], device: str, warmup: int,
                 backend: str = "inductor"):
        self.model, self.step, self.device, self.warmup, self.backend = model, step, device, warmup, backend
        self.recipe: str | None = None  # the recipe the model is compiled with now
        self.how = ""

    def callable(self, mode: str) -> Callable[[], object]:
        recipe, graph = parse_mode(mode)
        if recipe != self.recipe:
            if self.recipe is not None:
                uncompile(self.model)
                self.how = ""
            if recipe is not None:
                self.how = compile_model(self.model, recipe, self.backend)
            self.recipe = recipe
        if not graph:
            return self.step
        if not self.device.startswith("cuda"):
            raise RuntimeError("CUDA-graph mode needs a CUDA device")
        return capture_graph(self.step, warmup=self.warmup)


def cuda_usable(device: str) -> bool:
    """Whether the CUDA context survived the last error (a fault is sticky: every later call fails)."""
    if not device.startswith("cuda"):
        return True
    try:
        torch.cuda.synchronize()
        torch.empty(1, device=device).add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False
