"""launch-bound: regions of many short kernels, where the device waits on the host.

From the profile: on a GPU, the device idle time of the unprofiled step (latency minus the
kernels' busy time) is what capturing the step in a CUDA graph (or fusing launches away) can win
back at most; it is spread over regions in proportion to their launches, and regions whose kernels
are short (mean under 20 us) are named. On a CPU, the same is done with host overhead (latency minus
the ops' self times). From the graph: ops that make the host wait for the device (a Python value
read from a tensor) or copy between devices inside the step are listed as CUDA-graph blockers.
"""
from __future__ import annotations

from collections import defaultdict

from bot.analyze.opportunity import Finding
from bot.analyze.detectors.common import region

KIND = "launch-bound"
SHORT_US = 20.0
MIN_SHARE = 0.005


def detect(ctx) -> list[Finding]:
    g, cost, p = ctx.graph, ctx.cost, ctx.profile
    total = float(p.get("total_ms") or 0.0)
    if total <= 0:
        return []
    if p.get("device") == "cuda" and p.get("idle_ms") is not None:
        idle, what = float(p["idle_ms"]), "device idle between kernels"
    else:
        idle, what = max(0.0, total - float(p.get("busy_ms") or 0.0)), "host overhead between ops (cpu)"
    if idle <= MIN_SHARE * total:
        return []
    launches: dict[str, int] = defaultdict(int)
    ms: dict[str, float] = defaultdict(float)
    short: dict[str, int] = defaultdict(int)
    short_ms: dict[str, float] = defaultdict(float)
    for k in p.get("kernels", []):
        r = _pattern(region(k.get("module", "")))
        calls = int(k.get("calls", 1))
        launches[r] += calls
        ms[r] += float(k["ms"])
        if calls and 1e3 * float(k["ms"]) / calls < SHORT_US:
            short[r] += calls
            short_ms[r] += float(k["ms"])
    n_total = sum(launches.values()) or 1
    blockers = [o for o in g.ops if o.host or o.xdev]
    blocker_txt = sorted({f"{'host sync' if o.host else 'cross-device copy'} ({o.name}) at {o.src or o.module}" for o in blockers})
    conf = 0.5 if blockers else 0.7
    reason = (f"{what}: {idle:.3f} ms of {total:.3f} ms; " +
              (f"CUDA-graph capture is blocked by {len(blockers)} op(s): {'; '.join(blocker_txt[:3])}" if blockers
               else "no host syncs or cross-device copies seen in the step"))
    out = []
    for r, n in sorted(launches.items(), key=lambda kv: (-kv[1], kv[0])):
        share = n / n_total
        gain = idle * share
        if gain < MIN_SHARE * total:
            continue
        frac_short = short[r] / n if n else 0.0
        out.append(Finding(
            KIND, "idle-between-launches", [], -1, gain,
            f"{what} ({idle:.3f} ms) times this region's share of launches ({n}/{n_total})",
            conf if frac_short >= 0.5 else conf - 0.2, reason,
            "compile-region", signature="launches", region=r,
            summary=f"{n} launches, {short[r]} of them under {SHORT_US:.0f} us ({short_ms[r]:.3f} ms busy): "
                    f"CUDA graph / fewer, larger kernels",
            facts={"launches": n, "short_launches": short[r], "short_ms": round(short_ms[r], 4),
                   "busy_ms": round(ms[r], 4), "blockers": blocker_txt[:10],
                   "idle_ms_total": idle}))
    return out


def _pattern(r: str) -> str:
    import re
    return re.sub(r"\.\d+(?=\.|$)", ".*", r) or "(top level)"
