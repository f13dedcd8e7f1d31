"""One agent: a Messages API tool-use loop over one candidate worktree.

Each turn sends the conversation (cached prefix: tool definitions, rules + knowledge; plus a moving
breakpoint on the newest message), records request and response in the transcript, charges the
usage to the budget, runs the tool calls it asked for and answers with their results. A response
cut off at max_tokens is continued (its tool calls, possibly incomplete, are answered "send it
again"). It stops on end_turn, on any budget (turns, billed tokens, USD, wall seconds), on an API
error, or when the model stops for another reason. Then the worktree becomes one candidate commit
with the declared kernels' trailers, and is validated; when an earlier validated snapshot was
stronger (validation.strength) than that final state, the candidate is made from that snapshot.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING


from bot.errors import OptbotError
from bot.generate.agent import prompts
from bot.generate.agent.brief import OpportunityBrief, for_task
from bot.generate.agent.budget import AgentBudget, CostPool, Spend
from bot.generate.agent.config import AgentConfig
from bot.generate.agent.tools import TOOL_SPECS, Declaration, ToolError, ToolHooks, Workspace, read_profile_text
from bot.generate.agent.transcript import Transcript
from bot.generate.agent.validation import (ValidationContext, cached_verdict, strength, validate_commit,
                                           verdict_line)
from bot.generate.candidate import Candidate, commit_message, make_trailers
from bot.generate.commits import changed_since, commit_candidate, reset_to, snapshot, squash_of
from bot.knowledge import store
from bot.knowledge.check import run_kernel_test
from bot.knowledge.prompt import store_entry_text
from bot.validate.verdict import Verdict

if TYPE_CHECKING:  # the client is only needed to run an agent, not to build its prompt (benchmarks/agent_prompt.py)
    import anthropic


@dataclass
class AgentTask:
    """Everything an agent needs about the run; shared by all agents of a generation."""
    run_id: str
    run_dir: Path
    checkout: object  # bot.engine.EngineCheckout
    vctx: ValidationContext
    opportunity: dict  # the Opportunity (bot/analyze/opportunity.py) as JSON: what the prompt shows
    engine: str  # engine name (diffusers, sglang)
    hardware: str  # cpu | h200 | ...
    profile: dict | None = None
    lessons_dir: Path | None = None
    store_dir: Path | None = None
    graph_file: str | None = None  # the base step's captured graph (analysis meta graph_file): the brief's slice

    def target_info(self) -> dict:
        t = self.vctx.target
        return {"workload": t.workload.name, "preset": t.preset, "device": t.device, "dtype": t.dtype,
                "model_class": t.model_class, "engine": self.engine, "import_root": t.checkout.import_root,
                "hardware": self.hardware}


def first_request(task: AgentTask, strategy: str, brief, feedback: str = "", *, sample: int = 1, samples: int = 1,
                  findings: str = "") -> tuple[list[dict], list[dict], list[dict]]:
    """(tools, system blocks, messages) of an agent's first request: what it is told before its
    first turn. benchmarks/agent_prompt.py renders the same for docs (docs/generate.md)."""
    knowledge = prompts.knowledge_block(task.opportunity.get("kind"), task.engine, task.hardware,
                                        task.vctx.target.workload.name, lessons_dir=task.lessons_dir,
                                        store_dir=task.store_dir)
    tools = copy.deepcopy(TOOL_SPECS)
    tools[-1]["cache_control"] = {"type": "ephemeral"}  # caches the tool definitions
    system = prompts.system_blocks(knowledge)
    return tools, system, [{"role": "user", "content": prompts.task_message(
        strategy, brief, task.target_info(), feedback, sample=sample, samples=samples, findings=findings)}]


@dataclass
class AgentResult:
    name: str
    strategy: str
    stop: str  # why the loop ended
    spend: Spend
    transcript: str
    worktree: str
    candidate: Candidate | None = None
    verdict: Verdict | None = None  # the validator's verdict on the candidate
    error: str = ""  # why the candidate has no verdict (the validator could not judge it)
    summary: str = ""
    tool_calls: int = 0
    validations: list[dict] = field(default_factory=list)  # every run_correctness / run_microbenchmark call
    kernel_tests: list[dict] = field(default_factory=list)  # every run_kernel_test run: path, commit, ok, reason
    cut_off: int = 0  # responses that hit max_tokens and were continued
    from_snapshot: str = ""  # the earlier validated snapshot the candidate was made from ("" = the final state)

    def to_json(self) -> dict:
        return {"name": self.name, "strategy": self.strategy, "stop": self.stop, "spend": self.spend.to_json(),
                "transcript": self.transcript, "worktree": self.worktree, "summary": self.summary,
                "tool_calls": self.tool_calls,
                "candidate": self.candidate.to_json() if self.candidate else None,
                "verdict": self.verdict.to_json() if self.verdict else None, "error": self.error,
                "validations": self.validations, "kernel_tests": self.kernel_tests, "cut_off": self.cut_off,
                "from_snapshot": self.from_snapshot}


@dataclass
class Snapshot:
    """A validated state of the worktree: the one-commit squash the validator judged, with the
    declaration it carried."""
    sha: str
    declared: Declaration
    verdict: Verdict


@dataclass
class Best:
    """The strongest validated snapshot so far (validation.strength; a later one wins a tie)."""
    snapshot: Snapshot | None = None

    def note(self, snap: Snapshot) -> None:
        if self.snapshot is None or strength(snap.verdict) >= strength(self.snapshot.verdict):
            self.snapshot = snap


CUT_OFF = ("Your response was cut off at the output token limit (max_tokens = {cap}) before it ended. "
           "Continue from where you stopped; keep each tool call small enough to fit (write a large file "
           "in parts: write_file, then edit_file).")
CUT_OFF_CALL = ("not run: your response was cut off at max_tokens before it ended, so this call may be "
                "incomplete; send it again")


def trailers_for(task: "AgentTask", strategy: str, declared: Declaration) -> dict[str, str]:
    """The candidate's trailers: the opportunity, and what the agent declared (declare_kernels)."""
    opp = task.opportunity
    return make_trailers(str(opp.get("id", "none")), str(opp.get("kind")), list(declared.adds),
                         list(declared.removes), kernel_tests=list(declared.tests), generator=f"agent/{strategy}",
                         run_id=task.run_id)


