"""sglang-fp8-linear-whole-graph: SGLang's FP8 linear traces under torch.compile without a graph break,
so a compiled block is one graph and inductor can fuse the activation quantization into its producer.
No GPU needed.

The GPU's path through `apply_fp8_linear` is the per-channel-weight one (`cutlass_fp8_supported`), whose
GEMM is sgl_kernel's `fp8_scaled_mm`: on the GPU box that is optbot's stand-in on torch._scaled_mm
(runner/engines/sglang_standins.py), and the child here calls the same stand-in. Each check runs in a
child with the engine's python/ on its path (the base's or the patched worktree's)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.generate.replay import apply_entry
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry
from tests.sglang.conftest import run_in_engine

ENTRY = "sglang-fp8-linear-whole-graph"

pytest.importorskip("triton")

CHILD = r"""
import json, sys, torch
from runner.engines import sglang_standins
sglang_standins.install(False)
from sglang.srt.layers.quantization import fp8_utils as U
assert U.__file__.startswith(sys.argv[1]), U.__file__
U.fp8_scaled_mm = sglang_standins.fp8_scaled_mm  # what the GPU box's sgl_kernel stand-in gives (CUDA only)

torch.manual_seed(0)
x = (torch.randn(32, 64) * 2).to(torch.bfloat16)
w = torch.randn(48, 64)
ws = (w.abs().amax(dim=1, keepdim=True) / 448).float()       # per output channel, [N, 1]
w8 = (w / ws).to(torch.float8_e4m3fn).t()                      # [K, N], as the layer holds it
s = torch.tensor(0.02)                                         # ModelOpt's static input scale
f = lambda x: U.apply_fp8_linear(x, w8, ws, input_scale=s, cutlass_fp8_supported=True)
# the recipe's arithmetic: torch's e4m3 quantization with the static scale, then the same GEMM
q = (x.float() * (1.0 / s.float())).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
want = sglang_standins.fp8_scaled_mm(q, w8, s, ws, torch.bfloat16)
graphs = []

def backend(gm, inputs):
    graphs.append(gm)
    return gm.forward

got = {}
try:
    out = torch.compile(f, fullgraph=True, backend=backend)(x)
    got["traced"] = {"graphs": len(graphs), "equal": torch.equal(out, want)}
except Exception as e:
    got["traced"] = "FAILS " + type(e).__name__ + ": " + " ".join(str(e).split())[:400]
torch._dynamo.reset()
try:
    got["inductor_equal"] = torch.equal(torch.compile(f, fullgraph=True)(x), want)
except Exception as e:
    got["inductor_equal"] = "FAILS " + type(e).__name__
print(json.dumps(got))
"""


def _child(python_dir: Path) -> dict:
    out = run_in_engine(CHILD, python_dir, TRITON_INTERPRET="1", SGLANG_ENABLE_FP8_GEMM_CONFIG_TUNE="0")
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_fp8_linear_traces_whole(sglang_engine):
    """Upstream's apply_fp8_linear stops fullgraph tracing at its platform question, with the message the
    H100's compile report gave 30 times (runtime_context.py, `__getattribute__` of class `type`); patched,
    it is one graph whose output is the recipe's arithmetic bit for bit, with aot and with inductor."""
    e = get_entry(ENTRY, SHIPPED_STORE)
    assert e.supersedes == ("sglang-fp8-static-quant-inductor", "sglang-fp8-quant-compile")
    assert e.enables == ("compile", "compile+graph")
    # it includes the static-quant entry's patch, hunk for hunk
    ours, theirs = e.patch_path.read_text(), get_entry(e.supersedes[0], SHIPPED_STORE).patch_path.read_text()
    hunks = [h for h in theirs.split("\n@@") if not h.startswith("diff --git")]
    assert hunks and all(h in ours for h in hunks)
    r = apply_entry(sglang_engine, e, name="test-sglang-fp8-linear-whole-graph")
    assert r.status == "applied", r.reason
    base = _child(Path(sglang_engine.repo_path) / "python")
    assert base["traced"].startswith("FAILS Unsupported") and "__getattribute__" in base["traced"], base
    got = _child(Path(r.worktree) / "python")
    assert got == {"traced": {"graphs": 1, "equal": True}, "inductor_equal": True}, got
