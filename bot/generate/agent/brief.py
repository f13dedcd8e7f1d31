"""The opportunity brief: everything the agent is told about its one target, built from the run's own
analysis (the Opportunity, the captured graph, the profile, the workload), rendered as text for the
first user message (bot/generate/agent/prompts.task_message).

What it holds, in full (nothing is cut to a character count):
- the Opportunity: kind, detail, summary, location, gain and its basis and measuring device,
  confidence, facts; its op ids summarized (count, first few), since they can number thousands;
- the graph slice of ONE instance: every op of the first repeated block the opportunity covers
  (module path up to the pattern's first `*`, first forward pass), with its input and output
  shapes, dtypes, contiguity, scalar arguments (eps, dims...) and engine line;
- the profile rows of the opportunity's own kernels (rows keyed like the instance's ops:
  module path and op family, as bot/analyze/cost.py attributes time), with the time attributed
  to the opportunity's ops; `kernels` also feeds read_profile (tools.read_profile_text);
- the measured peaks (matmul TFLOP/s, copy GB/s of the profile's `peaks`) and the roofline of the
  instance: bytes the unfused ops move and the bytes one fused kernel must move, over the copy
  bandwidth; FLOPs over the matmul peak;
- the workload's numeric tolerance for the run's dtype, or that it must be bit-exact.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from bot.analyze.cost import CostModel, attribute, fused_gain
from bot.analyze.graph import Graph, Op, kind, module_pattern, op_family

OP_IDS_SHOWN = 12  # op ids listed in the brief (the rest are counted)
MAX_SLICE_OPS = 80  # ops of one instance listed; a larger instance says how many were left out
MAX_KERNEL_ROWS = 40  # rows of the instance, then groups of the other instances' rows (read_profile lists all)
MAX_KERNEL_NAME = 160  # a GPU kernel's templated name is cut here in the brief (read_profile has it whole)
_WEIGHT_PREFIXES = ("weight:", "buffer:", "param:")


@dataclass(frozen=True)
class TensorInfo:
    arg: str  # argument name for an input ("" for an output)
    shape: tuple[int, ...]
    dtype: str
    contiguous: bool
    origin: str  # e.g. weight:transformer_blocks.0.attn.to_q.weight, input:latents, "" when computed

    def text(self) -> str:
        s = f"{self.dtype}[{', '.join(map(str, self.shape))}]"
        if not self.contiguous:
            s += " non-contiguous"
        if self.origin.startswith(_WEIGHT_PREFIXES) or self.origin.startswith("input:"):
            s += f" ({self.origin})"
        return f"{self.arg}={s}" if self.arg else s


@dataclass(frozen=True)
class SliceOp:
    id: int
    op: str
    module: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    scalars: dict
    src: str  # engine file:line that ran the op
    call_site: str  # engine file:line that called the op's module
    alias: bool  # a view: moves no data
    ms: float  # profile time attributed to this op (cost.py)

    def text(self) -> str:
        sc = f" {json.dumps(self.scalars, default=str, sort_keys=True)}" if self.scalars else ""
        view = " [view, no data moved]" if self.alias else ""
        return (f"#{self.id} {self.op} @ {self.module or '(top level)'}{view}\n"
                f"    in: {'; '.join(t.text() for t in self.inputs) or '-'}{sc}\n"
                f"    out: {'; '.join(t.text() for t in self.outputs) or '-'}\n"
                f"    at {self.src or '?'}" + (f" (module called at {self.call_site})" if self.call_site else "")
                + f"; {self.ms:.4f} ms attributed")


@dataclass(frozen=True)
class KernelRow:
    """One row of the profile (a kernel, or on CPU an op's self time, grouped by name and module)
    whose module and op family are those of an op of the opportunity."""
    name: str
    op: str
    module: str
    calls: int
    ms: float  # the whole row's time
    attributed_ms: float  # the part cost.py puts on the opportunity's ops
    instance: bool  # the row belongs to the instance the graph slice shows

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "module": self.module, "calls": self.calls, "ms": self.ms,
                "attributed_ms": round(self.attributed_ms, 5), "instance": self.instance}

    def text(self) -> str:
        return (f"{self.ms:10.4f} ms  {self.calls:4d} calls  {_short(self.name)} @ {self.module or '(top level)'}"
                f"  ({self.attributed_ms:.4f} ms on this opportunity's ops)")


def _short(name: str) -> str:
    return name if len(name) <= MAX_KERNEL_NAME else name[:MAX_KERNEL_NAME] + "..."


@dataclass(frozen=True)
class Roofline:
    """The lower bounds of the instance's work at the measured peaks."""
    peaks_device: str
    copy_gbps: float
    matmul_tflops: float
    unfused_bytes: int  # every non-view op reading its inputs and writing its outputs once
    fused_bytes: int  # one kernel reading the instance's external inputs and writing its external outputs once
    flops: int  # matmul/attention FLOPs of the instance
    measured_ms: float  # profile time attributed to the instance's ops

    @staticmethod
    def _ms(x: float, per_s: float) -> float | None:
        return x / per_s * 1e3 if per_s else None

    @property
    def unfused_ms(self):
        return self._ms(self.unfused_bytes, self.copy_gbps * 1e9)

    @property
    def fused_ms(self):
        return self._ms(self.fused_bytes, self.copy_gbps * 1e9)

    @property
    def flops_ms(self):
        return self._ms(self.flops, self.matmul_tflops * 1e12)

    @property
    def bound_ms(self):
        """The fused work's floor: the larger of its memory time and its compute time."""
        xs = [x for x in (self.fused_ms, self.flops_ms) if x is not None]
        return max(xs) if xs else None

    def text(self) -> str:
        def ms(x):
            return "n/a (peak not measured)" if x is None else f"{x:.5f} ms"
        return "\n".join([
            f"Measured peaks ({self.peaks_device}): matmul {self.matmul_tflops:g} TFLOP/s, copy {self.copy_gbps:g} GB/s",
            f"- unfused ops move {self.unfused_bytes:,} bytes: {ms(self.unfused_ms)} at the copy bandwidth",
            f"- one fused kernel must move {self.fused_bytes:,} bytes (external inputs and outputs once): "
            f"{ms(self.fused_ms)}",
            f"- {self.flops:,} matmul/attention FLOPs: {ms(self.flops_ms)} at the matmul peak",
            f"- floor of the fused work: {ms(self.bound_ms)}; measured now: {self.measured_ms:.5f} ms"])


@dataclass
class OpportunityBrief:
    id: str
    kind: str
    detail: str
    summary: str
    location: dict
    gain_ms: float | None
    gain_pct: float | None
    estimate: dict
    confidence: float | None
    confidence_reason: str
    generator: str
    facts: dict
    ops: list[str]
    op_count: int
    op_ids_head: list[int]
    instance: str = ""  # module path of the instance the slice shows
    instance_op_ids: list[int] = field(default_factory=list)
    slice: list[SliceOp] = field(default_factory=list)
    kernels: list[KernelRow] = field(default_factory=list)  # the opportunity's rows, instance first, then by time
    roofline: Roofline | None = None
    workload: str = ""
    dtype: str = ""
    bit_exact: bool = False
    tolerance: dict | None = None  # {rel_l2, atol, rtol} of the workload for dtype
    notes: list[str] = field(default_factory=list)  # why a part is missing

    def render(self) -> str:
        loc = self.location or {}
        est = self.estimate or {}
        out = [f"## Opportunity {self.id}: {self.kind}" + (f" ({self.detail})" if self.detail else "")]
        if self.summary:
            out.append(self.summary)
        if loc:
            where = f"{loc.get('engine_file', '')}:{loc.get('engine_line')}" if loc.get("engine_file") else "?"
            out += ["", "Location:",
                    f"- module pattern: {loc.get('module_pattern', '?')} ({loc.get('instances', '?')} instances)",
                    f"- examples: {', '.join(loc.get('examples') or []) or '-'}",
                    f"- engine line: {where}" + (f"; module called at {loc['call_site']}" if loc.get("call_site") else "")]
        out += ["", "Estimated gain:"]
        if self.gain_ms is not None:
            out.append(f"- {self.gain_ms:.5f} ms per step" + (f" ({self.gain_pct:.3f}% of the step)" if self.gain_pct is not None else ""))
        if est:
            out.append(f"- basis: {est.get('basis', '?')}")
            out.append(f"- measured on: {est.get('profile_device', '?')}, step {est.get('profile_total_ms', '?')} ms"
                       + (f", profile {est['profile_source']}" if est.get("profile_source") else ""))
        if self.confidence is not None:
            out.append(f"- confidence {self.confidence}: {self.confidence_reason}")
        if self.generator:
            out.append(f"- suggested generator: {self.generator}")
        if self.facts:
            out += ["", "Facts (from the detector):", json.dumps(self.facts, indent=1, default=str, sort_keys=True)]
        if self.ops:
            out += ["", "Ops (per instance pattern):"] + [f"- {o}" for o in self.ops]
        more = f" ... ({self.op_count - len(self.op_ids_head)} more)" if self.op_count > len(self.op_ids_head) else ""
        out.append(f"Graph op ids: {self.op_count} in all: {', '.join(map(str, self.op_ids_head))}{more}")
        if self.slice:
            left = len(self.instance_op_ids) - len(self.slice)
            out += ["", f"## Graph slice of one instance ({self.instance or 'whole opportunity'}: "
                        f"{len(self.instance_op_ids)} ops, first forward pass)"]
            out += [s.text() for s in self.slice]
            if left > 0:
                out.append(f"... {left} more ops of this instance not listed")
        if self.kernels:
            out += [""] + self._kernels_text()
        if self.roofline:
            out += ["", "## Roofline of one instance", self.roofline.text()]
        out += ["", "## Numeric tolerance", self.tolerance_text()]
        if self.notes:
            out += ["", "Not available: " + "; ".join(self.notes)]
        return "\n".join(out)

    def _kernels_text(self) -> list[str]:
        """The instance's rows one by one, then the other instances' rows grouped by kernel and module
        pattern (48 blocks' copies of one kernel are one line)."""
        inst = [k for k in self.kernels if k.instance]
        tot = math.fsum(k.attributed_ms for k in self.kernels)
        out = [f"## Profile rows of this opportunity's kernels ({len(self.kernels)} rows, {tot:.4f} ms attributed "
               f"to its ops; read_profile lists every row as `opportunity_kernels`)",
               f"Rows of the instance above ({len(inst)}):"] + [k.text() for k in inst[:MAX_KERNEL_ROWS]]
        groups: dict[tuple[str, str], list[KernelRow]] = {}
        for k in self.kernels:
            if not k.instance:
                groups.setdefault((k.name, module_pattern(k.module)), []).append(k)
        if groups:
            ranked = sorted(groups.items(), key=lambda kv: -math.fsum(r.ms for r in kv[1]))
            out.append(f"Rows of the other instances, grouped by kernel and module pattern ({len(groups)} groups):")
            for (name, pat), rs in ranked[:MAX_KERNEL_ROWS]:
                out.append(f"{math.fsum(r.ms for r in rs):10.4f} ms  {len(rs):4d} rows  {_short(name)} @ {pat}  "
                           f"({math.fsum(r.attributed_ms for r in rs):.4f} ms on this opportunity's ops)")
            if len(ranked) > MAX_KERNEL_ROWS:
                out.append(f"... {len(ranked) - MAX_KERNEL_ROWS} more groups")
        return out

    def tolerance_text(self) -> str:
        if self.bit_exact:
            return f"The workload {self.workload} must be bit-exact: outputs identical to the base engine's."
        if self.tolerance:
            t = self.tolerance
            return (f"The workload {self.workload} in {self.dtype}: an output passes when "
                    f"||out - ref|| / ||ref|| <= {t['rel_l2']:g} and every element obeys "
                    f"|out - ref| <= {t['atol']:g} + {t['rtol']:g} * |ref|.")
        return f"The workload {self.workload or '?'} declares no tolerance for {self.dtype or 'this dtype'}."


# ---- building

def _tensor(graph: Graph, vid: int, arg: str = "") -> TensorInfo:
    v = graph.values[vid]
    return TensorInfo(arg, tuple(v.get("shape", ())), v.get("dtype", "?"), bool(v.get("contig", True)),
                      v.get("origin", "") or "")


def instance_prefix(pattern: str, example: str) -> str | None:
    """The module path of one instance: `example` up to the part where `pattern` has its first `*`
    (transformer_blocks.*.attn.to_q, transformer_blocks.3.attn.to_q -> transformer_blocks.3). None
    when the pattern repeats nothing (one place: every op of the opportunity is the instance)."""
    pp, ep = pattern.split("."), example.split(".")
    for i, part in enumerate(pp):
        if part == "*" and i < len(ep):
            return ".".join(ep[:i + 1])
    return None


def instance_ops(graph: Graph, opp: dict) -> tuple[str, list[int]]:
    """(instance path, op ids) of the first instance of the opportunity, in its first forward pass."""
    ids = [i for i in opp.get("op_ids") or [] if 0 <= i < len(graph.ops)]
    if not ids:
        return "", []
    loc = opp.get("location") or {}
    examples = loc.get("examples") or []
    prefix = instance_prefix(loc.get("module_pattern", ""), examples[0]) if examples else None
    first_pass = min(graph.ops[i].pass_idx for i in ids)
    ids = [i for i in ids if graph.ops[i].pass_idx == first_pass]
    if prefix:
        mine = [i for i in ids if graph.ops[i].module == prefix or graph.ops[i].module.startswith(prefix + ".")]
        if mine:
            return prefix, mine
    return examples[0] if len(examples) == 1 else "", ids


def _flops(graph: Graph, op: Op) -> int:
    if kind(op) == "gemm":
        return graph.gemm_flops(op)
    if kind(op) == "attention" and len(op.inputs) >= 3:  # q [.., Sq, D] @ k^T, then @ v: 2 GEMMs
        q, k = graph.values[op.inputs[0]]["shape"], graph.values[op.inputs[1]]["shape"]
        if len(q) >= 2 and len(k) >= 2:
            return 4 * graph.numel(op.inputs[0]) * k[-2]
    return 0


def roofline(graph: Graph, cost: CostModel, ids: list[int], peaks: dict, device: str) -> Roofline:
    ops = [graph.ops[i] for i in ids]
    _gain, measured, fused_bytes = fused_gain(graph, cost, ids)
    return Roofline(peaks_device=device, copy_gbps=float(peaks.get("copy_gbps") or 0.0),
                    matmul_tflops=float(peaks.get("matmul_tflops") or 0.0),
                    unfused_bytes=sum(graph.op_bytes(o) for o in ops), fused_bytes=int(fused_bytes),
                    flops=sum(_flops(graph, o) for o in ops), measured_ms=measured)


def kernel_rows(graph: Graph, profile: dict, cost: CostModel, op_ids: list[int],
                instance_ids: list[int] = ()) -> list[KernelRow]:
    """The profile rows keyed (module, op family) like an op of `op_ids`: the opportunity's own
    kernels, however low they rank in the step. Rows of the instance first, then by time."""
    ops = [graph.ops[i] for i in op_ids if 0 <= i < len(graph.ops)]
    share: dict[tuple[str, str], float] = {}
    for o in ops:
        key = (o.module, op_family(o.op))
        share[key] = share.get(key, 0.0) + cost.op_ms.get(o.id, 0.0)
    inst = {(graph.ops[i].module, op_family(graph.ops[i].op)) for i in instance_ids}
    keyed = [((k.get("module", ""), op_family(k.get("op") or k.get("name", ""))), k) for k in profile.get("kernels") or []]
    key_ms: dict[tuple[str, str], float] = {}
    for key, k in keyed:
        key_ms[key] = key_ms.get(key, 0.0) + float(k.get("ms", 0.0))
    rows = []
    for key, k in keyed:
        if key in share:
            ms = float(k.get("ms", 0.0))
            part = share[key] * ms / key_ms[key] if key_ms[key] else 0.0  # rows of one key share its time
            rows.append(KernelRow(k.get("name", "?"), k.get("op", ""), key[0], int(k.get("calls", 1) or 1), ms, part,
                                  key in inst))
    rows.sort(key=lambda r: (not r.instance, -r.ms, r.module, r.name))
    return rows


def build_brief(opp: dict, *, graph: Graph | None = None, profile: dict | None = None, workload=None,
                dtype: str = "", engine: str = "") -> OpportunityBrief:
    """The brief of one Opportunity (its JSON, as the analysis wrote it). Without a graph or profile
    the brief says what it lacks rather than guess."""
    est = opp.get("estimate") or {}
    ids = list(opp.get("op_ids") or [])
    b = OpportunityBrief(
        id=str(opp.get("id", "?")), kind=str(opp.get("kind", "?")), detail=opp.get("detail", ""),
        summary=opp.get("summary", ""), location=opp.get("location") or {}, gain_ms=opp.get("gain_ms"),
        gain_pct=opp.get("gain_pct"), estimate=est, confidence=opp.get("confidence"),
        confidence_reason=opp.get("confidence_reason", ""), generator=opp.get("generator", ""),
        facts=opp.get("facts") or {}, ops=list(opp.get("ops") or []), op_count=len(ids), op_ids_head=ids[:OP_IDS_SHOWN],
        workload=getattr(workload, "name", "") or "", dtype=dtype)
    if workload is not None:
        b.bit_exact = bool(workload.bit_exact)
        t = workload.tolerance_for(dtype, engine)
        b.tolerance = t.bound() if t else None
    if graph is None:
        b.notes.append("no captured graph for this run (no slice, no roofline)")
        return b
    if not profile:
        b.notes.append("no profile for this run (no kernel rows, no times, no peaks)")
        profile = {}
    cost = attribute(graph, profile)
    b.instance, b.instance_op_ids = instance_ops(graph, opp)
    b.slice = [SliceOp(o.id, o.op, o.module,
                       tuple(_tensor(graph, v, o.arg_names[j] if j < len(o.arg_names) else f"arg{j}")
                             for j, v in enumerate(o.inputs)),
                       tuple(_tensor(graph, v) for v in o.outputs), dict(o.scalars), o.src, o.call_site, o.alias,
                       cost.op_ms.get(o.id, 0.0))
               for o in (graph.ops[i] for i in b.instance_op_ids[:MAX_SLICE_OPS])]
    b.kernels = kernel_rows(graph, profile, cost, ids, b.instance_op_ids)
    if b.instance_op_ids:
        peaks = profile.get("peaks") or {}
        dev = est.get("profile_device") or (f"{cost.device} ({cost.device_name})" if cost.device_name else cost.device)
        b.roofline = roofline(graph, cost, b.instance_op_ids, peaks, dev)
        if not peaks:
            b.notes.append("the profile carries no measured peaks")
    return b


def graph_file_of(run_dir: Path) -> str | None:
    """The captured graph a run's analysis names (analysis.full.json meta.graph_file), if it exists."""
    full = Path(run_dir) / "analysis.full.json"
    if not full.is_file():
        return None
    g = json.loads(full.read_text()).get("meta", {}).get("graph_file")
    return g if g and Path(g).is_file() else None


def for_task(task) -> OpportunityBrief:
    """The brief of an AgentTask (bot/generate/agent/loop.py): its opportunity, graph file, profile
    and the target's workload and dtype."""
    gf = getattr(task, "graph_file", None)
    graph = Graph.load(gf) if gf and Path(gf).is_file() else None
    t = task.vctx.target
    return build_brief(task.opportunity, graph=graph, profile=task.profile, workload=t.workload, dtype=t.dtype,
                       engine=t.engine_name)