def _kernel_test_text(rel: str, check) -> str:
    """run_kernel_test's answer for one test: PASS/FAIL and the reason (the first failing case, or the
    cases and the worst error; on CUDA the microbenchmark speedups); on a failure the worst error over
    all cases, and the log tail of a job that did not finish (an import error in the test, say)."""
    d = check.details or {}
    cases = d.get("cases") or []
    worst = max((c["max_abs"] for c in cases if c.get("max_abs") is not None), default=None)
    extra = f"; worst max abs over all cases {worst:.3g}" if worst is not None and not check.ok else ""
    if cases and not d.get("micro"):
        extra += "; no microbenchmark" + ("" if str(d.get("device", "")).startswith("cuda") else " (speed needs a GPU)")
    if d.get("log_tail"):
        extra += f"\nlog tail:\n{d['log_tail']}"
    return f"{rel}: {'PASS' if check.ok else 'FAIL'}: {check.reason}{extra}"


def _hooks(task: AgentTask, ws_root: Path, result: AgentResult, strategy: str, brief: OpportunityBrief,
           best: Best, budget: AgentBudget, cfg: AgentConfig) -> ToolHooks:
    def run(mode: str, declared: Declaration) -> str:
        why = budget.pool.wall_spent()
        if why:
            raise ToolError(f"not run: {why}; answer with your summary now")
        snapshot(ws_root, f"optbot agent snapshot ({strategy})")
        sha = squash_of(ws_root, task.vctx.base_sha, commit_message(
            f"optbot agent validation ({strategy})", "", trailers_for(task, strategy, declared)))
        rec: dict = {"mode": mode, "commit": sha, "declared": declared.to_json()}
        result.validations.append(rec)
        try:
            v = validate_commit(task.vctx, sha, speed=mode == "speed")
        except OptbotError as e:
            rec["error"] = str(e)
            raise ToolError(f"the validator could not judge commit {sha[:12]}: {e}") from None
        rec.update(status=v.status, reason=v.reason, summary=v.summary, run_dir=v.run_dir)
        best.note(Snapshot(sha, declared, v))
        same = "" if v.candidate_sha == sha else f" (the same files as {v.candidate_sha[:12]}, validated before)"
        return f"commit {sha[:12]}{same}: {v.status}\n{v.render()}"

    def kernel_test(tests: list[str]) -> str:
        why = budget.pool.wall_spent()
        if why:
            raise ToolError(f"not run: {why}; answer with your summary now")
        sha = snapshot(ws_root, f"optbot agent snapshot ({strategy})")
        t = task.vctx.target
        out = []
        for rel in tests:
            n = len(result.kernel_tests) + 1
            work = task.vctx.work_dir / "kernel-tests" / f"{result.name}-{n}-{Path(rel).stem}"
            check = run_kernel_test(ws_root / rel, str(ws_root / t.checkout.import_root), sha, t.device, work,
                                    timeout_s=cfg.job_timeout_s, name=f"{result.name}-{n}")
            result.kernel_tests.append({"path": rel, "commit": sha, "ok": check.ok, "reason": check.reason})
            out.append(_kernel_test_text(rel, check))
        return "\n".join(out)

    def read_profile(top: int) -> str:
        return read_profile_text(task.profile, top, brief.kernels)

    def read_lessons(pattern, query) -> str:
        ls = prompts.agent_lessons(query or "", pattern or None, task.engine, task.hardware, task.lessons_dir)
        return "\n\n".join(f"## {lv.slug} [{lv.kind}]\n{lv.body}" for lv in ls[:20]) or "no matching lessons"

    def read_store(pattern, entry_id) -> str:
        if entry_id:
            return store_entry_text(entry_id, task.store_dir)
        es = store.find_entries(pattern or None, task.engine, None, task.store_dir)
        return "\n".join(f"{e.id}: {e.title} [{e.pattern}; {e.status}; hardware {', '.join(e.hardware)}]" for e in es) \
            or "no matching store entries"

    return ToolHooks(lambda d: run("correctness", d), lambda d: run("speed", d), read_profile, read_lessons,
                     read_store, kernel_test)


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
              findings: str = "", sample: int = 1, samples: int = 1, log=print) -> AgentResult:
    """One agent of `strategy` (sample `sample` of `samples` of it), in its own worktree at `start_ref`
    (default: the base); `feedback` (the verdict of the candidate it starts from) and `findings` (what
    the other agents found) go in its first message."""
    from bot.engine import add_worktree

    import anthropic

    name = name or strategy
    wt = add_worktree(task.checkout, f"agent-{task.run_id}-{name}", ref=start_ref)
    transcript = Transcript(task.run_dir / "agent" / f"{name}.jsonl")
    result = AgentResult(name, strategy, "", Spend(), str(transcript.path), str(wt))
    brief = for_task(task)
    budget = AgentBudget(cfg.price, cfg.max_turns, cfg.max_tokens, pool, cfg.max_output_tokens)
    result.spend = budget.spent
    best = Best()
    ws = Workspace(wt, _hooks(task, wt, result, strategy, brief, best, budget, cfg))

    tools, system, messages = first_request(task, strategy, brief, feedback, sample=sample, samples=samples,
                                            findings=findings)
    transcript.write("start", agent=name, strategy=strategy, sample=sample, samples=samples, model=cfg.model,
                     worktree=str(wt), start_ref=start_ref,
                     budgets={"turns": cfg.max_turns, "tokens": cfg.max_tokens, "usd_pool": cfg.max_cost_usd,
                              "wall_s_pool": pool.max_wall_s})
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
            wall = pool.wall_left()  # a request does not outlast the wall-time budget
            try:
                resp = client.messages.create(**req, **({"timeout": max(1.0, min(cfg.timeout_s, wall))}
                                                        if wall is not None else {}))
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
            content = [_content_json(b) for b in resp.content] or [{"type": "text", "text": "(no output)"}]
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
            if resp.stop_reason == "max_tokens":  # cut off: continue the turn, within the budgets
                result.cut_off += 1
                answers = [{"type": "tool_result", "tool_use_id": b["id"], "content": CUT_OFF_CALL, "is_error": True}
                           for b in calls]
                messages.append({"role": "user", "content": answers + [
                    {"type": "text", "text": CUT_OFF.format(cap=req["max_tokens"])}]})
                transcript.write("cut_off", turn=budget.spent.turns, max_tokens=req["max_tokens"],
                                 unanswered_calls=[b["name"] for b in calls])
                continue
            result.stop = {"end_turn": "done (end_turn)", "stop_sequence": "stop sequence",
                           "refusal": "the model refused"}.get(
                               resp.stop_reason or "", f"stop_reason {resp.stop_reason}")
            break
        result.summary = last_text.strip()
        _finish(task, result, wt, strategy, name, ws.declared, best, pool.wall_spent())
    finally:
        transcript.write("end", stop=result.stop, spend=result.spend.to_json(),
                         candidate=result.candidate.to_json() if result.candidate else None,
                         verdict=result.verdict.to_json() if result.verdict else None, error=result.error)
        transcript.close()
    judged = verdict_line(result.verdict) if result.verdict else result.error
    log(f"agent {name}: {result.stop}; {result.spend.line()}"
        + (f"; candidate {result.candidate.commit_sha[:12]}: {judged}" if result.candidate else "; no candidate"))
    return result


