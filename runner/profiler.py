"""Profile one step: where the time goes, kernel by kernel, attributed to the module that launched it.

How attribution works: forward pre/post hooks on every submodule (none inside a module that runs
compiled: ``attach_module_ranges``) open and close a profiler range
named ``optbot.module::<path>|<Class>``. torch.profiler's chrome trace then has, on the launching
CPU thread, properly nested intervals: module ranges and aten ops. Each GPU kernel carries a
correlation id linking it to the runtime launch call on that thread; the innermost module range and
innermost aten op around the launch are the kernel's module and op. On CPU there are no kernels:
each aten op's *self* time (its duration minus its child ops) is the unit of work instead.

Roofline: FLOPs of linear and attention ops come from torch.utils.flop_counter on one extra step;
bytes of memory-bound ops are estimated from the recorded input shapes (inputs read once, output
the size of the largest input written once). Peaks are measured in the same job (runner/peaks.py).
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch
import torch.utils._python_dispatch

from runner.categorize import CATEGORIES, MEMORY_BOUND, categorize

MOD_PREFIX = "optbot.module::"
STEP_RANGE = "optbot.step"
_DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
                "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2, "c10::Float8_e4m3fn": 1}


def _compiled_in_place(mod: torch.nn.Module) -> bool:
    """Set up by nn.Module.compile(), whether or not dynamo has compiled it yet."""
    return getattr(mod, "_compiled_call_impl", None) is not None


def _ran_compiled(mod: torch.nn.Module) -> bool:
    """Has dynamo compiled code for this module's forward (in this process)? A module set up for
    compile whose code was never compiled (dynamo skipped it) runs eager and is profiled as eager."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        return False
    fwd = getattr(type(mod).forward, "__code__", None)
    return fwd is not None and len(_debug_get_cache_entry_list(fwd)) > 0


def attach_module_ranges(model: torch.nn.Module) -> list:
    """Ranges on every submodule, except those inside a module that runs compiled (compiled in place
    with ``nn.Module.compile()``, and compiled by dynamo by now: the step was run before). Hooks there
    would be traced into its graph (each a graph break, and a recompile since hooks are new), so the
    profile would be of a broken-up graph instead of the compiled one the step runs; that region is
    attributed as a whole to the compiled module. Hooks dynamo would see are kept out of it
    (torch.compiler.disable): those of a compiled module itself (called inside its compiled wrapper)
    and those inside one that dynamo never compiled (profiled as eager, so exactly as the base is)."""
    handles = []
    compiled = {p: _ran_compiled(m) for p, m in model.named_modules() if _compiled_in_place(m)}

    def owner(path: str) -> str | None:  # the compiled module whose strict descendant `path` is
        return next((c for c in compiled if path != c and (not c or path.startswith(c + "."))), None)

    for path, mod in model.named_modules():
        outer = owner(path)
        if not path or (outer is not None and compiled[outer]):
            continue
        label = f"{MOD_PREFIX}{path}|{type(mod).__name__}"

        def pre(m, args, _label=label):
            m._optbot_rf = getattr(m, "_optbot_rf", [])
            m._optbot_rf.append(torch.ops.profiler._record_function_enter_new(_label, None))

        def post(m, args, out):
            stack = getattr(m, "_optbot_rf", None)
            if stack:
                torch.ops.profiler._record_function_exit._RecordFunction(stack.pop())

        if path in compiled or outer is not None:
            pre, post = torch.compiler.disable(pre), torch.compiler.disable(post)
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    return handles


def _walk(events: list[dict], queries: dict[int, list[tuple[float, int]]]):
    """Sweep nested intervals per thread; for each (ts, qid) query give the innermost op and module."""
    by_tid: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        by_tid[e["tid"]].append(e)
    answers: dict[int, tuple[dict | None, dict | None]] = {}
    for tid, evs in by_tid.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        qs = sorted(queries.get(tid, []))
        items = [(e["ts"], 0, i) for i, e in enumerate(evs)] + [(ts, 1, qid) for ts, qid in qs]
        items.sort(key=lambda x: (x[0], x[1]))
        stack: list[dict] = []
        for ts, is_q, idx in items:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < ts:
                stack.pop()
            if is_q:
                op = next((e for e in reversed(stack) if e["cat"] == "cpu_op"), None)
                mod = next((e for e in reversed(stack) if e["name"].startswith(MOD_PREFIX)), None)
                answers[idx] = (op, mod)
            else:
                stack.append(evs[idx])
    return answers


def _op_bytes(op: dict | None) -> int:
    if not op:
        return 0
    args = op.get("args", {})
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    sizes = []
    for d, t in zip(dims, types):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            n = 1
            for x in d:
                n *= x
            sizes.append(n * _DTYPE_BYTES.get(t, 4))
    return sum(sizes) + (max(sizes) if sizes else 0)


