"""Capture the op graph of one step: every aten op, the values it reads and writes, the module that
ran it, the engine line that called it, and which step inputs each value depends on.

Method (docs/analyze.md says more):
- A TorchDispatchMode sees every aten op the step runs. Under ``torch.inference_mode`` (which the
  harness uses) composite ops arrive whole: ``aten::linear``, ``aten::layer_norm``,
  ``aten::rms_norm``, ``aten::scaled_dot_product_attention``, ``aten::to``.
- Values: every tensor an op reads or writes gets a value id, tracked by tensor identity in a weak
  map (so a freed tensor's recycled ``id()`` never aliases a live value). Tensors first seen as an
  op input were made before the step: parameters and buffers (named), or plain tensor attributes
  of modules (constants).
- In-place writes: an op that writes a tensor (schema ``alias_info.is_write``: ``copy_``,
  ``index_put_``, ``scatter_``, ``add_``, an ``out=`` argument) gives it a new value id, and so
  every other live tracked tensor on the same storage: the base a slice was written through
  (``buf[:, :n] = x`` is ``slice`` then ``copy_`` on the view) and its other views. Their new
  value's dependencies are their old ones plus the op's, and its value number combines their old
  one with the op's, so later reads of the buffer carry what was written into it. Tensors are
  found by storage through weak references (dead ones pruned; empty tensors, data_ptr 0, skipped).
- Unseen writes: a Triton or CUDA kernel launched directly (SGLang's fused norm and modulation
  kernels write into a tensor from ``torch.empty``) is invisible to the dispatcher, so what it
  wrote would look made from nothing: a constant. Memory from ``empty``, ``empty_like``,
  ``empty_strided``, ``new_empty`` is uninitialized until a visible op writes it (views of it
  are too); an op that reads it before that reads what an unseen kernel wrote, so its inputs'
  dependencies are unknown: it depends on every label, ``unseen`` included, and its value number
  is its own (never equal to another op's), as is every allocation's: two buffers of one shape
  are not one value. The op is flagged ``uninit``, an allocation ``alloc``. Over-approximate on
  purpose: calling such work constant made the analyzer claim 80% of SGLang's FLUX.2 step as
  hoistable (2026-12-03, H200). A direct launch that writes into a tensor an op made visibly
  is not seen; docs/analyze.md says so.
- Dependencies (taint): each step input is labelled by its role (latents, prompt, text_mask,
  timestep, guidance, pos_ids); parameters and buffers are "weights"; tensors created inside the
  step from nothing (ones, arange) or found on modules are "const". An op's dependency set is the
  union of its inputs' sets (a bit mask).
- Host reads: ``tolist``, ``item``, ``int(t)``, ``bool(t)`` (seen by a TorchFunctionMode) turn a
  value into Python numbers the dispatcher cannot follow, e.g. prompt lengths read off a text mask
  and used to build position ids (Lumina2's RoPE). Every op the reading module runs afterwards
  that makes a tensor from nothing or takes a scalar argument (sizes, indices, fill values: where
  Python numbers enter) carries the read value's input dependencies; when the module returns
  Python values, the tensors its caller then makes from nothing (zeros, arange, full) carry them
  too. Over-approximate on purpose, so that no value built from a prompt's length is called
  prompt-independent, yet narrow enough that work on the latents alone stays visible. Reads of
  weights and constants carry nothing.
- Value numbers: a hash of (op, scalar arguments, input value numbers), with step inputs numbered
  by their content. Two ops with the same value number computed the same value, e.g. the
  unconditional CFG pass recomputing the timestep modulation, or every block rebuilding one mask.
- Module path: forward pre/post hooks keep a stack of the modules being run (the same paths as the
  profiler's attribution). Engine line: the innermost Python frame inside the engine import root.
- Aliases: an op all of whose outputs share storage with an input (view, reshape of a contiguous
  tensor, ``to`` to the same dtype, chunk) moves no data; it is flagged so detectors skip it.
- Attention ops: the mask argument's values are checked (all true, or an additive mask of zeros:
  a mask that masks nothing), and kept so the job can time the op with and without it.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from runner.input_spec import DEFAULT_ROLES

GRAPH_VERSION = 1

# Roles of step inputs by keyword (the workload's `role:` keys override them; runner/input_spec.py).
# An unknown keyword becomes its own label "input:<name>".
BASE_LABELS = ["weights", "const", "latents", "prompt", "text_mask", "timestep", "guidance", "pos_ids"]
# Factories whose memory holds nothing until something writes it (module docstring, "Unseen writes").
_UNINIT_FACTORIES = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                               "empty_permuted"})

_COPY_NAMES = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::to_copy")
_RANDOM_OPS = ("rand", "bernoulli", "normal", "uniform", "multinomial", "dropout")
_DTYPE_SHORT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64",
                torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPE_SHORT[getattr(torch, _name)] = "f8"


def dtype_short(dt: torch.dtype) -> str:
    return _DTYPE_SHORT.get(dt, str(dt).replace("torch.", ""))


def _scalar(v: Any):
    """A JSON-able summary of a non-tensor argument, or None to leave it out."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, (torch.dtype,)):
        return dtype_short(v)
    if isinstance(v, torch.device):
        return v.type
    if isinstance(v, str) and len(v) <= 32:
        return v
    if isinstance(v, (list, tuple)) and len(v) <= 8 and all(isinstance(x, (int, float, bool)) for x in v):
        return list(v)
    if isinstance(v, torch.SymInt):
        return int(v)
    return None


