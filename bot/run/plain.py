"""Plain-text stand-ins for the two rich classes the orchestrator uses, for machines without rich
(the offline GPU box carries only what the runner and the bot strictly need)."""
from __future__ import annotations

import contextlib
import sys


class Console:
    def __init__(self, stderr: bool = True):
        self.file = sys.stderr if stderr else sys.stdout

    def print(self, obj="") -> None:
        if isinstance(obj, Table):
            obj = obj.render()
        print(obj, file=self.file, flush=True)

    @contextlib.contextmanager
    def status(self, text: str, spinner: str = ""):
        print(text, file=self.file, flush=True)
        yield


class Table:
    def __init__(self, title: str = ""):
        self.title, self.columns, self.rows = title, [], []

    def add_column(self, name: str, **kw) -> None:
        self.columns.append(name)

    def add_row(self, *cells: str) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        rows = [self.columns] + self.rows
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.columns))]
        lines = [self.title] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join(lines)
