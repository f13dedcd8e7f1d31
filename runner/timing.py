"""The one timing routine of the project. Its rules, and why (docs/timing.md says more):

1. Warm-up calls first: module loading, Triton JIT, cuBLAS/cuDNN handle and heuristic selection and
   the caching allocator's first growth must not land in a timed trial.
2. GPU trials are bracketed by CUDA events on the current stream, and the whole device is
   synchronized (all streams) before and after. A trial's time is max(event time, host wall time
   from before the start event to after the final synchronize): events alone would miss work a
   candidate hides on a side stream; the wall clock cannot.
3. Before every GPU trial the L2 is flushed by writing a buffer at least twice its size, outside the
   events: a kernel must not look fast because the previous trial left its inputs in cache.
4. Several trials; we report median (robust to stragglers), min, max, mean, stdev and N. Never one run.
5. Several callables are timed interleaved (A/B/A/B...), so clock or thermal drift hits all alike.
6. CPU trials use time.perf_counter() and are labelled cpu: they never stand in for GPU numbers.
7. Graph mode: the callable is captured once into a CUDA graph and each trial replays it; a capture
   failure is returned as a reason, not raised.
8. The trials are one phase of the report channel (runner/channel.py): the bot clocks the phase
   itself and holds a result whose samples add up to less time than the bot saw pass
   (bot/jobs.clock_check): a patched clock in the child cannot make a step look faster.
"""
from __future__ import annotations

import statistics
from contextlib import contextmanager
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from runner import channel
from runner.errors import error_line


@dataclass
class TimingStats:
    device: str  # "cuda" | "cpu": which clock measured this
    median_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    stdev_ms: float
    n: int
    samples_ms: list[float] = field(default_factory=list)
    mode: str = "eager"  # eager | graph
    l2_flush: bool = False
    phase: str = ""  # the report channel's phase these samples were taken in (runner/channel.py)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_samples(cls, samples: list[float], device: str, **kw) -> "TimingStats":
        return cls(device=device, median_ms=statistics.median(samples), min_ms=min(samples),
                   max_ms=max(samples), mean_ms=statistics.fmean(samples),
                   stdev_ms=statistics.stdev(samples) if len(samples) > 1 else 0.0, n=len(samples),
                   samples_ms=[round(s, 5) for s in samples], **kw)


_flush_buf: dict[int, torch.Tensor] = {}


def _l2_flush_buffer(device: torch.device) -> torch.Tensor:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _flush_buf:
        l2 = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 0) or 64 * 2**20
        _flush_buf[idx] = torch.empty(2 * l2 // 4 + 1024, dtype=torch.int32, device=device)
    return _flush_buf[idx]


def time_interleaved(fns: dict[str, Callable[[], object]], device: str, *, warmup: int = 2, iters: int = 10,
                     flush_l2: bool = True, graph: bool = False, pause_s: float = 0.0) -> dict[str, TimingStats | str]:
    """Time each callable `iters` times, interleaved in round-robin order.

    Returns name -> TimingStats, or name -> reason string when graph capture failed for that one.
    pause_s idles the host (and so the device) between trials; only ceiling measurements use it.
    """
    dev = torch.device(device)
    is_cuda = dev.type == "cuda"
    runners: dict[str, Callable[[], object]] = {}
    out: dict[str, TimingStats | str] = {}
    for name, fn in fns.items():
        if graph:
            if not is_cuda:
                out[name] = "CUDA-graph mode needs a CUDA device"
                continue
            try:
                runners[name] = capture_graph(fn, warmup)
            except Exception as e:  # noqa: BLE001 - a capture failure is a reported result
                out[name] = f"CUDA graph capture failed: {error_line(e)}"
                torch.cuda.synchronize()
        else:
            runners[name] = fn
    if not graph:
        for _ in range(warmup):
            for fn in runners.values():
                fn()
    if is_cuda:
        torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in runners}
    # A phase that idles between trials (pause_s) is not clock-checked: its samples are far less
    # than the time that passes, by design.
    with channel.phase() if not pause_s else _unchecked() as label:
        for _ in range(iters):
            for name, fn in runners.items():
                if pause_s:
                    time.sleep(pause_s)
                samples[name].append(_one_trial(fn, dev, flush_l2 and is_cuda))
    for name, s in samples.items():
        out[name] = TimingStats.from_samples(s, "cuda" if is_cuda else "cpu", mode="graph" if graph else "eager",
                                             l2_flush=flush_l2 and is_cuda, phase=label)
    return out


@contextmanager
def _unchecked():
    yield ""


def time_fn(fn: Callable[[], object], device: str, **kw) -> TimingStats:
    res = time_interleaved({"fn": fn}, device, **kw)["fn"]
    if isinstance(res, str):
        raise RuntimeError(res)
    return res


def _one_trial(fn: Callable[[], object], dev: torch.device, flush: bool) -> float:
    if dev.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    if flush:
        _l2_flush_buffer(dev).zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()  # the whole device: work hidden on a side stream is waited for ...
    wall = (time.perf_counter() - t0) * 1e3
    # ... and counted: events see only the current stream, the host clock sees everything. The wall
    # clock adds a few microseconds of launch/sync latency, the same for every callable compared.
    return max(start.elapsed_time(end), wall)


def captured(capture, fn: Callable[[], object]) -> object:
    """fn() inside the capture context, raising the error fn raised rather than the one capture's
    end raises after it: when fn fails mid-capture, torch.cuda.graph's exit fails too ("operation
    failed due to a previous error during capture") and Python would report only that. Measured on
    the H200: Qwen-Image's stack under compile + CUDA graph said only that, the cause was lost."""
    first: BaseException | None = None
    try:
        with capture:
            try:
                return fn()
            except BaseException as e:
                first = e
                raise
    except BaseException as end:
        if first is not None and end is not first:
            raise first from end
        raise


def capture_graph(fn: Callable[[], object], warmup: int = 2) -> Callable[[], object]:
    """Capture fn into a CUDA graph; the returned callable replays it and returns the outputs that
    the captured call produced (static tensors the replay rewrites). Raises if capture fails."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    static_out = captured(torch.cuda.graph(g), fn)
    torch.cuda.synchronize()

    def replay():
        g.replay()
        return static_out

    return replay
