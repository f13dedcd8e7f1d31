"""Device lanes: run work items in parallel, at most one at a time per device.

A thread pool alone does not pin items to devices: with `devices[i % n]`, a thread that finishes
early takes the next item, whose index may name a device another thread is still using. Here each
item borrows a free device from a queue and returns it when done.
"""
from __future__ import annotations

import concurrent.futures as futures
import queue
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_on_lanes(fn: Callable[[T, str], R], items: Iterable[T], devices: list[str]) -> list[R]:
    """[fn(item, device) for item in items], in order, each call holding its device exclusively."""
    items = list(items)
    free: queue.Queue[str] = queue.Queue()
    for d in devices:
        free.put(d)

    def one(item: T) -> R:
        dev = free.get()
        try:
            return fn(item, dev)
        finally:
            free.put(dev)

    with futures.ThreadPoolExecutor(max_workers=max(1, len(devices))) as pool:
        return list(pool.map(one, items))
