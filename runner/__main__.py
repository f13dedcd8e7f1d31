"""Entry point of the runner child: ``python -m runner JOB.json FD``.

The result goes to the report socket FD (runner/channel.py), once, and the process ends with os._exit right
after: never to stdout (nothing the engine or a candidate prints can pose as a result) and never to
a file an exit hook could rewrite. Exceptions become {"ok": false, "error": {...}} results.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path

from runner import channel
from runner.job import UNEXPLAINED_ERROR, Job

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """The kernel kills this process when the bot that started it dies (even by SIGKILL): the child
    runs in a session of its own (bot/jobs.run_job), so a killed bot's process group does not reach
    it, and an orphaned job would keep its GPU. Linux only; elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the bot died before the line above: nobody is waiting for this job
        os._exit(1)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m runner JOB.json FD  (FD: the bot's report socket)", file=sys.stderr)
        return 2
    die_with_parent()
    job_path = Path(argv[0])
    try:
        channel.open_channel(int(argv[1]))
    except (ValueError, OSError) as e:
        print(f"runner: FD {argv[1]!r} is no open file descriptor: {e}", file=sys.stderr)
        return 2
    try:
        job = Job.from_file(job_path)
        if os.environ.get("OPTBOT_JOB_DEVICE"):  # bot/jobs.child_env: cuda:N is this child's only GPU
            job.device = os.environ["OPTBOT_JOB_DEVICE"]
        if os.environ.get("TRITON_INTERPRET") == "1":
            from runner.triton_interpret import instrument

            instrument()
        result = importlib.import_module(f"runner.kinds.{job.kind}").run(job)
    except Exception as e:  # noqa: BLE001 - every failure becomes a typed result for the bot
        kind = getattr(e, "kind", UNEXPLAINED_ERROR)
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        result = {"ok": False, "error": {"kind": kind, "message": f"{type(e).__name__}: {e}", "traceback": tb[-4000:]}}
    channel.finish(result)  # does not return: os._exit, so no exit hook runs after the report
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