def _storage_key(t: torch.Tensor) -> int | None:
    """The address of `t`'s storage, shared by a tensor and all its views; None for tensors with no
    plain storage (sparse, meta) or an empty one (every empty storage has address 0)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - sparse/meta tensors have no plain storage
        return None
    return ptr or None


@dataclass
class Probe:
    """An attention call whose mask masks nothing, kept to time it with and without the mask."""
    op_id: int
    func: Any
    args: tuple
    kwargs: dict
    mask_pos: tuple  # ("arg", index) or ("kw", name)
    signature: str
    sdp: tuple | None = None  # sdp_state() at the call: a later timing of it picks the backend it picked


# SDPA's backend switches, by torch's names (torch.nn.attention._backend_names)
_SDP_SWITCHES = ("cudnn", "flash", "mem_efficient", "math")


def sdp_state() -> tuple:
    """(which SDPA backends are enabled, their priority order) right now. A layer may set its own
    around its call (`sdpa_kernel(..., set_priority=True)`: SGLang's per-layer `allow_cudnn_sdp`
    over its process-wide `enable_cudnn_sdp(False)`), so the engine's pick depends on this state at
    the call, not on the process's state when the call is timed again."""
    flags = tuple(bool(getattr(torch._C, f"_get_{n}_sdp_enabled")()) for n in _SDP_SWITCHES)
    get_order = getattr(torch._C, "_get_sdp_priority_order", None)
    return flags, (tuple(int(b) for b in get_order()) if get_order else ())


@contextlib.contextmanager
def sdp_as(state: tuple | None):
    """SDPA's backend switches and priority set to `state` (sdp_state()) inside, restored after."""
    if state is None:
        yield
        return
    before = sdp_state()

    def put(st):
        flags, order = st
        for n, on in zip(_SDP_SWITCHES, flags):
            getattr(torch._C, f"_set_sdp_use_{n}")(on)
        if order and hasattr(torch._C, "_set_sdp_priority_order"):
            torch._C._set_sdp_priority_order(list(order))

    put(state)
    try:
        yield
    finally:
        put(before)


