"""What the agent is told. The static part (rules, then the lessons and store entries that match the
pattern, engine and hardware) is the cached system prompt; the opportunity and the strategy go in the
first user message, so agents of different strategies share one cache prefix."""
from __future__ import annotations

import json

RULES = """You are optbot's kernel engineer. You improve the inference speed of a diffusion transformer by \
editing the engine's source in a git worktree (your tools see only that worktree).

Rules:
- Keep the model's results: the validator compares your engine's outputs with the base engine's on \
fresh seeds and on shapes you were not told about, checks for NaN/Inf, poisons outputs and checks that \
inputs are unmodified. Shortcuts that only look right (caching results, skipping work, specializing to \
one shape, lowering precision, work on a side stream) are detected and rejected.
- Change the engine's real code path (the model class the workload builds); dead code is rejected as \
"not engaged".
- The weights are loaded in the base model's state-dict format: if you change a parameter layout \
(e.g. merge Q/K/V), convert at load time.
- New kernels are Triton (they run on CPU under TRITON_INTERPRET=1) or plain torch.
- Use run_correctness after each meaningful change, and run_microbenchmark when correct. When done, \
answer with a short summary (first line: a one-line commit title) and stop calling tools.
- Read the lessons below: they are what earlier attempts learned, failures first."""

STRATEGIES = {
    "fuse": "Strategy: fuse. Remove memory traffic by fusing the operations of this opportunity into fewer "
            "kernels (one pass over the data), keeping the math identical.",
    "tile-tune": "Strategy: tile-tune. Keep the structure; pick better tiling, block sizes, layouts or "
                 "library calls for the hot ops of this opportunity.",
    "restructure": "Strategy: restructure. Change how the model computes this part (merge sibling "
                   "projections, hoist invariant work, avoid copies) at the module level.",
    "refine": "Strategy: refine. You start from the strongest earlier candidate (already committed in "
              "this worktree). Improve it further or fix what its verdict says; keep what works.",
}


def system_blocks(knowledge: str) -> list[dict]:
    return [
        {"type": "text", "text": RULES},
        {"type": "text", "text": "# Knowledge\n\n" + knowledge, "cache_control": {"type": "ephemeral"}},
    ]


def task_message(strategy: str, opportunity: dict, target: dict, feedback: str = "") -> str:
    strat = STRATEGIES.get(strategy, f"Strategy: {strategy}.")
    opp = json.dumps(opportunity, indent=1, default=str)
    if len(opp) > 8000:  # e.g. long op id lists: the location, ops and estimate come first anyway
        opp = opp[:8000] + "\n... (truncated)"
    parts = [strat, "", "Opportunity (from optbot analyze):", opp, "",
             "Target:", json.dumps(target, indent=1, default=str)]
    if feedback:
        parts += ["", "Verdict of the candidate you start from:", feedback]
    return "\n".join(parts)
