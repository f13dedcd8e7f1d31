"""qwen-image-linear-gelu-epilogue (a patch-only entry: cuBLASLt's GELU epilogue is the kernel): on the
patched engine's GELU module, the fused path gives the unfused values (to float32 rounding) on the CPU and runs as the
registered op (one node in the dispatch); a quantized-looking projection (a Linear subclass, a weight
that is not a plain Parameter), a linear without bias, an exact-GELU module and training (the op has no
backward) keep the unfused forward;
under torch.compile(fullgraph=True) the module is one optbot::linear_gelu_tanh node, no graph break.
The store check validates the entry on the tiny Qwen-Image model; the CUDA path (torch._addmm_activation)
is timed and checked on the H200 (benchmarks/gemm_gelu.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from bot.generate.replay import apply_entry
from bot.knowledge.location import SHIPPED_STORE
from bot.knowledge.store import get_entry

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent('''
    import json, sys
    import torch
    import torch.nn.functional as F
    from torch import nn
    from diffusers.models import activations as act

    torch.manual_seed(0)
    torch.set_grad_enabled(False)  # inference, as a serving engine (and optbot's runner) runs the model
    calls = []
    real_op = act._OPTBOT_LINEAR_GELU
    act._OPTBOT_LINEAR_GELU = lambda *a: (calls.append(1), real_op(*a))[1]

    def unfused(m, x):
        return F.gelu(F.linear(x, m.proj.weight, m.proj.bias), approximate=m.approximate)

    res = {}
    x = torch.randn(2, 5, 8)
    m = act.GELU(8, 12, approximate="tanh")
    # the CPU path's product and bias add are two ops (addmm is one): float32 rounding apart, no more
    res["fused_equal"] = torch.allclose(m(x), unfused(m, x), rtol=1e-6, atol=1e-6)
    res["fused_calls"] = len(calls)

    class QuantLinear(nn.Linear):  # a quantized linear is its own class
        pass

    for name, mod in (("subclass", act.GELU(8, 12, approximate="tanh")), ("no_bias", act.GELU(8, 12, approximate="tanh", bias=False)),
                      ("exact", act.GELU(8, 12)), ("plain_tensor_weight", act.GELU(8, 12, approximate="tanh"))):
        if name == "subclass":
            q = QuantLinear(8, 12)
            q.load_state_dict(mod.proj.state_dict())
            mod.proj = q
        if name == "plain_tensor_weight":
            w = mod.proj.weight.detach().clone()
            del mod.proj.weight
            mod.proj.weight = w  # not an nn.Parameter (a tensor-subclass weight looks like this to type())
        calls.clear()
        res[name] = {"equal": torch.equal(mod(x), unfused(mod, x)), "calls": len(calls)}

    calls.clear()
    with torch.enable_grad():  # training: the op has no backward, so the unfused path runs
        t = act.GELU(8, 12, approximate="tanh")
        t(x).sum().backward()
        res["training"] = {"calls": len(calls), "grad": t.proj.weight.grad is not None}

    act._OPTBOT_LINEAR_GELU = real_op
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
        return gm

    c = torch.compile(m, backend=backend, fullgraph=True)
    res["compiled_equal"] = torch.allclose(c(x), unfused(m, x), rtol=1e-6, atol=1e-6)
    res["graphs"] = graphs
    print(json.dumps(res))
''')


def test_fused_gelu_module_on_the_patched_engine(diffusers_engine, tmp_path):
    r = apply_entry(diffusers_engine, get_entry("qwen-image-linear-gelu-epilogue", SHIPPED_STORE), name="test-linear-gelu")
    assert r.status == "applied", r.reason
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(r.worktree) / "src"), str(ROOT)])
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["fused_equal"] and res["fused_calls"] == 1, res
    for name in ("subclass", "no_bias", "exact", "plain_tensor_weight"):
        assert res[name] == {"equal": True, "calls": 0}, (name, res[name])
    assert res["training"] == {"calls": 0, "grad": True}, res["training"]
    assert res["compiled_equal"], res
    assert len(res["graphs"]) == 1 and "optbot.linear_gelu_tanh.default" in res["graphs"][0], res["graphs"]
    assert not any("gelu" in t and "optbot" not in t for t in res["graphs"][0]), res["graphs"]