@dataclass
class Recorder:
    engine_root: str
    roles: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_ROLES))
    labels: list[str] = field(default_factory=lambda: list(BASE_LABELS))
    values: list[dict] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)
    modules: list[list] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    probes: dict[str, Probe] = field(default_factory=dict)
    # the first SDPA call of each signature (shapes, dtype, mask, scalars), kept to time it under
    # each backend at the workload's shapes (runner/kinds/graph.py); its calls counted
    sdpa_calls: dict[str, Probe] = field(default_factory=dict)
    sdpa_counts: dict[str, int] = field(default_factory=dict)
    sdp_default: tuple = field(default_factory=sdp_state)  # the process's SDPA switches at capture start
    pass_idx: int = -1
    inputs: list[dict] = field(default_factory=list)
    suspended: int = 0  # > 0 while the recorder itself runs ops (digests), which are not the step's
    fingerprints: bool = False  # record each op's first output's fingerprint (checks value numbers)

    def __post_init__(self):
        self._vid = WeakIdKeyDictionary()  # tensor -> current value id
        # storage address -> weak references to the tracked tensors on it (a list: a tensor's __eq__
        # is elementwise, so tensors cannot go in sets); read by in-place writes
        self._on_storage: dict[int, list[weakref.ref]] = {}
        self._n_ext = 0
        self._keep: list[torch.Tensor] = []  # step inputs and weights stay alive (ids stay unique)
        self._param_names: dict[int, str] = {}
        self._mod_stack: list[int] = [-1]
        # deps read back to the host (tolist, item, int(), bool()) by the module on top of the stack
        # at the time: Python values the dispatcher cannot follow, so every op run inside that module
        # afterwards carries them (runner/graph_capture.py docstring, "Host reads")
        self._host_taint: dict[int, int] = {}
        # ... and what a module that returned Python values hands its caller: only tensors the
        # caller makes from nothing (zeros, arange, full: where returned lengths come back in) carry it
        self._host_taint_made: dict[int, int] = {}
        self.host_reads: list[dict] = []
        self._mod_index: dict[str, int] = {}
        self._src_index: dict[str, int] = {}
        self._code_in_engine: dict[Any, bool] = {}
        self._root = str(Path(self.engine_root).resolve()) + "/" if self.engine_root else ""
        self._vn_content: dict[str, int] = {}
        self._uninit: set[int] = set()  # value ids of memory no visible op has written yet

    # ---- labels and values ---------------------------------------------------------------
    def label_bit(self, name: str) -> int:
        if name not in self.labels:
            self.labels.append(name)
        return 1 << self.labels.index(name)

    def _new_value(self, t: torch.Tensor, origin: str, deps: int, vn: int) -> int:
        vid = len(self.values)
        self.values.append({
            "shape": [int(s) for s in t.shape], "dtype": dtype_short(t.dtype), "dev": t.device.type,
            "contig": bool(t.is_contiguous()), "origin": origin, "deps": deps, "vn": vn,
        })
        self._vid[t] = vid
        key = _storage_key(t)
        if key is not None:
            refs = [r for r in self._on_storage.get(key, ()) if r() is not None]
            if not any(r() is t for r in refs):
                refs.append(weakref.ref(t))
            self._on_storage[key] = refs
        return vid

    def _sharing_storage(self, t: torch.Tensor) -> list[torch.Tensor]:
        """The other live tracked tensors on `t`'s storage (its base, its views, views of its base)."""
        key = _storage_key(t)
        if key is None:
            return []
        live = [x for x in (r() for r in self._on_storage.get(key, ())) if x is not None]
        self._on_storage[key] = [weakref.ref(x) for x in live]
        return [x for x in live if x is not t]

    def _lookup(self, t: torch.Tensor) -> int:
        vid = self._vid.get(t)
        if vid is not None:
            return vid
        name = self._param_names.get(id(t))
        if name is not None:
            return self._new_value(t, f"weight:{name}", self.label_bit("weights"), _h(("w", name)))
        # a tensor made before the step and not registered as a parameter or buffer: a constant
        # (RoPE tables kept as plain attributes, cached tensors); numbered by identity
        # numbered by order of first sight, not id(): the same model captures to the same graph
        self._keep.append(t)
        self._n_ext += 1
        return self._new_value(t, "const:external", self.label_bit("const"), _h(("ext", self._n_ext, tuple(t.shape))))

    def register_weights(self, model: torch.nn.Module) -> None:
        for name, p in model.named_parameters(remove_duplicate=False):
            self._param_names.setdefault(id(p), name)
        for name, b in model.named_buffers(remove_duplicate=False):
            self._param_names.setdefault(id(b), name)

    def label_inputs(self, kwargs: dict, args: tuple) -> None:
        """Called at the start of each forward pass of the root model."""
        self.pass_idx += 1
        self._host_taint, self._host_taint_made = {}, {}
        self.suspended += 1
        try:
            self._label_inputs(kwargs, args)
        finally:
            self.suspended -= 1

    def _label_inputs(self, kwargs: dict, args: tuple) -> None:
        items = [(k, v) for k, v in kwargs.items()] + [(f"arg{i}", v) for i, v in enumerate(args)]
        for key, val in items:
            role = self.roles.get(key, f"input:{key}")
            bit = self.label_bit(role)
            leaves, _ = tree_flatten(val)
            for j, t in enumerate(x for x in leaves if isinstance(x, torch.Tensor)):
                digest = _content_digest(t)
                vn = self._vn_content.setdefault(f"{role}:{digest}", _h(("in", role, digest)))
                vid = self._new_value(t, f"input:{key}", bit, vn)
                self._keep.append(t)
                self.inputs.append({"pass": self.pass_idx, "key": key, "role": role, "value": vid, "digest": digest})

    # ---- modules and sources -------------------------------------------------------------
    def attach_module_hooks(self, model: torch.nn.Module) -> list:
        handles = []
        for path, mod in model.named_modules():
            if not path:
                continue
            idx = len(self.modules)
            # [path, class, "file:line" of the class, "file:line" of the first call of the module]
            self.modules.append([path, type(mod).__name__, _class_source(type(mod), self._root), ""])
            self._mod_index[path] = idx

            def pre(m, args, _idx=idx):
                self._mod_stack.append(_idx)
                if not self.modules[_idx][3]:
                    site = self._source()
                    self.modules[_idx][3] = self.sources[site] if site >= 0 else ""

            def post(m, args, out, _idx=idx):
                if len(self._mod_stack) > 1 and self._mod_stack[-1] == _idx:
                    self._mod_stack.pop()
                    taint = self._host_taint.pop(_idx, 0) | self._host_taint_made.pop(_idx, 0)
                    # a module that returns Python values (lengths, lists) hands what they came from to its caller
                    if taint and any(not isinstance(x, torch.Tensor) and x is not None for x in tree_flatten(out)[0]):
                        top = self._mod_stack[-1]
                        self._host_taint_made[top] = self._host_taint_made.get(top, 0) | taint

            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(post))
        return handles

    def _source(self) -> int:
        if not self._root:
            return -1
        f = sys._getframe(2)
        while f is not None:
            code = f.f_code
            inside = self._code_in_engine.get(code)
            if inside is None:
                inside = self._code_in_engine[code] = code.co_filename.startswith(self._root)
            if inside:
                key = f"{code.co_filename[len(self._root):]}:{f.f_lineno}"
                idx = self._src_index.get(key)
                if idx is None:
                    idx = self._src_index[key] = len(self.sources)
                    self.sources.append(key)
                return idx
            f = f.f_back
        return -1

    # ---- one op --------------------------------------------------------------------------
    def record(self, func, args: tuple, kwargs: dict, out) -> None:
        schema = func._schema
        name = schema.name
        arg_names = [a.name for a in schema.arguments]
        in_vids, in_names, scalars = [], [], {}
        deps = 0
        in_tensors = []
        for i, a in enumerate(args):
            self._collect(a, arg_names[i] if i < len(arg_names) else f"arg{i}", in_vids, in_names, scalars, in_tensors)
        for k, a in kwargs.items():
            self._collect(a, k, in_vids, in_names, scalars, in_tensors)
        for vid in in_vids:
            deps |= self.values[vid]["deps"]
        in_vns = tuple(self.values[v]["vn"] for v in in_vids)
        random = any(r in name for r in _RANDOM_OPS) and not scalars.get("train") is False
        op_id = len(self.ops)
        if not in_vids:
            deps = self.label_bit("const")
        outs, _ = tree_flatten(out)
        out_tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        in_storages = {_storage_key(t) for t in in_tensors} - {None}
        written = _written(schema, args, kwargs)
        # an in-place op writes into its input's storage but does work: never an alias
        alias = bool(out_tensors) and not written and all(_storage_key(o) in in_storages for o in out_tensors)
        # reading memory that no visible op wrote: an unseen kernel wrote it (module docstring)
        unseen = not alias and any(v in self._uninit for v, t in zip(in_vids, in_tensors)
                                   if not any(t is w for w in written))
        if unseen:
            deps |= self.label_bit("unseen") | ((1 << len(self.labels)) - 1)
        alloc = _base(name) in _UNINIT_FACTORIES  # memory that holds nothing yet
        # numbered by op: no two random draws, unseen writes or uninitialized allocations are one value
        fresh = random or unseen or alloc
        base_vn = _h((name, tuple(sorted((k, repr(v)) for k, v in scalars.items())), in_vns, op_id if fresh else 0))
        if (self._host_taint or self._host_taint_made) and not alias and _base(name) not in _LAYOUT_OPS:
            deps |= self._host_deps(bool(in_vids), scalars)
        out_vids = []
        for j, o in enumerate(out_tensors):
            out_vids.append(self._new_value(o, f"op:{op_id}", deps, _h((base_vn, j))))
        if alloc or (alias and any(v in self._uninit for v in in_vids)):
            self._uninit.update(out_vids)  # made uninitialized, or a view of such memory
        wrote = self._propagate_writes(written, out_tensors, op_id, deps, base_vn) if written else []
        rec = {"id": op_id, "op": name, "m": self._mod_stack[-1], "s": self._source(), "p": self.pass_idx,
               "in": in_vids, "an": in_names, "out": out_vids}
        if wrote:
            rec["wr"] = wrote
        if unseen:
            rec["uninit"] = True
        if alloc:
            rec["alloc"] = True  # an uninitialized allocation: no work of its own
        if scalars:
            rec["sc"] = scalars
        if alias:
            rec["alias"] = True
        if not out_tensors and outs:
            rec["host"] = True  # returns a Python value: the host waits for the device
        if name in _COPY_NAMES and any(t.device != o.device for t in in_tensors for o in out_tensors):
            rec["xdev"] = True  # a copy between devices inside the step (blocks CUDA-graph capture)
        if self.fingerprints and out_tensors:
            self.suspended += 1
            try:
                rec["fp"] = _fingerprint(out_tensors[0])
            finally:
                self.suspended -= 1
        self.ops.append(rec)
        if "attention" in name or "scaled_dot_product" in name:
            self._check_mask(rec, func, args, kwargs, arg_names)
        if name == "aten::scaled_dot_product_attention":
            self._keep_sdpa(rec, func, args, kwargs, scalars)

    def _propagate_writes(self, written: list[torch.Tensor], out_tensors: list[torch.Tensor], op_id: int,
                          deps: int, base_vn: int) -> list[int]:
        """New values for what an in-place op changed besides its returned tensors: a written tensor
        the op does not return, and every live tensor sharing a written tensor's storage. Each keeps
        its old dependencies and value number, combined with the op's: a zero buffer that a slice
        of prompt was copied into depends on the prompt from then on."""
        done = list(out_tensors)
        new_vids = []
        for w in written:
            for t in [w] + self._sharing_storage(w):
                if any(t is d for d in done):
                    continue
                done.append(t)
                old = self._vid.get(t)  # arguments were looked up and sharers registered: never None
                old_deps, old_vn = (self.values[old]["deps"], self.values[old]["vn"]) if old is not None else (0, 0)
                new_vids.append(self._new_value(t, f"write:{op_id}", old_deps | deps, _h((old_vn, base_vn, "w"))))
        return new_vids

    def _collect(self, a, argname, in_vids, in_names, scalars, in_tensors) -> None:
        if isinstance(a, torch.Tensor):
            in_vids.append(self._lookup(a))
            in_names.append(argname)
            in_tensors.append(a)
        elif isinstance(a, (list, tuple)) and a and any(isinstance(x, torch.Tensor) for x in a):
            for x in a:
                if isinstance(x, torch.Tensor):
                    in_vids.append(self._lookup(x))
                    in_names.append(argname)
                    in_tensors.append(x)
        else:
            s = _scalar(a)
            if s is not None or a is None:
                scalars[argname] = s

    def _keep_sdpa(self, rec, func, args, kwargs, scalars) -> None:
        shapes = tuple(tuple(t.shape) for t in args[:3] if isinstance(t, torch.Tensor))
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        mask = mask if isinstance(mask, torch.Tensor) else None
        state = sdp_state()
        # calls made under different backend switches pick differently: separate signatures
        tag = "" if state == self.sdp_default else f" sdp{state}"
        sig = (f"sdpa{shapes}{dtype_short(args[0].dtype)}"
               f"{'' if mask is None else ' mask' + str(tuple(mask.shape))}"
               f"{sorted((k, v) for k, v in scalars.items() if v is not None)}{tag}")
        rec["sdpa"] = sig
        self.sdpa_counts[sig] = self.sdpa_counts.get(sig, 0) + 1
        if sig not in self.sdpa_calls:
            self.sdpa_calls[sig] = Probe(rec["id"], func, tuple(args), dict(kwargs), ("", 0), sig, state)

    def _check_mask(self, rec, func, args, kwargs, arg_names) -> None:
        pos, mask = None, None
        for i, a in enumerate(args):
            if i < len(arg_names) and arg_names[i] in ("attn_mask", "attn_bias", "mask") and isinstance(a, torch.Tensor):
                pos, mask = ("arg", i), a
        for k, a in kwargs.items():
            if k in ("attn_mask", "attn_bias", "mask") and isinstance(a, torch.Tensor):
                pos, mask = ("kw", k), a
        if mask is None:
            return
        self.suspended += 1
        try:
            self._mask_facts(rec, func, args, kwargs, pos, mask)
        finally:
            self.suspended -= 1

    def _mask_facts(self, rec, func, args, kwargs, pos, mask) -> None:
        if mask.dtype == torch.bool:
            noop, kind = bool(mask.all()), "bool"
        elif mask.is_floating_point():
            noop, kind = bool((mask == 0).all()), "additive"
        else:
            noop, kind = bool((mask != 0).all()), "int"
        rec["mask"] = {"value": self._vid.get(mask), "kind": kind, "masks_nothing": noop,
                       "shape": [int(s) for s in mask.shape]}
        if noop:
            shapes = tuple(tuple(t.shape) for t in args if isinstance(t, torch.Tensor))
            sig = f"{rec['op']}{shapes}{mask.dtype}"
            if sig not in self.probes:
                self.probes[sig] = Probe(rec["id"], func, tuple(args), dict(kwargs), pos, sig, sdp_state())
            rec["mask"]["probe"] = sig

    def _host_deps(self, has_inputs: bool, scalars: dict) -> int:
        """What host reads add to an op (not a view: a view's values are its input's). Python values
        reach an op as scalar arguments (sizes, indices, fill values) or make a tensor from nothing;
        an op of tensors alone gets a host read's deps through its inputs."""
        deps = 0
        if not has_inputs or any(v is not None for v in scalars.values()):
            for m in self._mod_stack:
                deps |= self._host_taint.get(m, 0)
        if not has_inputs:
            for m in self._mod_stack:
                deps |= self._host_taint_made.get(m, 0)
        return deps

    def host_read(self, t: torch.Tensor, how: str) -> None:
        """A tensor's content became a Python value (``tolist``, ``item``, ``int(t)``, ...)."""
        if self.suspended:
            return
        vid = self._vid.get(t)
        if vid is None:
            return  # never seen by an op: a weight or constant read before any use, nothing to carry
        deps = self.values[vid]["deps"] & ~(self.label_bit("weights") | self.label_bit("const"))
        if deps:
            top = self._mod_stack[-1]
            self._host_taint[top] = self._host_taint.get(top, 0) | deps
            self.host_reads.append({"p": self.pass_idx, "m": top, "value": vid, "how": how, "s": self._source()})

    def to_json(self) -> dict:
        return {"version": GRAPH_VERSION, "labels": self.labels, "modules": self.modules, "sources": self.sources,
                "inputs": self.inputs, "values": self.values, "ops": self.ops, "passes": self.pass_idx + 1,
                "host_reads": self.host_reads}


