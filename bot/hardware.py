"""Hardware names: what the knowledge calls a device.

A store entry's `hardware:` list, a lesson's `applies-to.hardware`, the keys of bench.json
`gpu.variant_search` and the hardware a recorded verdict is matched on all use these names, so a
verdict measured on "NVIDIA H200" is found by a run on any H200. Pure Python: imported by the
knowledge, the optimize steps and the agent alike.
"""
from __future__ import annotations

import re


def hardware_name(device: str, device_name: str = "") -> str:
    """cpu for every non-CUDA device; on CUDA the GPU model from the device name ("NVIDIA H200" ->
    "h200"), else a slug of the name, else "cuda"."""
    if not device.startswith("cuda"):
        return "cpu"
    m = re.search(r"\b([A-Z]\d{2,3}[A-Z]?)\b", device_name or "")
    return m[1].lower() if m else (re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "cuda")
