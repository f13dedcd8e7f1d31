"""Entry point of the runner child: ``python -m runner JOB.json RESULT.json``.

The result goes to RESULT.json (written atomically), never to stdout, so nothing the engine or a
candidate prints can pose as a result. Exceptions become {"ok": false, "error": {...}} results.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path

from runner.job import Job, write_result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m runner JOB.json RESULT.json", file=sys.stderr)
        return 2
    job_path, result_path = Path(argv[0]), Path(argv[1])
    try:
        job = Job.from_file(job_path)
        if os.environ.get("OPTBOT_JOB_DEVICE"):  # bot/jobs.child_env: cuda:N is this child's only GPU
            job.device = os.environ["OPTBOT_JOB_DEVICE"]
        if os.environ.get("TRITON_INTERPRET") == "1":
            from runner.triton_interpret import instrument

            instrument()
        result = importlib.import_module(f"runner.kinds.{job.kind}").run(job)
    except Exception as e:  # noqa: BLE001 - every failure becomes a typed result for the bot
        kind = getattr(e, "kind", "exception")
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        result = {"ok": False, "error": {"kind": kind, "message": f"{type(e).__name__}: {e}", "traceback": tb[-4000:]}}
    write_result(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
