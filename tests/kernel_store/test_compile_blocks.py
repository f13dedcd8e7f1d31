"""Every store kernel composes with torch.compile: each stack of a workload's entries (every entry is
in one: test_the_stacks_cover_every_entry, and each stack loads every kernel file of its entries, so
one run per entry alone would test nothing more), on its patched tiny model with the Triton kernels running under
TRITON_INTERPRET=1, has its repeated blocks compiled with fullgraph=True (backend aot_eager) with
zero graph breaks, gives the eager step's outputs, which are the base engine's within the
workload's tolerance at the stack's precision (every store kernel's wiring into the engine, checked
here once per stack: test_tiny_models.py checks the entries without kernels one by one), holds every
loaded kernel module as a registered
optbot op in the compiled graphs (none traced inline as a user-Triton wrapper), every kernel
module took the Triton path (docs/store.md, "Kernels inside the engine"), and the compiled step run
again under an emulated CUDA-graph capture reads nothing from the device, compiles nothing anew
and gives the same outputs (compile + CUDA graph, on CPU).

The children run concurrently (one per core), each in its own process: two engines cannot share one."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from bot.generate.replay import apply_entry
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import UNUSABLE, get_entry, load_store
from bot.workload import load_workload
from tests.kernel_store.conftest import assert_matches_base

ROOT = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).with_name("compile_blocks.py")
# the diffusers engine's entries (an SGLang entry is checked on the SGLang engine, tests/sglang)
USABLE = [e for e in load_store(SHIPPED_STORE) if e.status not in UNUSABLE and e.engine.name == "diffusers"]
# The stacks that apply together (tests/generate/test_replay.py): flux2-qkv-norm-rope-epilogue conflicts
# with flux2-merge-qkv and flux2-qk-rmsnorm-rope (it supersedes them; its entry.yaml), so FLUX.2 has two.
# An FP8 entry's stack runs at float32+fp8 (the recipe applied: its path engages only there).
QWEN_BF16 = ("qwen-image-cfg-modulation-cache", "qwen-image-absorb-bias", "qwen-image-qkv-norm-rope-epilogue",
             "qwen-image-hoist-host-copies", "qwen-image-linear-gelu-epilogue", "qwen-image-norm-modulate")
QWEN_FP8 = tuple(e for e in QWEN_BF16 if e != "qwen-image-linear-gelu-epilogue") + ("qwen-image-fp8-gelu-quant",)
FLUX2_FP8 = ("flux2-qkv-norm-rope-epilogue", "flux2-norm-modulate", "flux2-fp8-swiglu-quant")
# qwen-image-fp8-norm-quant includes (supersedes) the QKV epilogue, the norm + modulation and the GELU +
# quantization entries, and hands its quantized rows to their GEMMs (without linear-gelu-epilogue, as QWEN_FP8)
QWEN_FP8_ROWS = ("qwen-image-cfg-modulation-cache", "qwen-image-absorb-bias", "qwen-image-hoist-host-copies",
                 "qwen-image-fp8-norm-quant")
STACKS = [("flux2", ("flux2-qk-rmsnorm-rope", "flux2-swiglu", "flux2-norm-modulate", "flux2-merge-qkv"), "float32"),
          ("flux2", ("flux2-qkv-norm-rope-epilogue", "flux2-swiglu", "flux2-norm-modulate"), "float32"),
          ("qwen-image", QWEN_BF16, "float32"),
          # linear-gelu-epilogue keeps the unfused path on a quantized linear (its op never runs there)
          ("qwen-image", QWEN_FP8, "float32+fp8"),
          # under FP8 the SwiGLU + quantization entry takes every SwiGLU (flux2-swiglu's op never runs)
          ("flux2", FLUX2_FP8, "float32+fp8"),
          # the same two stacks on torchao's form of the recipe, what a GPU with torchao runs (an
          # nn.Linear holding a Float8Tensor weight, not optbot's Fp8Linear): "PRECISION/torchao"
          ("qwen-image", QWEN_FP8, "float32+fp8/torchao"),
          ("flux2", FLUX2_FP8, "float32+fp8/torchao"),
          ("qwen-image", QWEN_FP8_ROWS, "float32+fp8"),
          ("qwen-image", QWEN_FP8_ROWS, "float32+fp8/torchao"),
          # flux2-fp8-norm-quant includes the three FLUX2_FP8 entries: FLUX.2's FP8 stack is that entry alone
          ("flux2", ("flux2-fp8-norm-quant",), "float32+fp8"),
          ("flux2", ("flux2-fp8-norm-quant",), "float32+fp8/torchao")]
# The tiny preset's model at a smaller shape than its own (15 image + 7 text tokens, odd sizes): the
# interpreter makes one Python call per Triton program: at the preset's smallest shape (176 x 240, 19
# text tokens) the nine runs (then one per entry too) took 231 s on the 2-core development machine, at this one 64 to 153 s
# (with the machine's other load).
SHAPE = "48,80,7"


def _key_id(key) -> str:
    wl, ids, precision = key
    name = ids[0] if len(ids) == 1 else f"{wl}-stack-" + "+".join(i.removeprefix(wl + "-") for i in ids)
    return name if precision == "float32" else f"{name}-{_slug(precision)}"


def _split(precision: str) -> tuple[str, str]:
    """A key's "PRECISION[/FORM]" -> (the job's precision, the FP8 form or "")."""
    dtype, _, form = precision.partition("/")
    return dtype, form


def _slug(precision: str) -> str:
    return precision.replace("+", "-").replace("/", "-")


def _run(engine_src: Path, workload: str, out: Path, precision: str, eager_only: bool = False) -> dict:
    # one torch thread per child: the children already run one per core
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(engine_src), str(ROOT)]), TRITON_INTERPRET="1",
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(HELPER), workload, str(engine_src), str(out), "--shape", SHAPE,
                           "--precision", _split(precision)[0], *(["--eager-only"] * eager_only),
                           *(["--fp8-form", _split(precision)[1]] if _split(precision)[1] else [])],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(Path(str(out) + ".json").read_text())


@pytest.fixture(scope="module")
def compiled(request, diffusers_engine, base_worktree, tmp_path_factory):
    """The result of every run the collected tests of this module ask for: the patches applied one
    after another (worktrees of one repository are not created concurrently), the children run
    concurrently."""
    keys = sorted({it.callspec.params["key"] for it in request.session.items
                   if it.module is request.module and "key" in getattr(getattr(it, "callspec", None), "params", {})})
    srcs = {}
    for key in keys:
        onto = None
        for eid in key[1]:
            r = apply_entry(diffusers_engine, get_entry(eid, SHIPPED_STORE), name=f"test-compile-{_key_id(key)}-{eid}", onto=onto)
            assert r.status == "applied", r.reason
            onto = r.candidate.commit_sha
        srcs[key] = Path(r.worktree) / "src"
    d = tmp_path_factory.mktemp("compile-blocks")
    # each stack's child, and one eager-only child of the base engine per (workload, precision)
    runs = {key: (srcs[key], key[0], d / _key_id(key), key[2], False) for key in keys}
    runs.update({("base", wl, p): (base_worktree / "src", wl, d / f"base-{wl}-{_slug(p)}", p, True)
                 for wl, _, p in keys})
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return {key: (pool.submit(_run, *args), args[2]) for key, args in runs.items()}


def _check(compiled, key) -> dict:
    fut, out = compiled[key]
    res = fut.result()
    assert res["error"] is None, f"compiled step failed: {res['error']}"
    assert res["graph_breaks"] == 0, res["break_reasons"]
    assert res["user_triton"] == [], f"Triton kernels traced inline, not registered ops: {res['user_triton']}"
    kernels = [get_entry(eid, SHIPPED_STORE).kernel_files() for eid in key[1]]
    if any(kernels):
        # the modules the step ran ("": loaded and never called, as the bf16 norm kernel that
        # qwen-image-fp8-norm-quant carries for the entry it includes, in an FP8 step)
        ran = {m: p for m, p in res["kernel_paths"].items() if p}
        assert ran, "no optbot kernel module ran in the model"
        assert set(ran.values()) == {"triton"}, res["kernel_paths"]
        # every kernel module the model ran is in the compiled graphs as its registered op
        assert set(ran) <= set(res["optbot_ops"].values()), res["optbot_ops"]
    # and so is every op a patch registers in the engine's own files (a patch-only entry's op:
    # qwen-image-linear-gelu-epilogue's cuBLASLt call): none traced through, none decomposed
    patched_ops = {m.group(1) for eid in key[1]
                   for m in re.finditer(r'custom_op\("optbot::(\w+)"', get_entry(eid, SHIPPED_STORE).patch_path.read_text())}
    assert {f"optbot.{name}.default" for name in patched_ops} <= set(res["optbot_ops"]), (patched_ops, res["optbot_ops"])
    # a CUDA-graph capture after the compiled warm-up runs the blocks compiled there: no recompile
    # (inside a real capture it fails), no device read (capture forbids it), the same outputs
    assert res.get("capture_error") is None, res["capture_error"]
    assert res["capture_new_graphs"] == 0, "the blocks were compiled anew under capture"
    tol = load_workload(key[0]).tolerance[_split(key[2])[0]]
    outs = torch.load(str(out) + ".pt")
    assert outs["eager"].keys() == outs["compiled"].keys() == outs["captured"].keys()
    for k, ref in outs["eager"].items():
        torch.testing.assert_close(outs["compiled"][k], ref, atol=tol.atol, rtol=tol.rtol)
        torch.testing.assert_close(outs["captured"][k], ref, atol=tol.atol, rtol=tol.rtol)
    # the stack's eager step against the base engine's, same weights, inputs and precision
    bfut, bout = compiled["base", key[0], key[2]]
    bfut.result()
    assert_matches_base(outs["eager"], torch.load(str(bout) + ".pt")["eager"], tol)
    return res


@pytest.mark.slow
@pytest.mark.parametrize("key", STACKS, ids=_key_id)
def test_stack_compiles_without_graph_breaks(compiled, key):
    res = _check(compiled, key)
    # every kernel file that holds a kernel its entry declares added (NAME or NAME@SCOPE; qwen-image-fp8-norm-quant carries the
    # bf16 norm kernel of an entry it includes, which an FP8 step never runs, and does not declare it)
    files = [f.stem for e in (get_entry(eid, SHIPPED_STORE) for eid in key[1]) for f in e.kernel_files()
             if not e.adds_kernels or any(a.partition("@")[0] in f.read_text() for a in e.adds_kernels)]
    assert sorted(m.rsplit(".", 1)[1] for m, p in res["kernel_paths"].items() if p) == sorted(files), res["kernel_paths"]


def test_the_stacks_cover_every_entry():
    """A new entry of these workloads joins a stack (or a new stack), or this test says so."""
    stacked = {eid for _, ids, _ in STACKS for eid in ids}
    for wl in {wl for wl, _, _ in STACKS}:
        assert {e.id for e in USABLE if wl in e.workloads} <= stacked, wl


# Each op is attributed to the file that defines its function (a kernel file may load a sibling file of
# its entry, which then registers that file's op first: qwen-image-fp8-norm-quant's norm_quant.py loads
# gelu_quant.py)
_REGISTER_PROBE = """
import importlib.util, json, os, sys
from torch._library.custom_ops import OPDEFS
for i, path in enumerate(sys.argv[1:]):
    for copy in ("store", "engine"):  # the same file imported twice, as the store's and an engine's copy
        spec = importlib.util.spec_from_file_location(f"probe_{i}_{copy}", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
added = {path: [] for path in sys.argv[1:]}
for name, opdef in OPDEFS.items():
    src = os.path.realpath(opdef._init_fn.__code__.co_filename)
    if src in added:
        added[src].append(name)
print(json.dumps({p: sorted(v) for p, v in added.items()}))
"""


def test_every_kernel_file_registers_ops_of_its_own_once():
    """All the store's kernel files in one process, each imported twice: no registration error, and
    each file registers at least one op no other file registered first (a shared name would make a
    second entry silently run the first one's op)."""
    # an entry that includes another's kernel carries a byte-identical copy of its file (entry.yaml
    # `supersedes`): the same kernel, checked once, as the store's and an engine's copy are
    files, seen = [], set()
    for f in (f for e in USABLE for f in e.kernel_files()):
        if f.read_bytes() not in seen:
            seen.add(f.read_bytes())
            files.append(os.path.realpath(f))
    proc = subprocess.run([sys.executable, "-c", _REGISTER_PROBE, *files], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    added = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(added) == set(files)
    for path, ops in added.items():
        assert ops and all(op.startswith("optbot::") for op in ops), (path, ops)
