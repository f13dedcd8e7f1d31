"""The graph capture's facts (runner/graph_capture.py) on small models."""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from tests.analyze.toy_helpers import HERE
from runner.graph_capture import capture


class Probe(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("table", torch.arange(8, dtype=torch.float32))

    def forward(self, hidden_states, timestep, extra):
        y = self.lin(hidden_states)  # latents + weights
        y.mul_(2.0)  # in place: work, not an alias
        v = y.view(-1, 8)  # a view: alias
        a = torch.sin(timestep[:, None] * self.table)  # timestep + weights (a buffer)
        b = torch.sin(timestep[:, None] * self.table)  # the same value again
        c = self.table.exp()  # weights only
        return v.sum() + a.sum() + b.sum() + c.sum() + extra.sum()


def _cap(model, **kw):
    def step():
        with torch.inference_mode():
            return model(**kw)
    return capture(model, step, str(HERE))


def test_values_labels_aliases_and_value_numbers():
    m = Probe().eval()
    rec = _cap(m, hidden_states=torch.randn(2, 3, 8), timestep=torch.tensor([0.5]), extra=torch.ones(2))
    ops = rec.ops
    by = {}
    for o in ops:
        by.setdefault(o["op"], []).append(o)
    lab = rec.labels

    def deps(o):
        d = rec.values[o["out"][0]]["deps"]
        return {n for i, n in enumerate(lab) if d >> i & 1}

    assert deps(by["aten::linear"][0]) == {"latents", "weights"}
    assert not by["aten::mul_"][0].get("alias") and by["aten::view"][0].get("alias")
    sins = by["aten::sin"]
    assert deps(sins[0]) == {"timestep", "weights"}
    assert rec.values[sins[0]["out"][0]]["vn"] == rec.values[sins[1]["out"][0]]["vn"]
    assert deps(by["aten::exp"][0]) == {"weights"}
    assert "input:extra" in lab  # an input of unknown role keeps its own label
    lin = by["aten::linear"][0]
    assert rec.modules[lin["m"]][0] == "lin" and rec.sources[lin["s"]].endswith("test_capture.py:" + str(
        next(i for i, line in enumerate(open(__file__), 1) if "y = self.lin(hidden_states)" in line)))
    assert rec.modules[lin["m"]][3].endswith("test_capture.py:" + str(
        next(i for i, line in enumerate(open(__file__), 1) if "y = self.lin(hidden_states)" in line)))
    assert rec.pass_idx == 0


class Att(nn.Module):
    def forward(self, hidden_states, mask):
        q = hidden_states
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_attention_mask_facts():
    x = torch.randn(1, 2, 6, 4)
    cases = [(torch.ones(1, 1, 1, 6, dtype=torch.bool), True), (torch.zeros(1, 1, 1, 6), True),
             (torch.tensor([[[[True] * 5 + [False]]]]), False), (torch.randn(1, 1, 1, 6), False)]
    for mask, nothing in cases:
        rec = _cap(Att(), hidden_states=x, mask=mask)
        att = [o for o in rec.ops if "attention" in o["op"]][0]
        assert att["mask"]["masks_nothing"] is nothing, (mask, att["mask"])
        assert (len(rec.probes) == 1) is nothing
