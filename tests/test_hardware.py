"""Hardware names (bot/hardware.py): what the store, the lessons and recorded verdicts call a device."""
from __future__ import annotations

from bot.hardware import hardware_name


def test_hardware_names():
    assert hardware_name("cuda", "NVIDIA H200") == "h200" and hardware_name("cuda:1", "NVIDIA H100 80GB HBM3") == "h100"
    assert hardware_name("cpu") == "cpu" and hardware_name("cpu", "NVIDIA H200") == "cpu"
    assert hardware_name("cuda", "NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    assert hardware_name("cuda") == "cuda"
