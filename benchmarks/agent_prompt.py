"""Render what the agent is told for one opportunity of a real run: its first request (the cached
system prompt with rules and knowledge, the tool names, the first user message with the opportunity
brief), from that run's own analysis, captured graph and profile. docs/generate.md keeps one such
rendering (FLUX.2's top opportunity on the H200) as its example.

    python benchmarks/agent_prompt.py RUN_ID [--opportunity ID] [--strategy fuse] [--store DIR --lessons DIR] --out FILE

RUN_ID is a folder of $OPTBOT_RUNS_DIR (or .optbot/runs) that reached the analyze step; without
--opportunity the top-ranked opportunity of its analysis is taken. --store/--lessons replace the
run's knowledge (a run made on an emptied store can be rendered with the full one).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.errors import OptbotError  # noqa: E402
from bot.generate.agent.brief import for_task  # noqa: E402
from bot.generate.agent.loop import first_request  # noqa: E402
from bot.run.context import Budget, RunContext  # noqa: E402
from bot.run.state import RunState  # noqa: E402
from bot.steps.generate import agent_task  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_id")
    ap.add_argument("--opportunity", help="opportunity id (default: the top-ranked)")
    ap.add_argument("--strategy", default="fuse")
    ap.add_argument("--store", type=Path)
    ap.add_argument("--lessons", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    try:
        state = RunState.load(a.run_id)
    except OptbotError as e:
        print(f"agent_prompt: {e}", file=sys.stderr)
        return 2
    full = state.run_dir / "analysis.full.json"
    if not full.is_file():
        print(f"{full}: missing (the run has not reached analyze)", file=sys.stderr)
        return 2
    opps = json.loads(full.read_text())["opportunities"]
    opp = next((o for o in opps if o["id"] == a.opportunity), None) if a.opportunity else opps[0]
    if opp is None:
        print(f"--opportunity {a.opportunity}: not in {full} ({', '.join(o['id'] for o in opps[:5])}, ...)", file=sys.stderr)
        return 2
    ctx = RunContext(run_id=state.run_id, run_dir=state.run_dir, options=state.options, budget=Budget(),
                     results=state.results(), log=lambda m: None)
    task = agent_task(ctx, opp, store_dir=a.store, lessons_dir=a.lessons)
    tools, system, messages = first_request(task, a.strategy, for_task(task))
    t = ctx.target
    head = (f"# What the agent is told: {opp['kind']} {opp['id']} of {t.workload.name} ({t.preset}, {t.device}, "
            f"{ctx.hardware()})\n\nRendered by `python benchmarks/agent_prompt.py {' '.join(sys.argv[1:])}` "
            f"from run {state.run_id} (engine {t.checkout.name} @ {t.checkout.base_sha[:12]}): the first request of "
            f"an agent with strategy `{a.strategy}`, as bot/generate/agent/loop.first_request builds it.\n")
    parts = [head, f"## Tools ({len(tools)})\n", ", ".join(f"`{x['name']}`" for x in tools) + "\n"]
    for i, b in enumerate(system, 1):
        parts += [f"## System block {i}{' (cached)' if b.get('cache_control') else ''}\n", "````text", b["text"], "````\n"]
    parts += ["## First user message\n", "````text", messages[0]["content"], "````\n"]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(parts))
    print(f"wrote {a.out} ({a.out.stat().st_size:,} bytes; opportunity {opp['id']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
