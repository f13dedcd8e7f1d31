"""What the agent is told. The static part (rules, then the lessons and worked store entries that
match the pattern, engine and workload) is the cached system prompt; the opportunity brief
(brief.py), the strategy, the sample number and (for a refinement) what the other agents found go in
the first user message, so every agent of a generation shares one cache prefix.

The knowledge block is ranked, then filled: lessons first (caveats first, as lessons.search ranks
them), then the worked examples (store entries in full: entry.yaml, kernel sources, test_<op>.py,
patch.diff, where a kernel source the patch adds unchanged is named rather than repeated) ranked by
pattern, then engine, then workload. Each item goes in whole or not at all;
one that does not fit the budget is named at the end with its size (read_lessons / read_store show
it), and smaller items after it still go in.

Lessons and hardware: a lesson's `hardware` condition is where its evidence was measured. A lesson
tagged with another hardware is kept unless it is a speed result (`is_speed_lesson`: its text
reports a measured speed: a speedup factor such as 1.01x, "speedup", "ms per step", "no-change",
"slower", "faster"). Correctness and fallback lessons (a CPU-interpreter pitfall, a kernel that
faults under CUDA graphs, a fallback that must replay the unfused ops) apply on any hardware.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from bot.generate.agent.brief import OpportunityBrief, build_brief
from bot.knowledge import lessons as lessons_mod
from bot.knowledge.store import find_entries

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
- New kernels are Triton (they run on CPU under TRITON_INTERPRET=1) or plain torch. Write each kernel \
with its test_<op>.py beside it (the kernel test contract of the worked examples: SHAPES with M=1 and odd \
sizes, CASES [(dtype, atol, rtol)], make_inputs, reference, kernel, kernel_path), declare them with \
declare_kernels (the kernels added and removed, and the tests), and run run_kernel_test until it passes \
before run_correctness: the validator checks the declared kernels run in the step and re-runs their tests.
- Use run_correctness after each meaningful change, and run_microbenchmark when correct. When done, \
answer with a short summary (first line: a one-line commit title) and stop calling tools.
- Read the lessons below: they are what earlier attempts learned, failures first. The worked examples \
after them are validated store entries in full (kernel, its test, the engine patch): follow their layout.
- The first message briefs your opportunity: where it is, what it is estimated to save and why, the ops \
of one instance with their shapes, dtypes and scalar arguments, its kernels' measured times, the \
roofline floor at the measured peaks, and the tolerance your outputs must meet."""

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


KNOWLEDGE_CHARS = 120_000  # the knowledge block's budget (~30k tokens, written to the cache once per generation)
MAX_EXAMPLES = 3  # worked examples at most
_SPEED = re.compile(r"\b\d+(?:\.\d+)?x\b|speed-?up|ms per step|no-change|\bslower\b|\bfaster\b", re.I)


def is_speed_lesson(lesson) -> bool:
    """A lesson that reports a measured speed: true only of the hardware it names."""
    return bool(_SPEED.search(lesson.text()))


def agent_lessons(query: str, pattern: str | None, engine: str | None, hardware: str | None,
                  root: Path | None = None) -> list:
    """The lessons an agent on `hardware` is shown: those of the pattern and engine, minus the speed
    results of other hardware (the module docstring gives the rule)."""
    found = lessons_mod.search(query, pattern, engine, None, root=root, caveats_first=True)
    return [le for le in found if le.applies(hardware=hardware) or not is_speed_lesson(le)]


@dataclass(frozen=True)
class _Item:
    label: str  # how a left-out item is named
    text: str


def _example_text(e) -> str:
    """One store entry in full, as a worked example."""
    parts = [f"### Worked example: store entry {e.id} ({e.pattern}; engine {e.engine.name}; "
             f"workloads {', '.join(e.workloads)}; {e.status})\n{e.title}"]
    files = [e.path / "entry.yaml"] + e.kernel_files() + e.test_files()
    for f in files:
        if f.is_file():
            lang = "yaml" if f.suffix == ".yaml" else "python"
            parts.append(f"{f.name}:\n```{lang}\n{f.read_text().rstrip()}\n```")
    if e.patch_path.is_file():
        parts.append(f"{e.patch_path.name}:\n```diff\n{example_patch(e)}\n```")
    return "\n\n".join(parts)


