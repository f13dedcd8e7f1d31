"""One side (base or candidate) of a validation, in its own process.

The process builds the model from its own engine worktree and never sees the other side's outputs:
a candidate cannot read the reference from memory, because the reference was never in its process.

job.params (all optional):
  correctness  bool (default true): run every (shape, seed) of the job, in order, in this process:
               poison the allocator, clone the inputs, run the step under PoisonEmpty, synchronize
               the whole device, check the inputs are unmodified, save the outputs (.pt). Several
               seeds in one process make a candidate that caches results across calls fail.
  profile      bool: profile one step (first shape, first seed) and return its kernel/op histogram
               (engagement check).
  timing       {"modes": [...], "save_outputs": bool, "compile_backend": str}: time the step
               (first shape, first seed) in each production mode (runner/modes.py: eager, graph,
               compile, compile+graph), in that order on one model, with
               runner/timing.time_interleaved, job.warmup / job.iters. save_outputs: each mode
               saves that step's outputs (mode_outputs), for the bot to compare with the base's
               outputs in the same mode (eager's after the correctness runs saw every shape). A mode that fails is its error string; after a
               CUDA fault the later modes are "not run" (the context is gone) and the job still
               returns what ran.
  flops        bool: count the step's FLOPs and, on CUDA, measure the matmul ceiling (roofline floor).
Result: {"ok", "runs": [...], "timing": {mode: stats | error}, "mode_outputs": {mode: file},
         "profile": {...}, "flops": {...}, "env": {...}}.
Order: correctness, profile, flops, environment, then the modes: compiling changes the model in
place and a fault in a late mode must not cost the measurements before it.
"""
from __future__ import annotations

import faulthandler
from pathlib import Path

import torch

from runner import env as envmod
from runner.channel import stage
from runner.harness import build, make_step, step_passes
from runner.poison import PoisonEmpty, poison_allocator
from runner.errors import error_line
from runner.modes import ModeWalk, compile_report, cuda_usable
from runner.timing import time_interleaved


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()  # every stream of the device: side-stream work is finished


def _tensors(passes: list[dict]) -> dict[str, torch.Tensor]:
    out = {}
    for i, kw in enumerate(passes):
        for k, v in kw.items():
            if isinstance(v, torch.Tensor):
                out[f"pass{i}.{k}"] = v
    return out


def _where(idx: torch.Tensor, shape) -> list[int]:
    return [int(i) for i in torch.unravel_index(idx, tuple(shape))]


def input_changes(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[dict]:
    """Inputs the step modified in place, with where and by how much."""
    changes = []
    for name, ref in before.items():
        cur = after[name].detach().to("cpu")
        if cur.shape != ref.shape or cur.dtype != ref.dtype:
            changes.append({"input": name, "what": f"shape/dtype changed {list(ref.shape)}/{ref.dtype} -> "
                                                  f"{list(cur.shape)}/{cur.dtype}"})
            continue
        same = (cur == ref) | (torch.isnan(cur) & torch.isnan(ref)) if cur.is_floating_point() else cur == ref
        if bool(same.all()):
            continue
        diff = (cur.double() - ref.double()).abs().nan_to_num(nan=float("inf")).flatten()
        i = int(diff.argmax())
        changes.append({"input": name, "changed": int((~same).sum()), "numel": ref.numel(),
                        "max_abs": float(diff[i]), "at": _where(torch.tensor(i), ref.shape),
                        "was": float(ref.flatten()[i]), "now": float(cur.flatten()[i])})
    return changes


def run(job) -> dict:
    faulthandler.enable()  # a segfault in candidate code leaves its Python stack in the log tail
    p = job.params or {}
    with stage("build"):
        built = build(job)
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"ok": True, "runs": [], "timing": {}, "profile": None, "flops": None}

    if p.get("correctness", True):
        with stage("correctness"):
            _correctness(built, job, out_dir, result)

    shape0, seed0 = job.shapes[0], job.seeds[0]
    if p.get("profile"):
        with stage("profile"):
            result["profile"] = _profile(built, job, shape0, seed0, out_dir)

    if p.get("flops"):
        with stage("flops"):
            result["flops"] = _flops(built, job, shape0, seed0)

    result["passes"] = step_passes(job.workload)
    result["env"] = envmod.capture(job.device, job.engine_sha, built.engine_file)
    t = p.get("timing") or {}
    if t.get("modes"):
        step, _ = make_step(built, job, shape0, seed0)
        result["timing"], result["mode_outputs"] = _time_modes(built, step, job, t, out_dir)
    return result


