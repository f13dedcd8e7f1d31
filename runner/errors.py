"""One line that names why a piece of runner work failed: it becomes a verdict's reason, a bench
row's note, a kernel test's result, so it must carry the cause, not a header.

Some errors put their cause on the lines after a header: torch.compile's `BackendCompilerFailed`
reads "backend='inductor' raised:" and then the inductor error. The first line alone named
nothing (an H200 bench of the Qwen-Image stack under compile + CUDA graph, 2026-12-04), so a first
line that ends in ':' takes the next non-empty line with it.
"""
from __future__ import annotations

LIMIT = 400  # characters of message kept


def error_line(e: BaseException, limit: int = LIMIT) -> str:
    """`Type: message`, the message cut to `limit` characters."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = lines[0] if lines else ""
    if msg.endswith(":") and len(lines) > 1:  # a header: what it announces is the cause
        msg = f"{msg} {lines[1]}"
    return f"{type(e).__name__}: {msg[:limit]}"