def example_patch(e) -> str:
    """The entry's patch as a worked example shows it: a file the patch adds whose text is one of the
    entry's kernel files (shown above it) is named, not repeated (it is most of a kernel entry's patch)."""
    kernels = {f.name: f.read_text() for f in e.kernel_files() if f.is_file()}
    out = []
    for section in re.split(r"(?m)^(?=diff --git )", e.patch_path.read_text()):
        head, _, body = section.partition("\n@@ ")
        first = head.split("\n", 1)[0]  # diff --git a/PATH b/PATH
        name = first.rsplit("/", 1)[-1]
        if "--- /dev/null" in head and name in kernels:
            added = "".join(line[1:] + "\n" for line in ("@@ " + body).splitlines()[1:] if line.startswith("+"))
            if added == kernels[name]:
                out.append(f"{first}\n(a new file: the text of {name} above)\n")
                continue
        out.append(section)
    return "".join(out).rstrip()


def worked_examples(pattern: str | None, engine: str | None, workload: str | None, store_dir: Path | None = None) -> list:
    """Store entries ranked by matching pattern, then engine, then workload; entries that match none
    of pattern and engine are no example for this opportunity."""
    def key(e):
        return (e.pattern != pattern, e.engine.name != engine, workload not in e.workloads, e.id)
    es = [e for e in find_entries(None, None, None, store_dir) if e.pattern == pattern or e.engine.name == engine]
    return sorted(es, key=key)[:MAX_EXAMPLES]


def knowledge_block(pattern: str | None, engine: str | None, hardware: str | None, workload: str | None = None, *,
                    lessons_dir: Path | None = None, store_dir: Path | None = None,
                    max_chars: int = KNOWLEDGE_CHARS) -> str:
    """The knowledge part of the system prompt: ranked lessons and worked examples, filled whole
    within `max_chars` (the module docstring gives the order and the rule)."""
    items = [_Item(f"lesson {le.slug}", f"### [{le.kind}, confidence {le.confidence}"
                   + (f"; {le.seen_line()}" if le.seen_line() else "") + f"] {le.slug}\n{le.body}")
             for le in agent_lessons("", pattern, engine, hardware, lessons_dir)]
    n_lessons = len(items)
    items += [_Item(f"store entry {e.id}", _example_text(e)) for e in worked_examples(pattern, engine, workload, store_dir)]
    # the two section headers count against the budget too (reserved whether or not both appear)
    headers = ("## Lessons from earlier runs (caveats first)", "## Worked examples: validated kernel-store entries, in full")
    kept, left, used = [], [], sum(len(h) + 2 for h in headers)
    for i, it in enumerate(items):
        if used + len(it.text) + 2 <= max_chars:
            kept.append((i, it))
            used += len(it.text) + 2
        else:
            left.append(f"{it.label} ({len(it.text):,} characters)")
    parts = []
    ls = [it.text for i, it in kept if i < n_lessons]
    ex = [it.text for i, it in kept if i >= n_lessons]
    if ls:
        parts += [headers[0]] + ls
    if ex:
        parts += [headers[1]] + ex
    if left:
        parts.append("Left out for space (read_lessons / read_store show them): " + "; ".join(left))
    return "\n\n".join(parts) if parts else "No lessons or store entries match this pattern, engine and hardware yet."


def system_blocks(knowledge: str) -> list[dict]:
    return [
        {"type": "text", "text": RULES},
        {"type": "text", "text": "# Knowledge\n\n" + knowledge, "cache_control": {"type": "ephemeral"}},
    ]


def sample_line(sample: int, samples: int) -> str:
    """What sets one sample of a strategy apart from the others ("" when the strategy has one)."""
    if samples <= 1:
        return ""
    if sample <= 1:
        return (f"Sample 1 of {samples} for this strategy: other agents work on the same strategy at the same "
                "time, each told to take another approach; take the approach you judge most direct.")
    return (f"Sample {sample} of {samples} for this strategy: take a different approach from the obvious one "
            "(sample 1 takes that): another decomposition, kernel boundary, memory layout or library call, so "
            "that the samples together cover more ground.")


