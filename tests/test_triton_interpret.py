"""On CPU, interpreted Triton launches show up in the profile under their kernel's name."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_interpreted_kernel_is_profiled_as_its_own_op(tmp_path):
    code = textwrap.dedent('''
        import json, torch, triton, triton.language as tl
        from runner.triton_interpret import instrument
        from runner.profiler import profile_step
        assert instrument()

        @triton.jit
        def _double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(y_ptr + i, 2 * tl.load(x_ptr + i, mask=m), mask=m)

        class M(torch.nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                _double_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
                return y + 1

        m, x = M(), torch.randn(100)
        assert torch.allclose(m(x), 2 * x + 1)
        p = profile_step(m, lambda: m(x), "cpu", __import__("pathlib").Path(r"TMP") / "t.json.gz")
        print(json.dumps([k["name"] for k in p["kernels"]]))
    ''').replace("TMP", str(tmp_path))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "triton::_double_kernel" in r.stdout


def test_cpu_jobs_run_triton_interpreted():
    from bot.jobs import child_env

    assert child_env("/e", "cpu")["TRITON_INTERPRET"] == "1"
    assert "TRITON_INTERPRET" not in child_env("/e", "cuda") or os.environ.get("TRITON_INTERPRET")
