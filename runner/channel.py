"""The runner child's one report channel to the bot: a Unix SOCK_SEQPACKET socket (the fd the bot
names on the command line), one JSON object per line; each write is one packet, which the kernel
timestamps as it is sent (SO_TIMESTAMPNS on the bot's end), so the bot's clock of a phase does not
depend on when its reader thread gets to run.

- ``{"mark": "start"|"end", "phase": LABEL}``: sent, each in a packet of its own, the moment a timed
  phase starts and ends (runner/timing.py); the kernel stamps each as it is sent, so a claimed total
  that the bot's clock contradicts (a patched ``time.perf_counter`` or ``Event.elapsed_time``) is
  caught (bot/jobs.clock_check).
- the same marks with the phase ``stage:NAME``: where a job's time went (build, correctness, each
  mode), clocked by the bot as well and shown in its progress line (bot/jobs.JobOutcome.took); no
  verdict reads them.
- ``{"result": {...}}``: the job's result, written once by ``finish``, which then ``os._exit``s: no
  atexit hook, finalizer or thread of code the job imported runs after it, so nothing can rewrite
  or add to the report after the fact. The bot accepts exactly one result message.

Code running in this process can still write to the pipe itself; what it writes is checked, never
trusted: a second result, a line that is not an object, or marks that do not pair make the report
"no valid result", and correctness is decided in another process (docs/security.md).
"""
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager

_fd: int | None = None
_phases = 0


def open_channel(fd: int) -> None:
    global _fd
    os.set_inheritable(fd, False)  # processes the job starts do not get it
    _fd = fd


PACKET = 32 * 1024  # under the socket's default send buffer: a packet is written whole or not at all


def _send(message: dict) -> None:
    if _fd is None:
        return  # timing outside a runner child (tests, notebooks): nobody to report to
    data = (json.dumps(message, default=str) + "\n").encode()
    for i in range(0, len(data), PACKET):
        os.write(_fd, data[i:i + PACKET])


@contextmanager
def phase():
    """Bracket a timed phase; yields the label the result's TimingStats carry (`phase`)."""
    global _phases
    label = f"t{_phases}"
    _phases += 1
    _send({"mark": "start", "phase": label})
    yield label
    _send({"mark": "end", "phase": label})


@contextmanager
def stage(name: str):
    """Bracket one stage of a job (the bot prints how long each took, by its own clock)."""
    _send({"mark": "start", "phase": f"stage:{name}"})
    try:
        yield
    finally:  # a stage that raised still ends (a failed mode is a result, not a crash)
        _send({"mark": "end", "phase": f"stage:{name}"})


def finish(result: dict, code: int = 0) -> None:
    """Send the result, flush the log streams and end the process now (os._exit)."""
    try:
        _send({"result": result})
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or replaced stream must not keep us alive
                pass
        os._exit(code)
