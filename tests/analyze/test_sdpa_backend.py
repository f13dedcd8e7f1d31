"""attention-waste "sdpa-backend": each SDPA signature timed under every backend by the graph job
(runner/kinds/graph.py _backends), and the detector that turns a slower default pick into a
measured finding (bot/analyze/detectors/attention_waste.py)."""
from __future__ import annotations

import copy

import torch
from torch import nn

from bot.analyze.cost import attribute
from bot.analyze.detectors import Context, run_all
from bot.analyze.graph import Graph
from runner.graph_capture import capture
from runner.kinds.graph import _backends
from tests.analyze.toy_helpers import HERE, ROLES


class TwoAttentions(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, pixels, words=None, tau=None):
        q, k, v = self.qkv(pixels).view(1, -1, 3, 2, 16).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v)
        b = nn.functional.scaled_dot_product_attention(q, k, v * 2.0)
        return (a + b).sum()


def _capture(m: nn.Module):
    """The graph capture's recorder of one warm step of `m` on a [1, 64, 32] input."""
    m.eval()
    x = torch.randn(1, 64, 32)

    def step():
        with torch.inference_mode():
            return m(pixels=x)

    step()
    return capture(m, step, str(HERE), ROLES)


def _graph_with_backends():
    rec = _capture(TwoAttentions())
    raw = rec.to_json()
    raw.update(device="cpu", probes=[], sdpa_backends=[dict(_backends(p, "cpu", 3), calls=rec.sdpa_counts[s])
                                                       for s, p in rec.sdpa_calls.items()])
    return raw


def _findings(raw):
    g = Graph.from_json(raw)
    profile = {"kernels": [], "device": "cpu", "total_ms": 1.0, "busy_ms": 1.0, "idle_ms": None, "passes": 1,
               "peaks": {"copy_gbps": 20.0, "matmul_tflops": 0.2}, "env": {"device_kind": "cpu", "device_name": "test"}}
    ctx = Context(graph=g, cost=attribute(g, profile, "test"), profile=profile)
    return [f for f in run_all(ctx, ["attention-waste"]) if f.detail == "sdpa-backend"], g


def test_every_sdpa_signature_is_timed_under_each_backend():
    raw = _graph_with_backends()
    (rec,) = raw["sdpa_backends"]  # one signature, called twice
    assert rec["calls"] == 2 and rec["device"] == "cpu" and rec["default"]["n"] == 3
    flash = rec["backends"]["flash_attention"]
    assert flash["eligible"] and flash["max_abs_diff"] <= 1e-5 and flash["time"]["median_ms"] > 0
    # cuDNN and the memory-efficient kernel are CUDA's: on CPU they say why they did not run
    assert not rec["backends"]["cudnn_attention"]["eligible"] and rec["backends"]["cudnn_attention"]["why"]
    assert [o["sdpa"] for o in raw["ops"] if "sdpa" in o] == [rec["signature"]] * 2


def test_a_default_pick_that_is_already_the_fastest_is_no_finding():
    raw = _graph_with_backends()
    rec = raw["sdpa_backends"][0]
    rec["default"]["median_ms"] = rec["backends"]["flash_attention"]["time"]["median_ms"]  # as fast as flash
    assert _findings(raw)[0] == []


def test_a_slower_default_pick_is_a_measured_finding():
    """The H200 numbers of DESIGN.md (one FLUX.2 layer: flash 1.58 ms, cuDNN 0.81 ms), written into
    the record format the graph job produces; what SGLang's FLUX.2 runs into with cuDNN turned off."""
    raw = _graph_with_backends()
    rec = raw["sdpa_backends"][0]
    rec["default"] = {"median_ms": 1.58, "min_ms": 1.57, "n": 10}
    rec["backends"]["flash_attention"]["time"] = {"median_ms": 1.58, "min_ms": 1.57, "n": 10}
    rec["backends"]["cudnn_attention"] = {"eligible": True, "max_abs_diff": 0.0,
                                          "time": {"median_ms": 0.81, "min_ms": 0.80, "n": 10}}
    (f,), g = _findings(raw)
    assert f.facts["backend"] == "cudnn" and f.facts["calls"] == 2
    assert abs(f.gain_ms - 2 * (1.58 - 0.81)) < 1e-9  # the profile attributes no time here: nothing caps it
    assert "select cudnn" in f.summary and f.generator == "store-replay"
    # a backend whose output differs is never proposed
    bad = copy.deepcopy(raw)
    bad["sdpa_backends"][0]["backends"]["cudnn_attention"]["max_abs_diff"] = 10.0
    assert _findings(bad)[0] == []


class OneLayerPicksItsOwn(TwoAttentions):
    """Two attentions of one shape; the second chooses its SDPA backends around its call, as SGLang's
    layers do with `allow_cudnn_sdp` (sdpa_kernel(..., set_priority=True)) over the process-wide switch."""

    def forward(self, pixels, words=None, tau=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = self.qkv(pixels).view(1, -1, 3, 2, 16).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v)
        with sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], set_priority=True):
            b = nn.functional.scaled_dot_product_attention(q, k, v)
        return (a + b).sum()


def test_a_call_is_timed_under_the_backend_switches_in_force_at_it():
    from runner.graph_capture import sdp_as, sdp_state

    before = sdp_state()
    rec = _capture(OneLayerPicksItsOwn())
    assert sdp_state() == before
    plain, own = sorted(rec.sdpa_calls.values(), key=lambda p: p.signature)
    assert rec.sdpa_counts[plain.signature] == rec.sdpa_counts[own.signature] == 1
    assert plain.sdp == before and own.signature.endswith(f" sdp{own.sdp}")
    flags, order = own.sdp
    assert flags == (False, True, False, True)  # cudnn, flash, mem_efficient, math: only the layer's two
    assert order[:2] == (int(torch.nn.attention.SDPBackend.MATH), int(torch.nn.attention.SDPBackend.FLASH_ATTENTION))
    # the graph job's "default" timing runs the call under those switches, then puts the process's back
    seen = []
    func = own.func
    own.func = lambda *a, **kw: (seen.append(sdp_state()), func(*a, **kw))[1]
    out = _backends(own, "cpu", 2)
    assert out["default"]["n"] == 2 and seen[0] == own.sdp  # the first call is the default's reference
    assert sdp_state() == before
    with sdp_as(own.sdp):
        assert sdp_state() == own.sdp
    assert sdp_state() == before
