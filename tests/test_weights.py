"""runner/weights.py: the load hooks a candidate's model defines run after its weights load, before any
quantization, each once: optbot_after_load first, then every optbot_after_load_<name> in name order (so
that two store entries that each convert at load compose in one stack), for seeded weights and for a
checkpoint alike."""
from __future__ import annotations

import torch
from torch import nn

from runner.weights import after_load, build_model


class _Model(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.a = nn.Linear(dim, dim)
        self.b = nn.Linear(dim, dim)
        self.calls: list[str] = []

    def optbot_after_load_zeta(self):
        self.calls.append("zeta")

    def optbot_after_load(self):
        # sees the loaded weights, not meta tensors
        assert self.a.weight.device.type != "meta"
        self.calls.append("base")

    def optbot_after_load_alpha(self):
        self.calls.append("alpha")

    def optbot_after_loading(self):  # shares the prefix, is not a hook
        self.calls.append("not a hook")


class _Plain(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.a = nn.Linear(dim, dim)


def test_hooks_run_once_each_base_first_then_by_name():
    m = build_model(_Model, {"dim": 16}, "cpu", torch.float32, weight_seed=1)
    assert m.calls == ["base", "alpha", "zeta"]
    assert not m.training


def test_a_model_without_hooks_loads_and_runs_none():
    m = build_model(_Plain, {"dim": 16}, "cpu", torch.float32, weight_seed=1)
    assert after_load(m) == []


def test_a_checkpoint_gets_the_same_hooks(tmp_path, monkeypatch):
    # from_pretrained's path (a real checkpoint) calls the same hooks as seeded weights
    def from_pretrained(path, torch_dtype=None):
        assert path == str(tmp_path)
        return _Model(16).to(torch_dtype)
    monkeypatch.setattr(_Model, "from_pretrained", staticmethod(from_pretrained), raising=False)
    m = build_model(_Model, {}, "cpu", torch.float32, weight_seed=0, weights=str(tmp_path))
    assert m.calls == ["base", "alpha", "zeta"]
