"""What the runner sandbox adds to one job: the same probe job (kind=probe: start the runner, import
torch, report the environment) run N times with OPTBOT_SANDBOX=off and on, interleaved.

    python benchmarks/sandbox_cost.py [N] [--device cpu|cuda]

Prints one JSON object: per mode the job wall times (seconds, the bot's clock) and their median; the
difference of the medians is the set-up cost of the sandbox per job. The device only decides what the
probe imports and checks; the cost measured is process start-up either way."""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bot.jobs import run_job  # noqa: E402
from runner.job import Job  # noqa: E402


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv and argv[0].isdigit() else 10
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
    times: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(kind="probe", workload={}, preset="tiny", device=device, dtype="float32", engine_root=tmp,
                  engine_sha="sandbox-cost", model_class="m.C", shapes=[])
        for i in range(n + 1):
            for mode in ("off", "on"):
                os.environ["OPTBOT_SANDBOX"] = mode
                out = run_job(job, Path(tmp) / f"{mode}{i}", timeout_s=300, name="probe")
                if not out.ok:
                    raise SystemExit(f"probe job failed with OPTBOT_SANDBOX={mode}: {out.reason()}\n{out.log_tail}")
                if i:  # the first round warms the page cache (and the sandbox's preflight)
                    times[mode].append(round(out.seconds, 4))
    med = {m: statistics.median(t) for m, t in times.items()}
    print(json.dumps({"device": device, "n": n, "seconds": times, "median_s": med,
                      "sandbox_cost_per_job_s": round(med["on"] - med["off"], 4)}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
