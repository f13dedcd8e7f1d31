"""One agent: a Messages API tool-use loop over one candidate worktree.

Each turn sends the conversation (cached prefix: tool definitions, rules + knowledge; plus a moving
breakpoint on the newest message), records request and response in the transcript, charges the
usage to the budget, runs the tool calls it asked for and answers with their results. It stops on
end_turn, on any budget (turns, billed tokens, USD), on an API error, or when the model stops for
another reason. Then the worktree becomes one candidate commit with trailers and is validated.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import anthropic

from bot.generate.agent import prompts
from bot.generate.agent.budget import Budget, CostPool, Spend
from bot.generate.agent.candidates import GeneratedCandidate, changed_files, commit_candidate, diff_against, make_trailers, snapshot
from bot.generate.agent.config import AgentConfig
from bot.generate.agent.tools import TOOL_SPECS, ToolHooks, Workspace
from bot.generate.agent.transcript import Transcript
from bot.generate.agent.validation import Check, ValidationContext, check_candidate
from bot.knowledge import learn


@dataclass
class AgentTask:
    """Everything an agent needs about the run; shared by all agents of a generation."""
    run_id: str
    run_dir: Path
    checkout: object  # bot.engine.EngineCheckout
    vctx: ValidationContext
    opportunity: dict  # see opportunity_dict()
    engine: str  # engine name (diffusers, sglang)
    hardware: str  # cpu | h200 | ...
    profile: dict | None = None
    lessons_dir: Path | None = None
    store_dir: Path | None = None

    @classmethod
    def from_target(cls, target, opportunity, run_dir: Path, run_id: str, profile: dict | None = None,
                    lessons_dir: Path | None = None, store_dir: Path | None = None) -> "AgentTask":
        """The task for one opportunity of a run (what `optimize` calls): base worktree, validation
        context with the Target (so the real validator judges), hardware named from the profile."""
        from bot.target import base_worktree

        wt = base_worktree(target)
        dev_name = ((profile or {}).get("env") or {}).get("device_name", "")
        return cls(run_id=run_id, run_dir=Path(run_dir), checkout=target.checkout,
                   vctx=ValidationContext.from_target(target, wt, Path(run_dir)), opportunity=opportunity_dict(opportunity),
                   engine=target.engine_name or target.workload.default_engine,
                   hardware=learn.hardware_name(target.device, dev_name), profile=profile,
                   lessons_dir=lessons_dir, store_dir=store_dir)

    def target_info(self) -> dict:
        return {"workload": self.vctx.workload.get("name"), "preset": self.vctx.preset, "device": self.vctx.device,
                "dtype": self.vctx.dtype, "model_class": self.vctx.model_class, "engine": self.engine,
                "import_root": self.vctx.import_root, "hardware": self.hardware}


@dataclass
class AgentResult:
    name: str
    strategy: str
    stop: str  # why the loop ended
    spend: Spend
    transcript: str
    worktree: str
    candidate: GeneratedCandidate | None = None
    check: Check | None = None
    summary: str = ""
    tool_calls: int = 0
    checks: list[dict] = field(default_factory=list)  # every run_correctness/run_microbenchmark result

    def score(self) -> tuple:
        return self.check.score() if self.check else (-1, 0.0)

    def to_json(self) -> dict:
        return {"name": self.name, "strategy": self.strategy, "stop": self.stop, "spend": self.spend.to_json(),
                "transcript": self.transcript, "worktree": self.worktree, "summary": self.summary,
                "tool_calls": self.tool_calls,
                "candidate": self.candidate.to_json() if self.candidate else None,
                "check": self.check.to_json() if self.check else None, "checks": self.checks}


def opportunity_dict(opp) -> dict:
    """Adapter from the analyze helper's Opportunity (branch `analyze`) to the plain dict the agent
    reads. Accepts a dataclass, an object with to_json(), or a dict."""
    if isinstance(opp, dict):
        d = dict(opp)
    elif hasattr(opp, "to_json"):
        d = opp.to_json()
    else:
        import dataclasses
        d = dataclasses.asdict(opp) if dataclasses.is_dataclass(opp) else dict(vars(opp))
    d.setdefault("id", d.get("opportunity_id", "none"))
    d.setdefault("kind", "launch-bound")
    return d


def _hooks(task: AgentTask, ws_root: Path, result: AgentResult, strategy: str) -> ToolHooks:
    def run(mode: str) -> dict:
        sha = snapshot(ws_root, f"optbot agent snapshot ({strategy})")
        chk = check_candidate(task.vctx, ws_root, sha, mode)
        rec = {"mode": mode, "commit": sha, **chk.to_json()}
        result.checks.append(rec)
        return rec

    def read_profile(top: int) -> str:
        p = task.profile
        if not p:
            return "no profile is available for this run"
        keep = {k: p.get(k) for k in ("device", "total_ms", "step_ms", "launches", "idle_ms", "categories") if k in p}
        keep["kernels"] = (p.get("kernels") or [])[:max(1, min(top, 200))]
        return json.dumps(keep, indent=1, default=str)

    def read_lessons(pattern, query) -> str:
        ls = learn.find_lessons(pattern or None, task.engine, task.hardware, query or "", task.lessons_dir)
        return "\n\n".join(f"## {lv.slug} [{lv.kind}]\n{lv.body}" for lv in ls[:20]) or "no matching lessons"

    def read_store(pattern, entry_id) -> str:
        if entry_id:
            return learn.store_entry_text(entry_id, task.store_dir)
        es = learn.find_entries(pattern or None, task.engine, None, task.store_dir)
        return "\n".join(f"{e.id}: {e.title} [{e.pattern}; {e.status}; hardware {', '.join(e.hardware)}]" for e in es) \
            or "no matching store entries"

    return ToolHooks(lambda: run("correctness"), lambda: run("speed"), read_profile, read_lessons, read_store)


def _content_json(block) -> dict:
    d = block.model_dump(exclude_none=True) if hasattr(block, "model_dump") else dict(block)
    return d


def _with_moving_breakpoint(messages: list[dict]) -> list[dict]:
    """A copy of messages whose newest block carries cache_control, so each turn reads the previous
    turns from the cache. Only one such breakpoint exists at a time (the API allows four in all:
    tools, system, this one)."""
    msgs = copy.deepcopy(messages)
    last = msgs[-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return msgs


def run_agent(task: AgentTask, strategy: str, cfg: AgentConfig, client: anthropic.Anthropic, pool: CostPool,
              *, name: str | None = None, start_ref: str | None = None, feedback: str = "",
              log=print) -> AgentResult:
    from bot.engine import add_worktree

    name = name or strategy
    wt = add_worktree(task.checkout, f"agent-{task.run_id}-{name}", ref=start_ref)
    transcript = Transcript(task.run_dir / "agent" / f"{name}.jsonl")
    result = AgentResult(name, strategy, "", Spend(), str(transcript.path), str(wt))
    ws = Workspace(wt, _hooks(task, wt, result, strategy))
    budget = Budget(cfg.price, cfg.max_turns, cfg.max_tokens, pool, cfg.max_output_tokens)
    result.spend = budget.spent

    knowledge = learn.prompt_context(task.opportunity.get("kind"), task.engine, task.hardware,
                                     lessons_dir=task.lessons_dir, store_dir=task.store_dir)
    tools = copy.deepcopy(TOOL_SPECS)
    tools[-1]["cache_control"] = {"type": "ephemeral"}  # caches the tool definitions
    system = prompts.system_blocks(knowledge)
    messages: list[dict] = [{"role": "user", "content": prompts.task_message(strategy, task.opportunity, task.target_info(), feedback)}]
    transcript.write("start", agent=name, strategy=strategy, model=cfg.model, worktree=str(wt), start_ref=start_ref,
                     budgets={"turns": cfg.max_turns, "tokens": cfg.max_tokens, "usd_pool": cfg.max_cost_usd})
    last_text = ""
    try:
        while True:
            why = budget.stop_reason()
            if why:
                result.stop = why
                break
            req = {"model": cfg.model, "max_tokens": budget.output_cap(), "system": system, "tools": tools,
                   "messages": _with_moving_breakpoint(messages)}
            transcript.write("request", turn=budget.spent.turns + 1, body=req)
            t0 = time.monotonic()
            try:
                resp = client.messages.create(**req)
            except anthropic.APIError as e:
                status = getattr(e, "status_code", None)
                transcript.write("api_error", status=status, message=str(e))
                result.stop = f"API error{f' {status}' if status else ''}: {str(e)[:300]}"
                break
            transcript.write("response", turn=budget.spent.turns + 1, seconds=round(time.monotonic() - t0, 3),
                             body=resp.model_dump(exclude_none=True))
            usage, cost = budget.charge(resp.usage)
            transcript.write("usage", turn=budget.spent.turns, usage=usage, cost_usd=cost,
                             agent_total_usd=budget.spent.cost_usd, pool_total_usd=pool.spent.cost_usd)
            content = [_content_json(b) for b in resp.content]
            messages.append({"role": "assistant", "content": content})
            texts = [b["text"] for b in content if b.get("type") == "text" and b.get("text")]
            if texts:
                last_text = texts[-1]
            calls = [b for b in content if b.get("type") == "tool_use"]
            if resp.stop_reason == "tool_use" and calls:
                results = []
                for b in calls:
                    t1 = time.monotonic()
                    out, is_err = ws.call(b["name"], b.get("input") or {})
                    result.tool_calls += 1
                    transcript.write("tool", id=b["id"], name=b["name"], input=b.get("input"), is_error=is_err,
                                     seconds=round(time.monotonic() - t1, 3), output=out[:4000])
                    results.append({"type": "tool_result", "tool_use_id": b["id"], "content": out, "is_error": is_err})
                messages.append({"role": "user", "content": results})
                continue
            result.stop = {"end_turn": "done (end_turn)", "max_tokens": "response hit max_tokens",
                           "stop_sequence": "stop sequence", "refusal": "the model refused"}.get(
                               resp.stop_reason or "", f"stop_reason {resp.stop_reason}")
            break
        result.summary = last_text.strip()
        _finish(task, result, wt, strategy, name)
    finally:
        transcript.write("end", stop=result.stop, spend=result.spend.to_json(),
                         candidate=result.candidate.to_json() if result.candidate else None,
                         check=result.check.to_json() if result.check else None)
        transcript.close()
    log(f"agent {name}: {result.stop}; {result.spend.line()}"
        + (f"; candidate {result.candidate.commit_sha[:12]}: {result.check.status}: {result.check.reason}"
           if result.candidate and result.check else "; no candidate"))
    return result


def _finish(task: AgentTask, result: AgentResult, wt: Path, strategy: str, name: str) -> None:
    """The worktree (its edits and snapshots since the base) becomes one candidate commit, validated."""
    snapshot(wt, f"optbot agent final state ({name})")
    if not diff_against(wt, task.vctx.base_sha).strip():
        return  # the agent changed nothing: no candidate
    title = (result.summary.splitlines()[0].strip("# ").strip() if result.summary else "") or \
        f"{task.opportunity.get('kind')}: agent candidate ({strategy})"
    title = title[:100]
    opp = task.opportunity
    trailers = make_trailers(str(opp.get("id", "none")), str(opp.get("kind")), f"agent/{strategy}", task.run_id)
    body = (f"Generated by optbot's Anthropic agent (strategy {strategy}, run {task.run_id}).\n\n"
            + (result.summary[:2000] if result.summary else ""))
    sha = commit_candidate(wt, task.vctx.base_sha, title, body, trailers)
    mode = "full" if task.vctx.device.startswith("cuda") else "correctness"
    result.check = check_candidate(task.vctx, wt, sha, mode)
    result.candidate = GeneratedCandidate(
        id=f"agent-{name}-{sha[:8]}", opportunity_id=str(opp.get("id", "none")), kind=str(opp.get("kind")),
        generator=f"agent/{strategy}", worktree=str(wt), commit_sha=sha, base_sha=task.vctx.base_sha,
        trailers=trailers, title=title)


def outcome_of(task: AgentTask, r: AgentResult, engine_source: str = "") -> learn.Outcome | None:
    """A finished agent's candidate and verdict as a learning Outcome (None without a candidate)."""
    if not r.candidate or not r.check:
        return None
    wt = Path(r.worktree)
    patch = diff_against(wt, task.vctx.base_sha, r.candidate.commit_sha)
    files = changed_files(wt, task.vctx.base_sha, r.candidate.commit_sha)
    import git
    repo = git.Repo(wt)
    added = {}
    for f in repo.git.diff(task.vctx.base_sha, r.candidate.commit_sha, "--name-only", "--diff-filter=A").splitlines():
        if f:
            added[f] = repo.git.show(f"{r.candidate.commit_sha}:{f}", strip_newline_in_stdout=False)
    pr = task.vctx.workload["presets"][task.vctx.preset]
    return learn.Outcome(
        candidate_id=r.candidate.id, kind=r.candidate.kind, generator=r.candidate.generator, run_id=task.run_id,
        status=r.check.status, reason=r.check.reason, numbers=r.check.numbers, device=task.vctx.device,
        hardware=task.hardware, engine=task.engine, engine_source=engine_source, base_sha=task.vctx.base_sha,
        commit_sha=r.candidate.commit_sha, title=r.candidate.title, patch=patch, changed_files=files,
        added_files=added, workload=str(task.vctx.workload.get("name", "")), shapes=[pr["shapes"]],
        dtype=task.vctx.dtype, validated_by=r.check.by)