class _Mode(TorchDispatchMode):
    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.rec.suspended:
            self.rec.record(func, args, kwargs, out)
        return out


# Ops whose output holds their input's elements in another shape or layout: sizes from a host read
# change the shape (and so the value number), never the values.
_LAYOUT_OPS = frozenset({"view", "reshape", "_unsafe_view", "_reshape_alias", "permute", "flatten", "unflatten",
                         "transpose", "t", "contiguous", "clone", "expand", "squeeze", "unsqueeze"})


def _base(op: str) -> str:
    """aten::view.dtype -> view"""
    return op.rpartition("::")[2].split(".", 1)[0]


# Tensor methods that turn content into Python values the dispatcher cannot follow.
_HOST_READS = frozenset({"tolist", "item", "__int__", "__float__", "__bool__", "__index__", "__complex__"})


class _HostReads(TorchFunctionMode):
    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _HOST_READS and args and isinstance(args[0], torch.Tensor):
            self.rec.host_read(args[0], name)
        return func(*args, **(kwargs or {}))


def _fingerprint(t: torch.Tensor) -> list:
    """Sum and sum of squares in float64, and the first and last elements, on the tensor's device:
    equal for the same value computed twice (deterministic kernels), different otherwise (almost
    surely). What the CFG detector's "same value number" claims is checked against."""
    if t.numel() == 0 or t.is_complex():
        return [int(t.numel())]
    x = t.detach().reshape(-1).to(torch.float64)
    return [round(v, 12) if isinstance(v, float) else v for v in
            torch.stack([x.sum(), (x * x).sum(), x[0], x[-1]]).tolist()]


