"""The typed results of analysis: a Finding (one detector hit at one place) and an Opportunity
(findings of one kind grouped over repeated blocks, with an estimated gain)."""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

# DESIGN decision 8: one vocabulary, shared with the kernel store's `pattern` and lessons' `applies-to`.
KINDS = ("merge-siblings", "fuse-norm-consumer", "absorb-bias", "cfg-invariant-cache", "hoist-constant",
         "fuse-gemm-epilogue", "fuse-elementwise-chain", "attention-waste", "launch-bound", "quantization")
GENERATORS = ("store-replay", "variant-search", "agent", "compile-region")


@dataclass
class Finding:
    """One place where a detector's pattern holds. `detail` names the sub-pattern (e.g. "qk-norm-rope"),
    `signature` tells apart findings of the same kind and module pattern that are different things."""
    kind: str
    detail: str
    op_ids: list[int]
    anchor: int  # the op whose module and engine line locate the finding
    gain_ms: float  # estimated from the profile (see cost.py), for this one place
    basis: str  # how gain_ms was computed, in words
    confidence: float
    confidence_reason: str
    generator: str
    signature: str = ""
    summary: str = ""  # one line, for people
    facts: dict = field(default_factory=dict)
    region: str = ""  # module path that groups this finding (default: the anchor op's module)


@dataclass
class Estimate:
    """What a later validation compares with the realized gain (issue 4: keep these fields)."""
    estimated_ms: float
    estimated_pct: float
    basis: str
    profile_device: str
    profile_total_ms: float
    profile_source: str = ""


@dataclass
class Location:
    module_pattern: str
    examples: list[str]
    engine_file: str
    engine_line: int | None
    instances: int
    call_site: str = ""  # engine "file:line" that called the module (e.g. where attn.norm_q is applied)


@dataclass
class Opportunity:
    id: str
    kind: str
    detail: str
    summary: str
    location: Location
    ops: list[str]  # e.g. "aten::linear @ transformer_blocks.0.attn.to_q"
    op_ids: list[int]
    gain_ms: float
    gain_pct: float
    confidence: float
    confidence_reason: str
    generator: str
    estimate: Estimate
    facts: dict = field(default_factory=dict)
    # ids of the `quantization` opportunities whose per-token chain reads a value this one's ops compute
    # (rank.link_quantization): under torch.compile a registered op here would keep inductor from
    # computing that quantization in the same pass (bot/generate/replay.under_compile)
    quantized_by: list[str] = field(default_factory=list)
    # the stand-in some of its ops run on ("flashinfer: ..."; rank.mark_stand_ins): code that runs only
    # because the box lacks what production has. Reported, never optimized: a gain over it is not one
    stand_in: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def stable_id(kind: str, pattern: str, signature: str) -> str:
    return kind + "-" + hashlib.sha1(f"{kind}|{pattern}|{signature}".encode()).hexdigest()[:10]


def stand_in_spans(code: dict[str, list[str]] | None) -> list[tuple[str, str, int, int]]:
    """The runner's `stand_in_code` record ({what stands in: ["engine/file.py:first-last", ...]},
    runner/engines/sglang.py) as (name, file, first, last) spans."""
    out = []
    for name, spans in (code or {}).items():
        for span in spans:
            path, _, lines = span.rpartition(":")
            first, _, last = lines.partition("-")
            out.append((name, path, int(first), int(last or first)))
    return out


def stand_in_at(spans: list[tuple[str, str, int, int]], path: str, line: int) -> tuple[str, str, int, int] | None:
    """The stand-in span holding `path:line`, or None. `path` may be the span's file or a longer path
    ending in it (a patch names files from the repository root, the record from the import root)."""
    return next((s for s in spans if (path == s[1] or path.endswith("/" + s[1])) and s[2] <= line <= s[3]), None)
