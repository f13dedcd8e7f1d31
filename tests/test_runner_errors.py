"""runner/errors.error_line: the one line a failed mode, kernel test or config reports must name
the cause, also where the exception puts it after a header line (torch.compile's
BackendCompilerFailed, the H200 Qwen-Image stack under compile + CUDA graph, 2026-12-04)."""
from __future__ import annotations

import pytest
import torch

from runner.errors import LIMIT, error_line


def test_a_compile_failure_names_what_the_backend_raised():
    def failing_backend(gm, example_inputs):
        raise ValueError("the cause: a view of an input was written under capture")

    torch._dynamo.reset()
    f = torch.compile(lambda x: x.sin() + 1, backend=failing_backend)
    with pytest.raises(Exception) as info:
        f(torch.randn(4))
    e = info.value
    assert type(e).__name__ == "BackendCompilerFailed"
    assert str(e).splitlines()[0].rstrip().endswith(":")  # the header the old first-line rule kept alone
    line = error_line(e)
    assert line.startswith("BackendCompilerFailed: backend='failing_backend' raised:")
    assert "ValueError: the cause: a view of an input was written under capture" in line
    assert "\n" not in line


def test_an_ordinary_error_keeps_its_first_line_and_type():
    e = RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture\nsecond line\nthird")
    assert error_line(e) == "RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph capture"


def test_empty_messages_and_long_messages():
    assert error_line(KeyError()) == "KeyError: "
    assert error_line(MemoryError("x" * 5000)) == "MemoryError: " + "x" * LIMIT
    # a header with nothing after it stays as it is
    assert error_line(RuntimeError("raised:\n\n   ")) == "RuntimeError: raised:"
