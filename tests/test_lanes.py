"""bot.lanes: no two items ever hold the same device at once, whatever order they finish in."""
from __future__ import annotations

import threading
import time

from bot.lanes import map_on_lanes


def test_one_item_per_device_at_a_time():
    busy: dict[str, int] = {}
    worst = []
    lock = threading.Lock()

    def work(i: int, dev: str) -> tuple[int, str]:
        with lock:
            busy[dev] = busy.get(dev, 0) + 1
            worst.append(busy[dev])
        time.sleep(0.05 if i % 3 else 0.2)  # uneven durations: early finishers take the next item
        with lock:
            busy[dev] -= 1
        return i, dev

    out = map_on_lanes(work, range(9), ["cuda:0", "cuda:1"])
    assert [i for i, _ in out] == list(range(9))  # results in item order
    assert max(worst) == 1
    assert {d for _, d in out} == {"cuda:0", "cuda:1"}