def _finish(task: AgentTask, result: AgentResult, wt: Path, strategy: str, name: str, declared: Declaration,
            best: Best, wall_spent: str | None) -> None:
    """The worktree (its edits and snapshots since the base) becomes one candidate commit, validated.
    When an earlier validated snapshot is stronger than that final state (a later edit broke what
    was correct), the candidate is made from that snapshot instead. With the wall-time budget spent,
    nothing new is validated: the best snapshot, with its verdict, is the candidate."""
    base = task.vctx.base_sha
    snapshot(wt, f"optbot agent final state ({name})")
    if not changed_since(wt, base):
        return  # the agent changed nothing: no candidate
    title = (result.summary.splitlines()[0].strip("# ").strip() if result.summary else "") or \
        f"{task.opportunity.get('kind')}: agent candidate ({strategy})"
    title = title[:100]
    body = (f"Generated by optbot's Anthropic agent (strategy {strategy}, run {task.run_id}).\n\n"
            + (result.summary[:2000] if result.summary else ""))
    speed = task.vctx.target.device.startswith("cuda")
    sha = commit_candidate(wt, base, title, body, trailers_for(task, strategy, declared))
    verdict, error = cached_verdict(task.vctx, sha, speed=speed), ""
    if verdict is None and wall_spent:
        error = f"not validated: {wall_spent}"
    elif verdict is None:
        try:
            verdict = validate_commit(task.vctx, sha, speed=speed)
        except OptbotError as e:
            error = f"the validator could not judge it: {e}"
    snap = best.snapshot
    if snap is not None and strength(snap.verdict) > strength(verdict):
        final = verdict_line(verdict) if verdict else error
        result.from_snapshot = snap.sha
        declared = snap.declared
        reset_to(wt, snap.sha)
        body += (f"\n\nThis is the agent's validated snapshot {snap.sha[:12]} ({snap.verdict.status}); its final "
                 f"state {sha[:12]} was weaker: {final}")
        sha = commit_candidate(wt, base, title, body, trailers_for(task, strategy, declared))
        verdict, error = cached_verdict(task.vctx, sha, speed=speed), ""
        if verdict is None and not wall_spent:
            try:
                verdict = validate_commit(task.vctx, sha, speed=speed)
            except OptbotError as e:
                error = f"the validator could not judge it: {e}"
        if verdict is None and wall_spent:
            verdict = snap.verdict  # the snapshot's own verdict (on CUDA, maybe correctness only)
    trailers = trailers_for(task, strategy, declared)
    opp = task.opportunity
    result.candidate = Candidate(
        id=f"agent-{name}-{sha[:8]}", opportunity_id=str(opp.get("id", "none")), kind=str(opp.get("kind")),
        generator=f"agent/{strategy}", worktree=str(wt), commit_sha=sha, base_sha=base,
        adds_kernels=list(declared.adds), removes_kernels=list(declared.removes), trailers=trailers,
        title=title, description=commit_message(title, body, trailers), estimated_gain_ms=opp.get("gain_ms"))
    result.verdict, result.error = verdict, error
