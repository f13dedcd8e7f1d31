"""benchmarks/norm_quant_proto.py (a prototype the GPU micro times, not a store entry): under the
Triton interpreter its e4m3 values and scales are the unfused ops' (LayerNorm, modulation, torchao's
per-row quantization), within one e4m3 step where a last bit of the norm moved a value. Run in a child
process: triton.jit picks the interpreter when a kernel is defined, from TRITON_INTERPRET."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, importlib.util, torch
spec = importlib.util.spec_from_file_location("norm_quant_proto", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
out = []
for dtype in (torch.float32, torch.bfloat16):
    for M, D in ((7, 3072), (3, 200)):
        g = torch.Generator().manual_seed(M * D)
        x = (torch.randn(M, D, generator=g) * 3 + 0.5).to(dtype)
        shift = (torch.randn(D, generator=g) * 0.5).to(dtype)
        scale = (torch.randn(D, generator=g) * 0.5).to(dtype)
        q, s = m.norm_modulate_quant(x, shift, scale)
        rq, rs = m.reference(x, shift, scale)
        moved = q.view(torch.uint8) != rq.view(torch.uint8)
        dq, drq = q.float()[moved], rq.float()[moved]
        one_step = bool(((dq - drq).abs() <= torch.maximum(drq.abs() / 8, torch.full_like(drq, 2.0 ** -9))).all())
        out.append({"case": f"{dtype} {M}x{D}", "q": [str(q.dtype), list(q.shape)], "s": list(s.shape),
                    "moved": int(moved.sum()), "n": q.numel(), "one_step": one_step,
                    "scale_rel": float(((s - rs).abs() / rs.abs()).max())})
try:
    m.norm_modulate_quant(torch.randn(2, 8), torch.randn(8), torch.randn(4))
    out.append({"refused": False})
except ValueError as e:
    out.append({"refused": "shift and scale" in str(e)})
print(json.dumps(out))
"""


def test_codes_and_scales_are_the_unfused_ops_and_bad_shapes_are_refused():
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "benchmarks/norm_quant_proto.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    *cases, refusal = json.loads(r.stdout.strip().splitlines()[-1])
    assert refusal == {"refused": True}
    assert len(cases) == 4
    for c in cases:
        assert c["q"][0] == "torch.float8_e4m3fn" and c["q"][1][0] * c["q"][1][1] == c["n"] and c["s"][1] == 1, c
        assert c["scale_rel"] <= 2 ** -7, c  # one bf16 step at most (float32: the norm's last bits)
        assert c["moved"] <= 0.01 * c["n"] and c["one_step"], c
