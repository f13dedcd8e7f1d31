"""attention-waste: work around the attention op that a better-fed attention would not need.

Three structural sub-patterns, found from each attention op (an aten op whose name says attention):
- "mask-masks-nothing": the mask argument was checked at capture time and masks nothing (all true,
  or an additive mask of zeros). Removing it saves the ops that build it, and the attention kernel
  may run a faster path: the graph job times the recorded call with and without the mask.
- "qk-norm-rope": walking back from the q and k inputs to the GEMM that produced them, the path
  holds a normalization and/or a rotary embedding (a multiply by a table that depends only on
  positions and constants) as separate passes; one fused pass (or the GEMM's epilogue) can do it.
- "qkv-layout-copies": copies (concatenation, contiguous, casts) on the v path or after the
  attention output, before the next GEMM, that exist only to change layout.
- "sdpa-backend": an SDPA call whose default pick (e.g. flash, where an engine turned cuDNN off)
  is slower than another backend that takes the same call; the graph job times each SDPA signature
  under every backend at the workload's shapes (CUDA by default), so the gain is measured, not guessed.
"""
from __future__ import annotations

from bot.analyze.cost import fused_gain
from bot.analyze.graph import kind
from bot.analyze.opportunity import Finding
from bot.analyze.detectors.common import anchor_of, describe_ops, work_ops

KIND = "attention-waste"
MAX_PATH = 160


def detect(ctx) -> list[Finding]:
    g, cost = ctx.graph, ctx.cost
    out: list[Finding] = []
    probes = {p["signature"]: p for p in g.raw.get("probes", [])}
    pos_const = g.label_mask("pos_ids", "const")
    for att in [o for o in g.ops if kind(o) == "attention"]:
        tensors = att.inputs
        if len(tensors) < 3:
            continue
        q, k, v = tensors[0], tensors[1], tensors[2]
        # --- a mask that masks nothing
        m = att.mask
        if m and m.get("masks_nothing"):
            all_build = _mask_builders(g, m.get("value"), att)
            build = [i for i in all_build if ctx.free(i)]
            anchor = next((i for i in sorted(all_build) if g.ops[i].src and not g.ops[i].alias), att.id)
            gain = cost.ms(build)
            basis = f"time of the {len(work_ops(g, build))} ops that build the mask"
            probe = probes.get(m.get("probe") or "")
            facts = {"mask_kind": m.get("kind"), "mask_shape": m.get("shape")}
            if probe and isinstance(probe.get("with_mask"), dict) and isinstance(probe.get("without_mask"), dict):
                delta = probe["with_mask"]["median_ms"] - probe["without_mask"]["median_ms"]
                facts.update(probe_with_ms=probe["with_mask"]["median_ms"], probe_without_ms=probe["without_mask"]["median_ms"],
                             probe_device=probe["device"], probe_max_abs_diff=probe["max_abs_diff"])
                if probe["device"] == cost.device and delta > 0:
                    # a probe timed at another dtype or under load must not claim more than the
                    # attention op itself took in the profile
                    att_ms = cost.ms([att.id])
                    gain += min(delta, att_ms) if att_ms > 0 else delta
                    basis += (f" + attention with/without the mask timed at this shape on {probe['device']}: "
                              f"{probe['with_mask']['median_ms']:.4f} vs {probe['without_mask']['median_ms']:.4f} ms")
                else:
                    basis += f" (attention timed with/without the mask on {probe['device']}: no faster without it)"
            ctx.claim(build)
            out.append(Finding(KIND, "mask-masks-nothing", [att.id] + build, anchor, gain, basis, 0.8,
                               "mask values checked at capture: it masks nothing for this workload's inputs; the fix "
                               "must keep the mask when a prompt is padded", "store-replay", signature="mask",
                               summary="attention receives a mask that masks nothing (all ones): drop it when it is all ones",
                               facts=facts))
        # --- q/k: normalization and RoPE as separate passes
        path: set[int] = set()
        tables: set[int] = set()
        ok = True
        for start in (q, k):
            if not _walk_back(g, start, path, tables, pos_const):
                ok = False
        path = {i for i in path if ctx.free(i)}
        if ok and len(work_ops(g, path)) >= 2:
            has_norm = any(i in g.norm_of_op for i in path)
            has_rope = bool(tables)
            if has_norm or has_rope:
                detail = "qk-norm-rope" if has_norm and has_rope else ("qk-norm" if has_norm else "rope")
                gain, measured, nbytes = fused_gain(g, cost, list(path))
                norm_anchor = [i for i in path if i in g.norm_of_op]
                ctx.claim(path)
                what = {"qk-norm-rope": "QK normalization and RoPE", "qk-norm": "QK normalization",
                        "rope": "RoPE"}[detail]
                out.append(Finding(KIND, detail, sorted(path), min(norm_anchor) if norm_anchor else anchor_of(g, path),
                                   gain, f"{measured:.4f} ms measured for {len(work_ops(g, path))} ops on q/k, minus one "
                                   f"pass moving {nbytes / 1e6:.3f} MB at the profile's copy bandwidth",
                                   0.8, "q and k pass through these ops between their GEMM and the attention op; they "
                                   "are row-local and fuse into one pass or the QKV GEMM epilogue", "store-replay",
                                   signature=detail, summary=f"{what} run as {len(work_ops(g, path))} separate ops on q/k: "
                                   f"fuse into one pass ({describe_ops(g, path)[:120]})",
                                   facts={"ops": describe_ops(g, path), "rope_tables": len(tables)}))
        # --- layout copies on v and after the attention output
        copies: set[int] = set()
        vpath: set[int] = set()
        if _walk_back(g, v, vpath, set(), pos_const):
            copies |= {i for i in vpath if kind(g.ops[i]) in ("copy", "cast")}
        for c in _until_gemm(g, att.outputs[0] if att.outputs else None):
            if kind(c) in ("copy", "cast"):
                copies.add(c.id)
        copies = {i for i in copies if ctx.free(i)}
        if copies:
            ctx.claim(copies)
            out.append(Finding(KIND, "qkv-layout-copies", sorted(copies), anchor_of(g, copies), cost.ms(copies),
                               f"time of {len(copies)} copy ops (removed when producers write the layout attention reads)",
                               0.6, "copies whose only job is layout (concatenating streams, contiguous, casts) around "
                               "the attention op", "agent", signature="layout",
                               summary=f"layout copies around attention ({describe_ops(g, copies)[:100]})",
                               facts={"ops": describe_ops(g, copies)}))
    return out + _backend_choice(ctx)


