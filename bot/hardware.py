"""Hardware names: what the knowledge calls a device.

A store entry's `hardware:` list, a lesson's `applies-to.hardware`, the keys of bench.json
`gpu.variant_search` and the hardware a recorded verdict is matched on all use these names, so a
verdict measured on "NVIDIA H200" is found by a run on any H200. Pure Python: imported by the
knowledge, the optimize steps and the agent alike.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


def hardware_name(device: str, device_name: str = "") -> str:
    """cpu for every non-CUDA device; on CUDA the GPU model from the device name ("NVIDIA H200" ->
    "h200"), else a slug of the name, else "cuda"."""
    if not device.startswith("cuda"):
        return "cpu"
    m = re.search(r"\b([A-Z]\d{2,3}[A-Z]?)\b", device_name or "")
    return m[1].lower() if m else (re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "cuda")


# ---------------------------------------------------------------- self-hosted runner labels (issue 15)
# The GPU query every runner tool uses; its CSV lines (`--format=csv,noheader`) parse into Gpu.
NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")


@dataclass(frozen=True)
class Gpu:
    index: int  # the line's position: nvidia-smi lists GPUs in index (PCI bus) order
    name: str  # "NVIDIA H200"
    driver: str  # "570.124.06"
    memory_mib: int | None  # None where the driver says [N/A] (unified memory)


def parse_gpus(csv_text: str) -> list[Gpu]:
    """The GPUs of `nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`;
    a line of another shape raises ValueError naming it."""
    gpus = []
    for line in (ln.strip() for ln in csv_text.splitlines()):
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        mem = re.fullmatch(r"(\d+) MiB|\[N/A\]|\[Not Supported\]", parts[-1]) if len(parts) == 3 else None
        if mem is None or not parts[0]:
            raise ValueError(f"nvidia-smi line {line!r}: expected 'NAME, DRIVER, MEMORY MiB'")
        gpus.append(Gpu(len(gpus), parts[0], parts[1], int(mem[1]) if mem[1] else None))
    return gpus


def runner_labels(gpus: list[Gpu]) -> list[str]:
    """The labels a self-hosted runner owning these GPUs registers with: `gpu`, each GPU model's
    hardware name (the names the store and lessons use: "NVIDIA H200" -> h200), and `gpus-N` for
    the count, so a workflow asks for `runs-on: [self-hosted, h200, gpus-8]`. No GPU: no label."""
    if not gpus:
        return []
    models = sorted({hardware_name("cuda", g.name) for g in gpus})
    return ["gpu", *models, f"gpus-{len(gpus)}"]