def _correctness(built, job, out_dir: Path, result: dict) -> None:
    for si, shape in enumerate(job.shapes):
        for seed in job.seeds:
            step, passes = make_step(built, job, shape, seed)
            tensors = _tensors(passes)
            before = {k: v.detach().to("cpu").clone() for k, v in tensors.items()}
            poisoned = poison_allocator(job.device)
            mode = PoisonEmpty()
            with mode:
                outs = step()
            _sync(job.device)
            fname = out_dir / f"out_{si}_{seed}.pt"
            cpu = {k: v.detach().to("cpu").clone() for k, v in outs.items()}
            torch.save(cpu, fname)
            result["runs"].append({
                "shape": shape, "seed": seed, "file": str(fname),
                "inputs_modified": input_changes(before, tensors),
                "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", ""),
                                "finite": bool(torch.isfinite(v).all())} for k, v in cpu.items()},
                "poison": {**poisoned, "empty_tensors_nan_filled": mode.filled},
            })
            del outs, cpu


def _profile(built, job, shape0, seed0, out_dir: Path) -> dict:
    from runner.profiler import profile_step
    from runner.module_pattern import module_pattern

    step, _ = make_step(built, job, shape0, seed0)
    step()  # warm: first-call work (JIT, lazy init) must not be the histogram
    _sync(job.device)
    prof = profile_step(built.model, step, job.device, out_dir / "trace.json.gz")
    hist: dict[tuple[str, str, str], int] = {}
    for k in prof["kernels"]:
        key = (k["name"], k.get("op", ""), module_pattern(k["module"]))
        hist[key] = hist.get(key, 0) + k["calls"]
    return {
        "histogram": [[n, o, m, c] for (n, o, m), c in sorted(hist.items())],
        "launches": prof["launches"], "busy_ms": prof["busy_ms"], "categories": prof["categories"],
    }


def _flops(built, job, shape0, seed0) -> dict:
    from runner.profiler import count_flops

    step, _ = make_step(built, job, shape0, seed0)
    fl = count_flops(step)
    fl["device"] = "cuda" if job.device.startswith("cuda") else "cpu"
    if job.device.startswith("cuda"):
        from runner import peaks

        from runner.job import split_precision
        from runner.roofline import compute_floor

        fp8 = split_precision(job.dtype)[1] == "fp8"  # FP8 linear layers: their floor is the FP8 ceiling's
        fl["peaks"] = peaks.measure(job.device, built.dtype, fp8=fp8)
        fl["compute_floor_ms"], fl["compute_floor_basis"] = compute_floor(fl, fl["peaks"], fp8=fp8)
    return fl


def _time_modes(built, step, job, t: dict, out_dir: Path) -> tuple[dict, dict]:
    timing: dict = {}
    files: dict = {}
    walk = ModeWalk(built.model, step, job.device, job.warmup, backend=t.get("compile_backend") or "inductor")
    modes = list(t["modes"])
    for i, mode in enumerate(modes):
        try:
            with stage(mode):
                fn = walk.callable(mode)
                r = time_interleaved({mode: fn}, job.device, warmup=job.warmup, iters=job.iters)[mode]
                if isinstance(r, str):
                    timing[mode] = r
                    continue
                timing[mode] = {**r.to_json(), "mode": mode,
                                **({"compiled": walk.how, "graphs": compile_report(top=1)} if walk.how else {})}
                # eager's too: a model that compiles itself (blocks compiled in __init__) runs it under graphs
                # recompiled for the later shapes of the correctness runs, which its first shape's did not see
                if t.get("save_outputs"):
                    outs = fn()  # graph modes: the static outputs the replay just rewrote
                    _sync(job.device)
                    fname = out_dir / f"mode_{mode.replace('+', '_').replace(':', '-')}.pt"
                    torch.save({k: v.detach().to("cpu").clone() for k, v in outs.items()}, fname)
                    files[mode] = str(fname)
        except Exception as e:  # noqa: BLE001 - a mode that fails is a reported result, never a crash
            timing[mode] = ("CUDA graph capture failed: " if mode.endswith("graph") else "") + error_line(e)
            if not cuda_usable(job.device):
                for later in modes[i + 1:]:
                    timing[later] = f"not run: the CUDA context was lost in {mode} ({timing[mode][:120]})"
                break
    return timing, files