def _backend_choice(ctx) -> list[Finding]:
    """SDPA whose default pick is slower than another backend that takes the same call, both timed
    by the graph job at the workload's shapes on the profile's device (runner/kinds/graph.py)."""
    g, cost = ctx.graph, ctx.cost
    raw_ops = g.raw.get("ops", [])
    out = []
    for rec in g.raw.get("sdpa_backends", []):
        default = rec.get("default")
        if rec.get("device") != cost.device or not isinstance(default, dict):
            continue
        timed = {name: b for name, b in rec.get("backends", {}).items()
                 if b.get("eligible") and isinstance(b.get("time"), dict)
                 # the same result: within bf16 rounding of the output's magnitude
                 and b.get("max_abs_diff", 0.0) <= 1e-2 * max(rec.get("ref_absmax", 1.0), 1e-6)}
        if not timed:
            continue
        best, b = min(timed.items(), key=lambda kv: kv[1]["time"]["median_ms"])
        saved = default["median_ms"] - b["time"]["median_ms"]
        if saved <= 0.05 * default["median_ms"]:
            continue  # the default already is (about) the fastest
        ids = [o["id"] for o in raw_ops if o.get("sdpa") == rec["signature"] and ctx.free(o["id"])]
        if not ids:
            continue
        att_ms = cost.ms(ids)
        gain = saved * len(ids)
        if att_ms > 0:
            gain = min(gain, att_ms)  # never more than the profile says these calls took
        name = best.replace("_attention", "")
        facts = {"backend": name, "default_ms": default["median_ms"], "calls": len(ids),
                 "backend_ms": {k.replace("_attention", ""): v["time"]["median_ms"] for k, v in timed.items()},
                 "not_eligible": {k.replace("_attention", ""): v.get("why", "") for k, v in rec["backends"].items()
                                  if not v.get("eligible")},
                 "max_abs_diff": b.get("max_abs_diff"), "signature": rec["signature"], "probe_device": rec["device"]}
        ctx.claim(ids)
        out.append(Finding(KIND, "sdpa-backend", ids, ids[0], gain,
                           f"{len(ids)} calls x (default {default['median_ms']:.4f} - {name} "
                           f"{b['time']['median_ms']:.4f} ms), each backend timed at this shape on {rec['device']}",
                           0.9, "both timed at the workload's shapes, outputs compared", "store-replay",
                           signature=f"sdpa-backend|{rec['signature']}",
                           summary=f"SDPA's default pick runs {default['median_ms']:.3f} ms per call where {name} runs "
                                   f"{b['time']['median_ms']:.3f} ms: select {name} for these calls",
                           facts=facts))
    return out


def _walk_back(g, vid, acc: set[int], tables: set[int], pos_const: int) -> bool:
    """Collect the ops between `vid` and the GEMM(s)/inputs it comes from. False if the walk runs
    away (no GEMM within MAX_PATH ops): then the path is not a q/k/v projection path."""
    stack = [vid]
    while stack:
        v = stack.pop()
        p = g.producer.get(v)
        if p is None or p.id in acc:
            continue
        kd = kind(p)
        if kd in ("gemm", "attention", "factory"):
            continue
        acc.add(p.id)
        if len(acc) > MAX_PATH:
            return False
        main = [x for x in p.inputs if not g.is_weight(x)]
        for x in main:
            d = g.values[x]["deps"]
            if d and not (d & ~pos_const) and p.name in ("mul", "add", "addcmul") and g.numel(x) > 1:
                tables.add(x)  # a rotary table: positions and constants only
                continue
            if d and not (d & ~pos_const):
                continue
            stack.append(x)
    return True


def _until_gemm(g, vid):
    """Ops after the attention output up to the next GEMM (through views), along single paths."""
    if vid is None:
        return []
    out, frontier, seen = [], [vid], set()
    while frontier:
        v = frontier.pop()
        for c in g.real_consumers(v):
            if c.id in seen or kind(c) in ("gemm", "attention", "norm") or len(out) > 8:
                continue
            seen.add(c.id)
            if kind(c) in ("copy", "cast"):
                out.append(c)
                frontier.extend(c.outputs)
    return out


def _mask_builders(g, mask_vid, att) -> list[int]:
    """Ops upstream of the mask whose results are used only to build this mask."""
    if mask_vid is None:
        return []
    keep: set[int] = set()
    stack = [mask_vid]
    while stack:
        v = stack.pop()
        p = g.producer.get(v)
        if p is None or p.id in keep:
            continue
        users = {c.id for o in p.outputs for c in g.consumers.get(o, [])}
        if not users <= (keep | {att.id}) and v != mask_vid:
            # used elsewhere too (e.g. the model-wide mask): stop unless only our builders use it
            if any(u not in keep and u != att.id for u in users):
                continue
        keep.add(p.id)
        stack.extend(p.inputs)
    return sorted(keep)
