"""Opportunities on stand-in code (runner/engines/sglang.py STAND_IN_CODE: SGLang's torch RoPE fallback
where FlashInfer is absent, torch SDPA standing in for FlashAttention 3) are reported and never
optimized: the analysis marks them from the environment record's line spans, analysis.md says why,
and the generate step leaves them out with a note."""
from __future__ import annotations

import torch
from torch import nn

from bot.analyze.opportunity import Opportunity
from bot.jsonable import from_json
from bot.analyze.render import markdown
from bot.steps.generate import on_production_paths
from runner.engines.sglang import code_span
from tests.analyze.toy_helpers import HERE, run_toy


def rope_fallback(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """A torch fallback of the kind SGLang runs without FlashInfer: several elementwise ops in a row."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.out = nn.Linear(32, 32)

    def forward(self, pixels, words=None, tau=None):
        h = self.proj(pixels)
        cos, sin = torch.cos(h[..., :16]), torch.sin(h[..., :16])
        h = rope_fallback(h, cos, sin)
        return self.out(torch.nn.functional.gelu(h) * 2.0 + 1.0)


def _analysis(tmp_path, code: dict):
    torch.manual_seed(0)
    a, _ = run_toy(Block(), [{"pixels": torch.randn(1, 64, 32)}], tmp_path,
                   profile_extra={"env": {"device_kind": "cpu", "device_name": "test", "stand_in_code": code}})
    return a


def test_opportunities_on_stand_in_code_are_reported_not_optimized(tmp_path):
    span = code_span(str(HERE), "test_stand_in_code.py", "rope_fallback")
    first, last = map(int, span.rpartition(":")[2].split("-"))
    assert (HERE / "test_stand_in_code.py").read_text().splitlines()[first - 1].startswith("def rope_fallback(")
    assert last == first + 3
    a = _analysis(tmp_path, {"flashinfer": [span]})
    opps = [from_json(Opportunity, o) for o in a["opportunities"]]
    marked = [o for o in opps if o.stand_in]
    assert marked and all(o.stand_in.startswith("flashinfer: ") and "test_stand_in_code.py:" in o.stand_in
                          for o in marked)
    assert len(marked) < len(opps)  # the GELU chain after it is production code
    md = markdown(a)
    assert "none: stand-in (flashinfer)" in md and "not optimized: its ops run on a stand-in" in md
    # the same analysis without the record: nothing is marked
    (tmp_path / "b").mkdir()
    assert not any(o.get("stand_in") for o in _analysis(tmp_path / "b", {})["opportunities"])


def test_generate_leaves_stand_in_opportunities_out_with_a_note(tmp_path):
    span = code_span(str(HERE), "test_stand_in_code.py", "rope_fallback")
    a = _analysis(tmp_path, {"flashinfer": [span]})
    opps = [from_json(Opportunity, o) for o in a["opportunities"]]
    keep, notes = on_production_paths(opps)
    assert keep == [o for o in opps if not o.stand_in] and len(notes) == len(opps) - len(keep) > 0
    assert all("not generated for: its ops run on a stand-in (flashinfer: " in n for n in notes)


def test_code_span_reads_the_engine_source_and_says_none_where_a_name_is_gone():
    assert code_span(str(HERE), "test_stand_in_code.py", "Block.forward").startswith("test_stand_in_code.py:")
    assert code_span(str(HERE), "test_stand_in_code.py", "Block.gone") is None
    assert code_span(str(HERE), "no_such_file.py", "f") is None
