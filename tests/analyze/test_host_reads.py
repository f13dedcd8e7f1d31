"""Values the dispatcher cannot follow: prompt lengths read back to the host (tolist) and used to
build positions, and a write it never sees, caught by the output fingerprints (runner/graph_capture.py
"Host reads"; bot/analyze/detectors/cfg_invariant.py condition 4)."""
from __future__ import annotations

import torch
from torch import nn

from bot.analyze.detectors import Context, run_all
from bot.analyze.cost import attribute
from bot.analyze.graph import Graph
from runner.graph_capture import capture
from tests.analyze.toy_helpers import HERE, ROLES, kinds


class Lengths(nn.Module):
    """As Lumina2's RoPE does: lengths off the text mask, then position ids filled from them."""

    def forward(self, mask):
        lens = mask.sum(1).tolist()
        pos = torch.zeros(len(lens), mask.shape[1], dtype=torch.int64)
        for i, n in enumerate(lens):
            pos[i, :n] = torch.arange(n)
            pos[i, n:] = n
        return pos, lens


class ByLength(nn.Module):
    def __init__(self):
        super().__init__()
        self.lengths = Lengths()
        self.emb = nn.Embedding(32, 16)
        self.lat = nn.Linear(8, 16)

    def forward(self, pixels, words, tau, mask):
        pos, lens = self.lengths(mask)
        rope = self.emb(pos) * 2.0  # depends on the prompt's length
        pad = torch.ones(1, max(lens), 16)  # made by the caller from the returned lengths
        x = torch.tanh(self.lat(pixels))  # the latents alone: the same in both passes
        return x.sum() + rope.sum() + pad.sum() + words.mean() + tau.sum()


def _passes(lengths):
    g = torch.Generator().manual_seed(0)
    pixels, tau = torch.randn(1, 4, 8, generator=g), torch.full((1,), 0.5)
    out = []
    for n in lengths:
        mask = torch.zeros(1, 12, dtype=torch.bool)
        mask[:, :n] = True
        out.append({"pixels": pixels, "words": torch.randn(1, 12, 24, generator=g), "tau": tau, "mask": mask})
    return out


def _analyze(model, passes, fingerprints=False):
    model = model.eval()

    def step():
        with torch.inference_mode():
            return [model(**kw) for kw in passes]

    step()
    rec = capture(model, step, str(HERE), ROLES, fingerprints=fingerprints)
    g = Graph.from_json({**rec.to_json(), "device": "cpu", "probes": []})
    profile = {"kernels": [], "device": "cpu", "total_ms": 1.0, "busy_ms": 1.0, "idle_ms": None, "passes": len(passes),
               "peaks": {"copy_gbps": 20.0, "matmul_tflops": 0.2}, "env": {"device_kind": "cpu", "device_name": "test"}}
    ctx = Context(graph=g, cost=attribute(g, profile, "test"), profile=profile)
    return run_all(ctx, ["cfg-invariant-cache", "hoist-constant"]), g, rec


def _ids(findings, kind, detail=None):
    return {i for f in findings if f.kind == kind and (detail is None or f.detail == detail) for i in f.op_ids}


def test_positions_built_from_host_read_lengths_carry_the_text_mask():
    findings, g, rec = _analyze(ByLength(), _passes([9, 3]))
    assert [h["how"] for h in rec.host_reads] == ["tolist", "tolist"]
    by = {n: [o for o in g.ops if o.name == n] for n in ("embedding", "ones", "linear", "tanh")}
    for o in by["embedding"] + by["ones"]:
        assert "text_mask" in g.deps(o.outputs[0]), (o.op, g.deps(o.outputs[0]))
    cfg, load_time = _ids(findings, "cfg-invariant-cache"), _ids(findings, "hoist-constant", "load-time")
    for o in by["embedding"] + by["ones"]:
        assert o.id not in cfg and o.id not in load_time
    # the control: the latents' projection is still found recomputed in pass 2
    second = {o.id for o in by["linear"] + by["tanh"] if o.pass_idx == 1}
    assert second and second <= cfg


def test_without_the_host_read_rule_the_positions_would_look_constant():
    """What the rule prevents, shown on the same model with its lengths given as Python ints
    (no host read): the same position ids then really are constants, and hoist-constant says so."""

    class Given(ByLength):
        def forward(self, pixels, words, tau, mask, n=9):
            pos = torch.zeros(1, 12, dtype=torch.int64)
            pos[0, :n] = torch.arange(n)
            return (self.emb(pos) * 2.0).sum() + words.mean() + pixels.sum()

    findings, g, _ = _analyze(Given(), _passes([9]))
    emb = [o.id for o in g.ops if o.name == "embedding"]
    assert set(emb) <= _ids(findings, "hoist-constant", "load-time")


class Invisible(nn.Module):
    """A tensor attribute rewritten between passes where no dispatcher sees it (through numpy,
    as a Triton kernel's write would be): the same value number in both passes, other values."""

    def __init__(self):
        super().__init__()
        self.lat = nn.Linear(8, 16)
        self.state = torch.zeros(16)
        self.calls = 0

    def forward(self, pixels, words, tau, mask=None):
        self.calls += 1
        self.state.numpy()[:] = float(self.calls)  # not an aten op
        y = self.lat(pixels) + self.state  # the same op on "the same" inputs, by value number
        return y.sum() + words.mean() + tau.sum()


def test_fingerprints_refute_a_value_number_match_whose_values_differ():
    passes = _passes([9, 3])
    findings, g, _ = _analyze(Invisible(), passes, fingerprints=False)
    adds = [o.id for o in g.ops if o.name == "add" and o.pass_idx == 1]
    assert adds and set(adds) & _ids(findings, "cfg-invariant-cache"), "value numbers alone are fooled"
    findings, g, _ = _analyze(Invisible(), passes, fingerprints=True)
    adds = [o.id for o in g.ops if o.name == "add" and o.pass_idx == 1]
    assert not set(adds) & _ids(findings, "cfg-invariant-cache")
    lin = [o.id for o in g.ops if o.name == "linear" and o.pass_idx == 1]
    assert set(lin) <= _ids(findings, "cfg-invariant-cache")  # the latents' projection still is the same
    facts = [f.facts for f in findings if f.kind == "cfg-invariant-cache"]
    assert any(f.get("refuted_ops") for f in facts) and all("equal pass 1's" in f["values_checked"] for f in facts)
