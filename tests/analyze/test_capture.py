"""The graph capture's facts (runner/graph_capture.py) on small models."""
from __future__ import annotations

import ctypes
import json

import pytest
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


# ---- in-place writes: the buffer and its views carry what was written ------------------------------
class Writer(nn.Module):
    """Writes a prompt projection into a buffer made from a weight, one way per `how`, with a view
    of the buffer taken before the write; reads the buffer before the write, then the buffer, the
    early view and a view taken after the write (each read is one aten::exp, in that order)."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.proj = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(2, 6, 8))

    def forward(self, hidden_states, encoder_hidden_states):
        p = self.proj(encoder_hidden_states)  # [2, 4, 8] prompt + weights
        if self.how == "empty_like-copy_":
            buf = torch.empty_like(self.w)
        else:
            buf = self.w.new_zeros(2, 6, 8)
        early = buf.view(2, 48)
        buf.exp()  # read before the write: weights only
        if self.how == "slice-assign":
            buf[:, :4] = p  # slice, then copy_ on the slice
        elif self.how == "empty_like-copy_":
            buf[:, :4].copy_(p)
            buf[:, 4:].copy_(self.w[:, 4:])
        elif self.how == "index_put_":
            buf[torch.tensor([0, 1])] = torch.cat([p, p[:, :2]], 1)
        elif self.how == "scatter_":
            buf.scatter_(1, torch.zeros(2, 4, 8, dtype=torch.long), p)
        elif self.how == "out=":
            torch.mul(torch.cat([p, p[:, :2]], 1), 2.0, out=buf)
        elif self.how == "weights-only":  # the control: nothing from the prompt is written
            buf[:, :4] = self.w[:, :4] * 2.0
        buf.exp()
        early.exp()
        buf[:, 1:].exp()
        return hidden_states.sum()


@pytest.mark.parametrize("how", ["slice-assign", "empty_like-copy_", "index_put_", "scatter_", "out="])
def test_inplace_writes_give_the_buffer_and_its_views_the_written_dependencies(how):
    rec = _cap(Writer(how).eval(), hidden_states=torch.randn(2, 3), encoder_hidden_states=torch.randn(2, 4, 8))
    exps = [o for o in rec.ops if o["op"] == "aten::exp"]
    deps = [_labels(rec, o["out"][0]) for o in exps]
    if how == "empty_like-copy_":  # read before any write: uninitialized, what an unseen kernel wrote
        assert "unseen" in deps[0] and exps[0].get("uninit"), deps
    else:
        assert deps[0] == {"weights"}, deps  # before the write
    for d in deps[1:]:  # the buffer, the view taken before the write, a view taken after it
        assert {"prompt", "weights"} <= d and "latents" not in d, (how, deps)
    vn = [rec.values[o["out"][0]]["vn"] for o in exps]
    assert vn[1] != vn[0], "the same op on the buffer before and after a write is not the same value"
    writers = [o for o in rec.ops if o.get("wr")]
    assert writers, "the write gave new values to the tensors sharing its storage"
    if how == "out=":
        mul = next(o for o in rec.ops if o["op"] == "aten::mul")
        assert "prompt" in _labels(rec, mul["out"][0])


def test_a_buffer_written_from_weights_only_stays_weights_only():
    rec = _cap(Writer("weights-only").eval(), hidden_states=torch.randn(2, 3), encoder_hidden_states=torch.randn(2, 4, 8))
    exps = [o for o in rec.ops if o["op"] == "aten::exp"]
    assert [_labels(rec, o["out"][0]) for o in exps] == [{"weights"}] * 4
    vn = [rec.values[o["out"][0]]["vn"] for o in exps]
    assert vn[1] != vn[0]  # written, so a new value, even if of the same labels


def test_empty_tensors_share_no_storage():
    """Every empty tensor's storage has address 0: a write into one is not a write into another,
    and an op on an empty input that returns another empty tensor is no alias."""
    class Empties(nn.Module):
        def forward(self, hidden_states, encoder_hidden_states):
            a = hidden_states.new_zeros(0)
            b = torch.zeros(0)
            a.add_(encoder_hidden_states.sum())
            return b.exp(), torch.cat([a, b])

    rec = _cap(Empties().eval(), hidden_states=torch.randn(2, 3), encoder_hidden_states=torch.randn(2, 4))
    exp = next(o for o in rec.ops if o["op"] == "aten::exp")
    assert "prompt" not in _labels(rec, exp["out"][0])
    assert not next(o for o in rec.ops if o["op"] == "aten::cat").get("alias")


class WithTable(nn.Module):
    """A plain tensor attribute (not a parameter or buffer): a constant numbered at capture."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.table = torch.randn(4)

    def forward(self, hidden_states, encoder_hidden_states):
        return self.lin(hidden_states) * self.table + encoder_hidden_states.mean()


def test_the_same_model_captures_to_the_same_graph():
    """Two instances built alike capture to identical graphs: nothing in the graph comes from
    object identity (a constant's value number is its order of first sight, not its id())."""
    graphs = []
    for _ in range(2):
        torch.manual_seed(0)
        m = WithTable().eval()
        kw = dict(hidden_states=torch.ones(2, 4), encoder_hidden_states=torch.ones(2, 3))
        graphs.append(json.dumps(_cap(m, **kw).to_json(), sort_keys=True))
    assert graphs[0] == graphs[1]
    assert '"const:external"' in graphs[0]


def _labels(rec, vid):
    d = rec.values[vid]["deps"]
    return {n for i, n in enumerate(rec.labels) if d >> i & 1}


class UnseenWriter(nn.Module):
    """SGLang's fused kernels, in small: a kernel the dispatcher cannot see (here a raw memmove,
    like a Triton launch) writes the scaled latents into a tensor from torch.empty_strided, and a
    linear reads it; twice, with other contents of the same shape. A buffer written visibly
    (copy_ into torch.empty) is the control."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.lin2 = nn.Linear(8, 8)

    def forward(self, hidden_states, encoder_hidden_states):
        ys = []
        for scale in (2.0, 3.0):
            h = hidden_states * scale
            buf = torch.empty_strided(h.shape, h.stride(), dtype=h.dtype)
            ctypes.memmove(buf.data_ptr(), h.data_ptr(), h.numel() * h.element_size())
            ys.append(self.lin(buf.view(-1, 8)))  # reads what the unseen kernel wrote
        table = torch.empty(4, 8)
        table.copy_(self.lin2.weight[:4])  # visible: weights only, a constant
        return ys, self.lin2(table)


def test_a_read_of_memory_no_visible_op_wrote_depends_on_everything():
    x = torch.randn(2, 3, 8)
    m = UnseenWriter().eval()
    rec = _cap(m, hidden_states=x, encoder_hidden_states=torch.randn(2, 4))
    lins = [o for o in rec.ops if o["op"] == "aten::linear"]
    assert len(lins) == 3
    for o in lins[:2]:
        assert {"latents", "timestep", "prompt", "unseen"} <= _labels(rec, o["out"][0]), _labels(rec, o["out"][0])
        assert o.get("uninit")
    # the same op on two buffers of one shape that unseen kernels filled differently: not one value
    assert rec.values[lins[0]["out"][0]]["vn"] != rec.values[lins[1]["out"][0]]["vn"]
    assert not lins[2].get("uninit") and _labels(rec, lins[2]["out"][0]) == {"weights", "const"}
    with torch.inference_mode():  # the unseen writes did happen: the model computed on the latents
        ys, _ = m(x, torch.zeros(2, 4))
        assert torch.allclose(ys[1], m.lin((x * 3.0).view(-1, 8)))
