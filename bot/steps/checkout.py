"""Step 1, checkout: the engine repository at the run's ref, and the base worktree."""
from __future__ import annotations

from dataclasses import dataclass

from bot.run.context import RunContext
from bot.target import base_worktree


@dataclass
class Result:
    workload: str
    engine: str
    repo_path: str
    base_sha: str
    ref: str
    import_root: str
    model_class: str
    base_worktree: str
    preset: str
    device: str
    dtype: str
    shape: str
    # how outputs are judged at this precision, and for a quantized one the evidence its bound follows
    # from (the recipe's own error against the unquantized model): the report says it beside the results
    judged_by: str = ""

    def summary(self) -> str:
        return (f"{self.engine} @ {self.base_sha[:12]}; {self.preset} preset on {self.device}, {self.dtype}, "
                f"{self.shape}")


def run(ctx: RunContext) -> Result:
    t = ctx.target
    wt = base_worktree(t)
    return Result(workload=t.workload.name, engine=t.checkout.name, repo_path=str(t.checkout.repo_path),
                  base_sha=t.checkout.base_sha, ref=t.checkout.ref, import_root=t.checkout.import_root,
                  model_class=t.model_class, base_worktree=str(wt), preset=t.preset, device=t.device, dtype=t.dtype,
                  shape=t.workload.preset(t.preset).shapes.label(), judged_by=judged_by(t))


def judged_by(t) -> str:
    """The output rule of the run's precision: the bound within a mode, the one across modes where the
    workload gives it, and a quantized precision's evidence."""
    if t.workload.bit_exact:
        return "bit-exact"
    tol = t.workload.tolerance_for(t.dtype, t.engine_name)
    if tol is None:
        return ""
    text = f"{tol.rule(t.dtype)}, against the base at its precision"
    if tol.across_modes:
        text += f" (the bound across modes: {tol.across_modes.evidence})"
    return text + (f". The bound's evidence: {tol.evidence}" if tol.evidence else "")