def capture(model: torch.nn.Module, step: Callable[[], object], engine_root: str,
            roles: dict[str, str] | None = None, fingerprints: bool = False) -> Recorder:
    """Run `step` once under the recorder. The caller warms the step up first, so caches that a
    model fills on its first call (RoPE tables behind lru_cache) look as they do in steady state."""
    rec = Recorder(engine_root=engine_root, fingerprints=fingerprints)
    if roles:
        rec.roles.update(roles)
    rec.register_weights(model)
    handles = rec.attach_module_hooks(model)
    handles.append(model.register_forward_pre_hook(lambda m, a, kw: rec.label_inputs(kw, a), with_kwargs=True))
    try:
        with _HostReads(rec), _Mode(rec):
            step()
    finally:
        for h in handles:
            h.remove()
    return rec


def _written(schema, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an op writes into: arguments whose schema alias info says write (``self`` of
    ``copy_``/``add_``/``index_put_``, ``out`` of an ``out=`` variant, lists of them)."""
    writes = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    if not writes:
        return []
    names = [a.name for a in schema.arguments]
    picked = [a for i, a in enumerate(args) if i < len(names) and names[i] in writes]
    picked += [a for k, a in kwargs.items() if k in writes]
    out = []
    for a in picked:
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            if isinstance(x, torch.Tensor) and not any(x is y for y in out):
                out.append(x)
    return out


def _h(obj) -> int:
    return int.from_bytes(hashlib.blake2b(repr(obj).encode(), digest_size=8).digest(), "little") >> 1


def _content_digest(t: torch.Tensor) -> str:
    c = t.detach().to("cpu").contiguous()
    if c.dtype in (torch.bfloat16, torch.float16):
        c = c.view(torch.int16)
    elif c.dtype == torch.bool:
        c = c.to(torch.uint8)
    return f"{tuple(c.shape)}:{c.dtype}:" + hashlib.sha256(c.numpy().tobytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _class_source(cls: type, root: str) -> str:
    """file:line of a module class inside the engine. A regex over the file, once per class:
    inspect.getsourcelines parses the whole file into an AST, seconds per file on big modules."""
    mod = sys.modules.get(cls.__module__)
    f = getattr(mod, "__file__", None) or ""
    if not f or not root:
        return ""
    f = str(Path(f).resolve())
    if not f.startswith(root):
        return ""
    m = re.search(rf"^[ \t]*class[ \t]+{re.escape(cls.__name__)}\b", _file_text(f), re.M)
    return f"{f[len(root):]}:{_file_text(f).count(chr(10), 0, m.start()) + 1}" if m else f[len(root):]


@functools.lru_cache(maxsize=64)
def _file_text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""
