"""Engine adapters: how the runner builds and calls one engine's model.

An engine is mostly configuration (a repository, an import root, a model class); the adapter is the
small part that differs between engines (DESIGN: "a small adapter in runner/ only where the engine
needs its own set-up"). Each adapter is a module here with three functions (and one optional):

  prepare(job)                          once per process, before the engine is imported: global
                                        state the engine needs, import-time stand-ins
  build_model(cls, job, preset, dtype)  -> nn.Module with the seeded (or real) weights, on job.device
  make_calls(model, passes, job)        -> one zero-argument callable per pass of a step, each
                                        running ONE forward pass on that pass's workload inputs
                                        (runner/inputs.py) and returning its output tensor; all of a
                                        step's passes at once, as an engine's pipeline prepares them
                                        (what the passes share, they share in the engine's call too)
  quantize(model, recipe, job)          optional: the engine deploys a quantized precision its own way
                                        (SGLang: its ModelOpt FP8) instead of runner/quant.py's recipe;
                                        returns the environment block's note

The workload's declared inputs stay the single source of the seeded inputs, in the base (diffusers) calling
convention, so every engine gets the same latents and prompts and their outputs can be compared;
an adapter translates those kwargs to its engine's forward signature.

Which adapter a job uses: ``job.params["adapter"]`` if set, else the ``adapter`` of the workload's
engine whose model_class is the job's, else "plain".
"""
from __future__ import annotations

import importlib

ADAPTERS = ("plain", "sglang")


def adapter_name(job) -> str:
    name = (job.params or {}).get("adapter")
    if name:
        return name
    for spec in (job.workload.get("engines") or {}).values():
        if spec.get("model_class") == job.model_class:
            return spec.get("adapter") or "plain"
    return "plain"


def get(name: str):
    if name not in ADAPTERS:
        raise KeyError(f"unknown engine adapter {name!r}; known: {list(ADAPTERS)}")
    return importlib.import_module(f"runner.engines.{name}")


def for_job(job):
    return get(adapter_name(job))
