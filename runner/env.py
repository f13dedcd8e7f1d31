"""The environment block recorded with every result: which device measured what."""
from __future__ import annotations

import platform
import shutil
import subprocess
import sys


# Facts an engine adapter records about how it ran the engine (e.g. that a stand-in for a missing
# compiled package was used); capture() puts them in every environment block of this process.
_NOTES: dict = {}


def note(key: str, value) -> None:
    _NOTES[key] = value


def noted(key: str):
    """What was noted under `key` in this process, or None."""
    return _NOTES.get(key)


def capture(device: str, engine_sha: str = "", engine_file: str = "") -> dict:
    import torch

    env = {
        "device_kind": "cuda" if device.startswith("cuda") else "cpu",
        "device_name": platform.processor() or platform.machine(),
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "numpy": _version("numpy"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "engine_sha": engine_sha,
        "engine_file": engine_file,
        # how this job's process started: runner/zygote.py notes "forked" when it ran the job in a
        # fork of its warm interpreter; a job it exec'd (cold, or the CUDA driver was mapped by the
        # preload) or one started without a zygote is a fresh interpreter
        "runner_start": "fresh interpreter",
    }
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(idx)
        env.update(device_name=props.name, sm_count=props.multi_processor_count,
                   memory_gb=round(props.total_memory / 2**30, 1), capability=f"{props.major}.{props.minor}",
                   l2_mb=round(getattr(props, "L2_cache_size", 0) / 2**20, 1))
        env["driver"] = _nvidia_smi("driver_version")
    env.update(_NOTES)
    return env


def _version(mod: str):
    try:
        m = __import__(mod)
        return getattr(m, "__version__", None)
    except Exception:  # noqa: BLE001 - a missing optional package is recorded as None
        return None


def _nvidia_smi(field: str):
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


if __name__ == "__main__":  # used by the bot to pick default device/preset
    import json

    import torch

    print(json.dumps({"cuda": torch.cuda.is_available(), "python": sys.version.split()[0]}))
