"""The graph job: capture the op graph of one step (runner/graph_capture.py) for `optbot analyze`.

params:
  backend_iters timed trials per SDPA backend for each SDPA signature (default 10 on GPU, 0 on CPU:
                the backends that matter are CUDA's)
  fingerprints  record each op's output fingerprint (default on CPU; off on CUDA: a host sync per op)
  probe_iters   timed trials per side when an attention call's mask masks nothing (default 10 on
                GPU, 5 on CPU; 0 skips the probes)

Result: {"ok", "graph": path of graph.json (compact), "summary": counts, "probes": [...], "env",
"capture_s"}. Each probe times the recorded attention call with its mask and without it, on the
job's device, through runner/timing.time_interleaved, and checks that both give the same output.
"""
from __future__ import annotations

import json
import time

import torch

from runner import env as envmod
from runner import inputs
from runner.graph_capture import capture, sdp_as
from runner.harness import prepare_first_step
from runner.timing import time_interleaved


def run(job) -> dict:
    built, step, shape, out_dir = prepare_first_step(job)
    step()  # warm-up: first-call caches (lru_cache'd RoPE tables, ...) are filled as in steady state
    if job.device.startswith("cuda"):
        torch.cuda.synchronize()
    roles = inputs.spec_of(job.workload).roles()
    t0 = time.perf_counter()
    # fingerprints check the CFG detector's value numbers; one host sync per op, so CPU by default
    fingerprints = bool(job.params.get("fingerprints", not job.device.startswith("cuda")))
    rec = capture(built.model, step, job.engine_root, roles, fingerprints=fingerprints)
    capture_s = time.perf_counter() - t0
    graph = rec.to_json()
    graph.update(shape=shape, device="cuda" if job.device.startswith("cuda") else "cpu", dtype=job.dtype,
                 preset=job.preset, workload=job.workload["name"], engine_sha=job.engine_sha,
                 model_class=job.model_class)
    iters = int(job.params.get("probe_iters", 10 if job.device.startswith("cuda") else 5))
    probes = [_probe(p, job.device, iters) for p in rec.probes.values()] if iters > 0 else []
    graph["probes"] = probes
    b_iters = int(job.params.get("backend_iters", 10 if job.device.startswith("cuda") else 0))
    graph["sdpa_backends"] = [dict(_backends(p, job.device, b_iters), calls=rec.sdpa_counts[sig])
                              for sig, p in rec.sdpa_calls.items()] if b_iters > 0 else []
    path = out_dir / "graph.json"
    path.write_text(json.dumps(graph, separators=(",", ":")))
    return {
        "ok": True,
        "graph": str(path),
        "summary": {"ops": len(graph["ops"]), "values": len(graph["values"]), "modules": len(graph["modules"]),
                    "passes": graph["passes"], "probes": len(probes), "sdpa_backends": len(graph["sdpa_backends"])},
        "probes": probes,
        "capture_s": round(capture_s, 3),
        "env": envmod.capture(job.device, job.engine_sha, built.engine_file),
    }


# The backends SDPA can dispatch to, by their torch.nn.attention name; MATH is left out (the
# reference, never the fast path).
SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")


def _backends(p, device: str, iters: int) -> dict:
    """One SDPA call timed as the engine runs it (its pick under the backend switches in force at its
    call, which a layer may set itself) and under each backend alone,
    at the workload's shapes on the job's device. A backend that cannot take the call says why."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def under(name):
        def fn():
            with sdpa_kernel([getattr(SDPBackend, name)]):
                return p.func(*p.args, **p.kwargs)
        return fn

    def as_called():
        with sdp_as(p.sdp):  # the backend switches in force at the engine's call
            return p.func(*p.args, **p.kwargs)

    fns = {"default": as_called}
    out = {"op_id": p.op_id, "signature": p.signature, "device": "cuda" if device.startswith("cuda") else "cpu",
           "backends": {}}
    with torch.inference_mode():
        ref = _first(fns["default"]())
        out["ref_absmax"] = float(ref.float().abs().max())
        for name in SDPA_BACKENDS:
            fn = under(name)
            try:
                got = _first(fn())
            except RuntimeError as e:  # "No available kernel": this backend cannot take the call
                out["backends"][name.lower()] = {"eligible": False, "why": str(e).splitlines()[0][:200]}
                continue
            out["backends"][name.lower()] = {"eligible": True,
                                             "max_abs_diff": float((got.float() - ref.float()).abs().max())}
            fns[name.lower()] = fn
        res = time_interleaved(fns, device, warmup=3, iters=iters)
    for k, v in res.items():
        stats = v if isinstance(v, str) else {"median_ms": round(v.median_ms, 5), "min_ms": round(v.min_ms, 5), "n": v.n}
        if k == "default":
            out["default"] = stats
        else:
            out["backends"][k]["time"] = stats
    return out


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _probe(p, device: str, iters: int) -> dict:
    """Time one attention call with its do-nothing mask and without it."""
    args, kwargs = list(p.args), dict(p.kwargs)
    if p.mask_pos[0] == "arg":
        args_wo, kwargs_wo = list(args), dict(kwargs)
        args_wo[p.mask_pos[1]] = None
    else:
        args_wo, kwargs_wo = list(args), {k: v for k, v in kwargs.items() if k != p.mask_pos[1]}
    fns = {"with_mask": lambda: p.func(*args, **kwargs), "without_mask": lambda: p.func(*args_wo, **kwargs_wo)}
    with torch.inference_mode(), sdp_as(p.sdp):
        a, b = fns["with_mask"](), fns["without_mask"]()
        a = a[0] if isinstance(a, (tuple, list)) else a
        b = b[0] if isinstance(b, (tuple, list)) else b
        max_diff = float((a.float() - b.float()).abs().max())
        res = time_interleaved(fns, device, warmup=3, iters=iters)
    out = {"op_id": p.op_id, "signature": p.signature, "max_abs_diff": max_diff,
           "device": "cuda" if device.startswith("cuda") else "cpu"}
    for k, v in res.items():
        out[k] = v if isinstance(v, str) else {"median_ms": round(v.median_ms, 5), "min_ms": round(v.min_ms, 5),
                                               "max_ms": round(v.max_ms, 5), "n": v.n}
    return out