def _split_module(mod_ev: dict | None) -> tuple[str, str]:
    if not mod_ev:
        return "", ""
    path, _, cls = mod_ev["name"][len(MOD_PREFIX):].partition("|")
    return path, cls


def parse_trace(trace: dict, device_kind: str) -> dict:
    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    host = [e for e in evs if e.get("cat") in ("cpu_op", "user_annotation")]
    step = [e for e in host if e["name"] == STEP_RANGE]
    step_ev = max(step, key=lambda e: e["dur"]) if step else None
    records = []  # one per kernel (GPU) or per op with self time (CPU)
    if device_kind == "cuda":
        launches = {e["args"]["correlation"]: e for e in evs
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
        kernels = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        queries: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for i, k in enumerate(kernels):
            ln = launches.get(k.get("args", {}).get("correlation"))
            if ln is not None:
                queries[ln["tid"]].append((ln["ts"], i))
        ans = _walk(host, queries)
        for i, k in enumerate(kernels):
            op, mod = ans.get(i, (None, None))
            path, cls = _split_module(mod)
            records.append(dict(name=k["name"], op=op["name"] if op else "", module=path, module_class=cls,
                                ts=k["ts"], dur_us=k["dur"], bytes=_op_bytes(op)))
    else:
        # interpreted Triton launches (runner/triton_interpret.py) count as ops of their own
        ops = [e for e in host if e["cat"] == "cpu_op" or e["name"].startswith("triton::")]
        # self time = duration minus direct child ops (nested on the same thread)
        child_time: dict[int, float] = defaultdict(float)
        by_tid: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(ops):
            by_tid[e["tid"]].append(i)
        for tid, idxs in by_tid.items():
            idxs.sort(key=lambda i: (ops[i]["ts"], -ops[i]["dur"]))
            stack: list[int] = []
            for i in idxs:
                e = ops[i]
                while stack and ops[stack[-1]]["ts"] + ops[stack[-1]]["dur"] <= e["ts"]:
                    stack.pop()
                if stack:
                    child_time[stack[-1]] += e["dur"]
                stack.append(i)
        queries = defaultdict(list)
        for i, e in enumerate(ops):
            queries[e["tid"]].append((e["ts"] + 1e-3, i))  # just inside the op itself
        ans = _walk(host, queries)
        for i, e in enumerate(ops):
            self_us = e["dur"] - child_time[i]
            if self_us <= 0:
                continue
            _, mod = ans.get(i, (None, None))
            path, cls = _split_module(mod)
            records.append(dict(name=e["name"], op=e["name"], module=path, module_class=cls, ts=e["ts"],
                                dur_us=self_us, bytes=_op_bytes(e) if not child_time[i] else 0))
    if step_ev is not None and device_kind != "cuda":
        lo, hi = step_ev["ts"], step_ev["ts"] + step_ev["dur"]
        records = [r for r in records if lo <= r["ts"] <= hi]
    for r in records:
        r["category"] = categorize(r["name"], r["op"], r["module_class"])
    return _summarize(records, device_kind, step_ev)


def _summarize(records: list[dict], device_kind: str, step_ev: dict | None) -> dict:
    cats = {c: 0.0 for c in CATEGORIES}
    cat_bytes = {c: 0 for c in MEMORY_BOUND}
    groups: dict[tuple[str, str], dict] = {}
    for r in records:
        ms = r["dur_us"] / 1e3
        cats[r["category"]] += ms
        if r["category"] in MEMORY_BOUND:
            cat_bytes[r["category"]] += r["bytes"]
        g = groups.setdefault((r["name"], r["module"]), dict(name=r["name"], category=r["category"], op=r["op"],
                                                               module=r["module"], module_class=r["module_class"],
                                                               calls=0, ms=0.0, bytes=0))
        g["calls"] += 1
        g["ms"] += ms
        g["bytes"] += r["bytes"]
    kernels = sorted(groups.values(), key=lambda g: -g["ms"])
    for g in kernels:
        g["ms"] = round(g["ms"], 5)
    busy_ms = sum(cats.values())
    if device_kind == "cuda" and records:
        intervals = sorted((r["ts"], r["ts"] + r["dur_us"]) for r in records)
        span_us = intervals[-1][1] - intervals[0][0]
        union = 0.0
        cur_s, cur_e = intervals[0]
        for s, e in intervals[1:]:
            if s > cur_e:
                union += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        union += cur_e - cur_s
        span_ms, busy_ms, idle_ms = span_us / 1e3, union / 1e3, (span_us - union) / 1e3
    else:
        span_ms = step_ev["dur"] / 1e3 if step_ev else busy_ms
        idle_ms = None  # host ops run back to back; "idle" between device kernels has no CPU meaning
    return dict(profiled_span_ms=round(span_ms, 4), busy_ms=round(busy_ms, 4),
                profiled_idle_ms=None if idle_ms is None else round(idle_ms, 4),
                launches=len(records), categories={k: round(v, 4) for k, v in cats.items()},
                memory_bytes=cat_bytes, kernels=kernels)


class _FlopCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts matmul and attention FLOPs from the shapes of the aten ops that run.

    Our own counter rather than torch.utils.flop_counter, which has no formula for some attention
    kernels (e.g. the CPU flash kernel) and would report attention as 0 there.
    """

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Compile-transparent, as runner.poison.PoisonEmpty: under a mode that is not, dynamo marks
        # a compiled block's code "skip" for the rest of the process, and every step after the
        # count ran eager (likely why the H200 candidate process that counted FLOPs timed at the
        # base's speed). The compiled code's matmuls and attention still dispatch (extern/fallback
        # ops), so they are counted.
        return True

    def __init__(self):
        super().__init__()
        self.linear = 0
        self.attention = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        base = name.split(".")[0]
        if getattr(func, "namespace", "aten") not in ("aten", "prims") and not _is_attention(base):
            return self._inside(func, args, kwargs)
        if base == "linear":  # seen whole (not decomposed) under inference_mode
            x, w = args[0], args[1]  # [..., K], [N, K]
            self.linear += 2 * (x.numel() // x.shape[-1]) * w.shape[1] * w.shape[0]
        elif base in ("mm", "addmm", "_addmm_activation", "_scaled_mm"):  # _addmm_activation: GEMM + GELU/ReLU epilogue
            a, b = (args[0], args[1]) if base not in ("addmm", "_addmm_activation") else (args[1], args[2])
            self.linear += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        elif base in ("bmm", "baddbmm"):
            a, b = (args[0], args[1]) if base == "bmm" else (args[1], args[2])
            self.linear += 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
        elif base == "matmul":  # reaches the mode whole inside a custom op's kernel (below autograd)
            out = func(*args, **kwargs)
            self.linear += 2 * out.numel() * args[0].shape[-1]
            return out
        elif _is_attention(base):
            q, k = args[0], args[1]  # [B, H, S_q, D], [B, H, S_k, D]
            b, h, sq, d = q.shape
            sk = k.shape[-2]
            dv = args[2].shape[-1]
            self.attention += 2 * b * h * sq * sk * d + 2 * b * h * sq * sk * dv  # QK^T and PV
        return func(*args, **kwargs)

    def _inside(self, func, args, kwargs):
        """A registered custom op (SGLang's fused linear + GELU, an optbot kernel op): its backend kernel
        runs with this mode active again, so the aten GEMMs inside it are counted. The mode sees the
        op itself, not its body, when it is called; without this, SGLang's default-quality Qwen-Image
        counted 83.5 of its 125.3 linear TFLOP (benchmarks/results/h100-sglang-qwen-default-20261207/)."""
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if not tensors:
            return func(*args, **kwargs)
        keys = torch._C._dispatch_keys(tensors[0])
        for t in tensors[1:]:
            keys = keys | torch._C._dispatch_keys(t)
        # the backend's own kernel: below the Python keys (a redispatch that includes them asserts)
        keys = keys & torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)
        with self:
            return func.redispatch(keys, *args, **kwargs)


def _is_attention(base: str) -> bool:
    return "scaled_dot_product" in base or base in ("_flash_attention_forward", "_efficient_attention_forward")


def count_flops(step: Callable[[], object]) -> dict:
    with _FlopCounter() as fc:
        step()
    return {"linear": int(fc.linear), "attention": int(fc.attention)}


def profile_step(model: torch.nn.Module, step: Callable[[], object], device: str, trace_path: Path) -> dict:
    handles = attach_module_ranges(model)
    is_cuda = device.startswith("cuda")
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if is_cuda else [])
    try:
        if is_cuda:
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
            with torch.profiler.record_function(STEP_RANGE):
                step()
            if is_cuda:
                torch.cuda.synchronize()
    finally:
        for h in handles:
            h.remove()
    raw = trace_path.with_suffix(".raw.json")
    prof.export_chrome_trace(str(raw))
    trace = json.loads(raw.read_text())
    with gzip.open(trace_path, "wt") as f:  # keep the trace (gzipped) for chrome://tracing / perfetto
        json.dump(trace, f)
    raw.unlink()
    return parse_trace(trace, "cuda" if is_cuda else "cpu")
