"""The timing routine's CPU path and its bookkeeping (GPU rules are exercised on the device)."""
from __future__ import annotations

import time

import pytest

from runner.timing import TimingStats, time_interleaved


def test_interleaved_order_and_stats():
    order = []
    res = time_interleaved({"a": lambda: order.append("a"), "b": lambda: (order.append("b"), time.sleep(0.002))},
                           "cpu", warmup=1, iters=4)
    assert order == ["a", "b"] * 5  # one warm-up round, then A/B/A/B...
    a, b = res["a"], res["b"]
    assert a.n == b.n == 4 and a.device == "cpu" and not a.l2_flush
    assert b.median_ms > a.median_ms and b.min_ms >= 2.0


def test_graph_mode_needs_cuda():
    res = time_interleaved({"a": lambda: None}, "cpu", graph=True)
    assert res["a"] == "CUDA-graph mode needs a CUDA device"


def test_stats_from_samples():
    s = TimingStats.from_samples([3.0, 1.0, 2.0, 10.0], "cpu")
    assert (s.median_ms, s.min_ms, s.max_ms, s.n) == (2.5, 1.0, 10.0, 4)
    assert s.stdev_ms == pytest.approx(4.0825, rel=1e-3)


class _EndFailsAfterAnError:
    """Behaves as torch.cuda.graph's context does when the captured code raised: its exit raises
    an error of its own (capture_end: "operation failed due to a previous error during capture")."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        return False


def test_a_failed_capture_reports_the_first_error_not_capture_end():
    from runner.timing import captured

    def step():
        raise ValueError("the stack's kernel launched on a side stream")

    with pytest.raises(ValueError, match="side stream") as info:
        captured(_EndFailsAfterAnError(), step)
    assert "previous error during capture" in str(info.value.__cause__)  # the end's error is kept, chained
    assert captured(_EndFailsAfterAnError(), lambda: 7) == 7


@pytest.mark.gpu
def test_a_host_sync_inside_a_real_capture_is_named():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from runner.timing import capture_graph

    x = torch.ones(4, device="cuda")
    with pytest.raises(Exception) as info:
        capture_graph(lambda: (x * 2).sum().item())
    assert "previous error during capture" not in str(info.value), info.value