def task_message(strategy: str, opportunity, target: dict, feedback: str = "", *, sample: int = 1,
                 samples: int = 1, findings: str = "") -> str:
    """The first user message: strategy, the sample number (when a strategy has several), the
    opportunity brief (an OpportunityBrief, or an Opportunity's JSON, briefed without graph or
    profile), the target; for a refinement the verdict of the candidate it starts from and what the
    other agents found (`findings`)."""
    strat = STRATEGIES.get(strategy, f"Strategy: {strategy}.")
    brief = opportunity if isinstance(opportunity, OpportunityBrief) else build_brief(opportunity)
    line = sample_line(sample, samples)
    parts = [strat] + ([line] if line else []) + ["", "# The opportunity (from optbot analyze)", "", brief.render(),
                                                  "", "Target:", json.dumps(target, indent=1, default=str)]
    if feedback:
        parts += ["", "Verdict of the candidate you start from:", feedback]
    if findings:
        parts += ["", findings]
    return "\n".join(parts)


FINDINGS_CHARS = 8_000  # the digest of the other agents' findings in a refinement's first message


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0].strip() if (text or "").strip() else ""


def _collapse(items: list[str]) -> str:
    """a, a, b -> "a x2, b": repeats in a row counted, order kept."""
    out: list[list] = []
    for it in items:
        if out and out[-1][0] == it:
            out[-1][1] += 1
        else:
            out.append([it, 1])
    return ", ".join(t + (f" x{n}" if n > 1 else "") for t, n in out)


def finding(r) -> str:
    """One agent's findings (an AgentResult: bot/generate/agent/loop.py), in a few whole lines: name,
    strategy, its candidate's verdict line (or why it has none, or why it stopped), its final summary's
    first line, the validations it asked for and the kernel tests it ran, each with its outcome."""
    from bot.generate.agent.validation import verdict_line

    if r.candidate is not None and r.verdict is not None:
        head = f"candidate {verdict_line(r.verdict)}"
    elif r.candidate is not None:
        head = f"candidate without a verdict: {_first_line(r.error) or 'not validated'}"
    else:
        head = "no candidate (changed nothing)" if not r.stop.startswith("failed") else "no candidate"
    lines = [f"- {r.name} (strategy {r.strategy}): {head}"]
    if r.stop:
        lines.append(f"  stopped: {_first_line(r.stop)}")
    title = _first_line(r.summary)
    if title:
        lines.append(f"  its summary: {title}")
    if r.candidate is not None and (r.candidate.adds_kernels or r.candidate.removes_kernels):
        lines.append(f"  declared kernels: adds {', '.join(r.candidate.adds_kernels) or 'none'}; "
                     f"removes {', '.join(r.candidate.removes_kernels) or 'none'}")
    vals = [f"{v.get('mode')} " + (f"error: {_first_line(v['error'])}" if v.get("error") else
                                   str(v.get("status")) + (f" ({v['reason']})" if v.get("reason") else ""))
            for v in r.validations]
    if vals:
        lines.append(f"  validations: {_collapse(vals)}")
    if r.kernel_tests:
        by: dict[str, list[dict]] = {}
        for k in r.kernel_tests:
            by.setdefault(str(k.get("path")), []).append(k)
        tests = []
        for path, runs in by.items():
            last = runs[-1]
            outcome = "PASS" if last.get("ok") else "FAIL"
            why = _first_line(str(last.get("reason") or ""))
            tests.append(f"{path}: {len(runs)} run{'s' if len(runs) > 1 else ''}, last {outcome}"
                         + (f" ({why})" if why and not last.get("ok") else ""))
        lines.append(f"  kernel tests: {'; '.join(tests)}")
    else:
        lines.append("  kernel tests: none run")
    return "\n".join(lines)


def findings_digest(results: list, max_chars: int = FINDINGS_CHARS) -> str:
    """What the other agents of earlier rounds found, strongest first (validation.strength; ties in
    the order they ran), for a refinement's first message. Each agent goes in whole; when they do not
    all fit in `max_chars`, the weakest are left out and counted. "" when there are none."""
    from bot.generate.agent.validation import strength

    if not results:
        return ""
    ranked = sorted(results, key=lambda r: strength(r.verdict) if r.candidate is not None else (-2, 0.0),
                    reverse=True)
    head = (f"What the other agents found ({len(results)} of the earlier rounds, strongest first; learn from "
            "their failures and do not repeat them):")
    kept, used = [], len(head)
    for r in ranked:
        text = finding(r)
        if used + len(text) + 1 > max_chars - 80:  # 80: room for the left-out line
            break
        kept.append(text)
        used += len(text) + 1
    left = len(ranked) - len(kept)
    tail = [f"({left} more agent{'s' if left > 1 else ''} left out for space, the weakest)"] if left else []
    return "\n".join([head] + kept + tail)
