"""Transcripts: every request and response of an agent, one JSON object per line, in the run
directory (run_dir/agent/<agent>.jsonl). Written as they happen (flushed), so a run that dies keeps
what it had."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path


class Transcript:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, kind: str, **data) -> None:
        rec = {"t": round(time.time(), 3), "type": kind, **data}
        line = json.dumps(rec, default=str, ensure_ascii=False)
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()

    @staticmethod
    def read(path: Path) -> list[dict]:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
