"""The nightly store check's proposal (`optbot store check --engine PATH --propose`): every entry
checked against the engine's tip, like a lockfile against its registry, and what the check found
turned into ONE knowledge pull request on a fixed branch.

Per entry (`decide`, from its EntryCheck and its bench.json; the rules are docs/store.md's):

  outcome              when                                                   action
  holds                applies, correct, engaged (and on a GPU wins), in the  none
                       environment bench.json recorded
  environment-changed  as holds, but GPU / driver / torch / triton / engine   re-recorded: the new verdict
                       sha differ from what bench.json recorded (or nothing   into bench.json
                       was recorded on this device kind)
  no-longer-applies    the patch conflicts on the tip, or the patched tip      retired
                       computes something else (correctness), no longer runs
                       the kernels (not-engaged) or crashes
  no-longer-wins       GPU only: correct and engaged, but rejected slower or   re-tuned when the entry has a
                       no-change by the validator's speed gates                config space (variant search on
                                                                              the tip, the tuned patch validated
                                                                              there); else, or when no config
                                                                              wins, retired
  needs-a-person       held, a kernel test or the sources check failed, the   none (the row says why)
                       validator could not run
  not-checked          an entry of another engine than the one checked        none

CPU timings never decide "no longer wins": on CPU the validator gives correctness and engagement
only (DESIGN decision 7), and a CPU row says that speed was not checked.

Every change is made in a staging copy of the entry under the run directory (the knowledge
checkout's working tree is never touched) and committed with bot/deliver/knowledge.py onto
``optbot/store-check/<engine>`` from the knowledge repository's HEAD, then published by the forge
(bot/deliver/forge.make_forge): a second night force-updates the same branch and so the same pull
request; a pull request a person closed stays closed (the forge's rule).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bot.hardware import hardware_name
from bot.knowledge.check import EntryCheck, Prepared, _full_validation, record_validation
from bot.knowledge.records import now
from bot.knowledge.store import Entry, load_entry, set_status

# which parts of the environment make a recorded verdict another machine's (bench.json env keys)
ENV_KEYS = ("device_name", "driver", "torch", "triton")
# verdict reasons that say the patch no longer fits the engine (as opposed to no longer paying off)
NO_LONGER_APPLIES = ("correctness", "not-engaged", "crashed")
NO_LONGER_WINS = ("slower", "no-change")
_RANK = {"none": 0, "re-record": 1, "re-tune": 2, "retire": 3}


def branch_name(engine: str) -> str:
    """The one branch of the nightly proposal per engine (two engine repositories sharing one
    knowledge repository do not overwrite each other's proposal)."""
    return f"optbot/store-check/{engine}"


@dataclass
class Decision:
    """What the check of one entry means for the entry."""
    entry_id: str
    outcome: str  # holds | environment-changed | no-longer-applies | no-longer-wins | needs-a-person | not-checked
    action: str  # none | re-record | re-tune | retire
    why: str
    checks: str  # the checks, one word each: "patch ok, kernels ok, validate:flux2 accepted"
    measured_on: str  # the device that measured the numbers in `why`: "cuda (NVIDIA H200)", "cpu (x86_64)"
    done: str = ""  # what was done: "retired", "re-tuned: block_n=512 ...", "re-recorded", "" (nothing)
    files: list[str] = field(default_factory=list)  # knowledge-relative paths the action changed


def _checks_line(r: EntryCheck) -> str:
    out = []
    for c in r.checks:
        word = {True: "ok", False: "FAIL", None: "--"}[c.ok]
        if c.name.startswith("validate:") and c.details.get("status"):
            word = c.details["status"] + (f" ({c.details['reason']})" if c.details.get("reason") else "")
        out.append(f"{c.name} {word}")
    return ", ".join(out)


def _measured_on(r: EntryCheck) -> str:
    envs = [c.details.get("env") or {} for c in r.checks if c.name.startswith("validate:") and c.details.get("env")]
    name = next((e.get("device_name") for e in envs if e.get("device_name")), "")
    return f"{r.device} ({name})" if name else r.device


def _recorded(entry: Entry, device: str, workload: str, hardware: str = ""):
    bench = entry.bench()
    if device.startswith("cuda"):
        rec = (bench.gpu.validation_on(hardware) if hardware else bench.gpu.validation) if bench.gpu else None
    else:
        rec = bench.correctness.cpu_validation if bench.correctness else None
    return (rec.workloads.get(workload) if rec else None), rec


def env_changes(entry: Entry, device: str, workload: str, verdict: dict) -> list[str]:
    """How this verdict's environment differs from the one bench.json recorded for the same device
    kind and workload ("torch 2.11.0 -> 2.12.0", "engine d93305b4891d -> 1a2b3c4d5e6f"); a
    workload with no recorded verdict on this device kind is one change too."""
    hw = hardware_name(device, (verdict.get("env") or {}).get("device_name", "")) if device.startswith("cuda") else ""
    old, _ = _recorded(entry, device, workload, hw)
    if old is None:
        return [f"no {'GPU' if device.startswith('cuda') else 'CPU'} verdict recorded for {workload}"
                + (f" on {hw}" if hw else "")]
    was, now_ = old.env or {}, verdict.get("env") or {}
    out = [f"{k} {was.get(k)} -> {now_.get(k)}" for k in ENV_KEYS if was.get(k) != now_.get(k)]
    if (old.base_sha or "") != (verdict.get("base_sha") or ""):
        out.append(f"engine {(old.base_sha or '?')[:12]} -> {(verdict.get('base_sha') or '?')[:12]}")
    return out


def decide(entry: Entry, r: EntryCheck) -> Decision:
    """The outcome and action for one entry's check (the table in the module doc)."""
    d = Decision(entry.id, "holds", "none", "", _checks_line(r), _measured_on(r))
    by = {c.name: c for c in r.checks}
    if "engine" in by and by["engine"].ok is None:
        d.outcome, d.why = "not-checked", by["engine"].reason
        return d
    patch = by.get("patch")
    if patch is not None and patch.ok is False:
        if patch.details.get("status") == "conflict":
            # the entry's own file, not where this machine keeps it: the reason is committed
            why = patch.reason.replace(str(entry.patch_path.resolve()), f"kernel_store/{entry.id}/patch.diff")
            why = why.replace(str(entry.patch_path), f"kernel_store/{entry.id}/patch.diff")
            d.outcome, d.action, d.why = "no-longer-applies", "retire", why
        else:
            d.outcome, d.why = "needs-a-person", patch.reason
        return d
    broken = [c for c in r.checks if c.ok is False and not c.name.startswith("validate:")]
    if broken:
        d.outcome, d.why = "needs-a-person", "; ".join(f"{c.name}: {c.reason}" for c in broken)[:600]
        return d
    on_cuda = r.device.startswith("cuda")
    verdicts = [c for c in r.checks if c.name.startswith("validate:")]
    rows = []  # (action, outcome, why) per workload
    for c in verdicts:
        wl, v = c.name.split(":", 1)[1], c.details
        status, reason = v.get("status"), v.get("reason") or ""
        if not status:
            rows.append(("none", "needs-a-person", f"{wl}: {c.reason}"))
        elif status == "rejected" and reason in NO_LONGER_APPLIES:
            rows.append(("retire", "no-longer-applies", f"{wl}: {c.reason}"))
        elif status == "rejected" and reason in NO_LONGER_WINS and on_cuda and any(
                (s.get("device") or "").startswith("cuda") for s in v.get("speed") or []):
            rows.append(("re-tune" if entry.config_space else "retire", "no-longer-wins", f"{wl}: {c.reason}"))
        elif status != "accepted":
            rows.append(("none", "needs-a-person", f"{wl}: {c.reason}"))
        else:
            changes = env_changes(entry, r.device, wl, v)
            rows.append(("re-record", "environment-changed", f"{wl}: {'; '.join(changes)} ({c.reason})") if changes
                        else ("none", "holds", f"{wl}: {c.reason}"))
    whys = [w for _, _, w in rows]
    if rows:
        action, outcome, _ = max(rows, key=lambda x: _RANK[x[0]])
        if action == "none" and any(o == "needs-a-person" for _, o, _ in rows):
            outcome = "needs-a-person"
    else:
        action, outcome = "none", "holds"
        whys.append(f"{patch.reason if patch is not None else 'patch not checked'}; not validated (the check "
                    f"ran without the validator)")
    if rows and not on_cuda and outcome == "holds":
        whys.append("speed not checked: needs a GPU")
    d.action, d.outcome, d.why = action, outcome, "; ".join(whys)
    return d


# ------------------------------------------------------------------------------------------------
# acting on the decisions, in a staging copy of the knowledge


@dataclass
class Staging:
    """Copies of the entries (and the lessons) that the proposal changes, under the run directory.
    `rel` is where kernel_store/ and lessons/ sit in the knowledge repository."""
    root: Path
    store_rel: str
    lessons_rel: str
    lessons_src: Path

    def entry(self, entry: Entry) -> Entry:
        dest = self.root / self.store_rel / entry.id
        if not dest.exists():
            shutil.copytree(entry.path, dest)
        return load_entry(dest)

    @property
    def lessons(self) -> Path:
        dest = self.root / self.lessons_rel
        if not dest.exists():
            if self.lessons_src.is_dir():
                shutil.copytree(self.lessons_src, dest)
            else:
                dest.mkdir(parents=True)
        return dest


def retire(entry: Entry, reason: str, engine_sha: str, command: str) -> None:
    """status: retired, and the `retired:` block saying why (entry.yaml; the rest stays as written)."""
    set_status(entry.path, "retired")
    f = entry.path / "entry.yaml"
    text = f.read_text()
    block = yaml.safe_dump({"retired": {"reason": reason, "engine_sha": engine_sha, "date": now(), "by": command}},
                           sort_keys=False, width=100)
    f.write_text(text.rstrip("\n") + "\n" + block)
    load_entry(entry.path)  # what was written parses


def _set_base(entry: Entry, sha: str) -> None:
    import re

    f = entry.path / "entry.yaml"
    f.write_text(re.sub(r"(?m)^(\s+base_sha:).*$", rf"\g<1> {sha}", f.read_text(), count=1))


def retune(entry: Entry, prep: Prepared, device: str, work_dir: Path, preset: str | None, command: str,
           log=print) -> tuple[bool, str, list]:
    """Variant search over the entry's config space on the tip (bot/generate/variants.search_entry,
    the machinery of `store tune` and optimize), the chosen config's commit validated against the
    tip by the validator; accepted: the entry (a staged copy) adopts the tuned patch, re-based on the
    tip. Returns (adopted, what happened, the verdict checks)."""
    from bot.generate.variants import search_entry
    from bot.knowledge.known import patch_sha256
    from bot.knowledge.store import added_file_content, patch_added_files

    tip = prep.base_sha
    sr = search_entry(entry.path, device=device, run_dir=work_dir / entry.id / "tune", checkout=prep.checkout)
    log(f"  {entry.id}: " + sr.table())
    if sr.candidate is None:
        on = sr.device + (f" ({sr.device_name})" if sr.device_name else "")
        return False, f"variant search over {len(sr.rows)} configs on {on}: {sr.commit_note}", []
    checks = _full_validation(entry, prep.checkout, sr.candidate.commit_sha, device, work_dir, preset, log, tip)
    if not all(c.ok for c in checks):
        return False, (f"tuned config {sr.chosen.get('label')} validated on the tip: "
                       + "; ".join(c.reason for c in checks)), checks
    patch = prep.checkout.repo.git.diff("--full-index", tip, sr.candidate.commit_sha) + "\n"
    (entry.path / "patch.diff").write_text(patch)
    sources = {p.name for p in entry.kernel_files()}
    for path in patch_added_files(patch):
        if Path(path).name in sources:  # the tested kernel source stays the file the patch adds
            (entry.path / Path(path).name).write_text(added_file_content(patch, path) or "")
    _set_base(entry, tip)
    entry = load_entry(entry.path)
    result = {"device": device, "checks": [{"name": "patch", "ok": True, "reason": "tuned on the tip",
                                            "details": {"patch_sha256": patch_sha256(entry)}}]
              + [{"name": c.name, "ok": c.ok, "reason": c.reason, "details": c.details} for c in checks]}
    record_validation(entry, result, command, log=log)
    return True, f"re-tuned: {sr.chosen.get('label')} ({sr.commit_note}); {'; '.join(c.reason for c in checks)}", checks


def act(d: Decision, entry: Entry, r: EntryCheck, prep: Prepared, staging: Staging, command: str,
        work_dir: Path, preset: str | None, log=print) -> None:
    """Carry out d.action on a staged copy of the entry; d.done and d.files say what changed."""
    if d.action == "none":
        return
    staged = staging.entry(entry)
    tip = prep.base_sha
    result = r.to_json()
    if d.action == "re-record":
        record_validation(staged, result, command, lessons_dir=staging.lessons, log=log)
        d.done = "re-recorded: the new verdict in bench.json"
    elif d.action == "retire":
        record_validation(staged, result, command, lessons_dir=staging.lessons, log=log)  # the evidence, if any
        retire(staged, d.why, tip, command)
        d.done = "retired"
    elif d.action == "re-tune":
        record_validation(staged, result, command, lessons_dir=staging.lessons, log=log)  # the rejection
        ok, what, _ = retune(staged, prep, r.device, work_dir, preset, command, log)
        if ok:
            d.done = what
        else:
            retire(load_entry(staged.path), f"{d.why}; {what}", tip, command)
            d.done = f"retired ({what})"


def changed_files(staging: Staging, repo) -> dict[str, bytes]:
    """Files under the staging root whose content differs from the knowledge repository's HEAD."""
    head = repo.head.commit.tree
    out = {}
    for p in sorted(staging.root.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(staging.root).as_posix()
        data = p.read_bytes()
        try:
            if head[rel].data_stream.read() == data:
                continue
        except KeyError:
            pass
        out[rel] = data
    return out


# ------------------------------------------------------------------------------------------------
# the one knowledge pull request


@dataclass
class Proposal:
    """What one nightly check proposes, and where it went."""
    engine: str  # the engine checked (names the branch)
    tip: str  # the engine commit every entry was checked against ("" when each entry's own base)
    where: str  # the engine repository and ref, in words
    device: str
    command: str
    decisions: list[Decision]
    branch: str = ""
    commit: str = ""
    pr: object = None  # bot.deliver.pull_request.PullRequestRef
    files: list[str] = field(default_factory=list)

    def title(self) -> str:
        n = sum(d.action != "none" for d in self.decisions)
        at = f" @ {self.tip[:12]}" if self.tip else ""
        return f"optbot store check: {n} of {len(self.decisions)} entries change against {self.engine}{at}"

    def body(self) -> str:
        from bot.deliver import blocks as b

        cpu = not self.device.startswith("cuda")
        rows = [[f"`{d.entry_id}`", d.checks, d.outcome, d.done or d.action, d.why, d.measured_on]
                for d in self.decisions]
        blocks = [b.H(2, self.title()),
                  b.P(f"Every entry of `kernel_store/` was checked against the engine {self.where}"
                        + (f" at `{self.tip}`" if self.tip else " (each entry at its recorded base)")
                        + f", like a lockfile: `{self.command}`."),
                  b.P(f"Measured on: **{self.device}**."
                        + (" CPU: correctness and engagement only; speed needs a GPU, so no entry is called "
                           "slower from CPU timings." if cpu else "")),
                  b.Table(["entry", "checks", "outcome", "action taken", "why", "measured on"], rows),
                  b.P("Rules (docs/store.md): an entry whose patch no longer applies on the tip, or no longer "
                        "computes the same or runs its kernels there, is retired (`status: retired`, with the "
                        "reason; replay skips it and says why); one that no longer wins on a GPU is re-tuned "
                        "over its config space, or retired without one; a changed environment (GPU, driver, "
                        "torch, triton, engine sha) is re-measured and re-recorded in bench.json. The next "
                        "nightly check updates this pull request; it never opens a second one.")]
        return b.to_markdown(blocks)


def publish(p: Proposal, staging: Staging, knowledge, forge, log=print) -> Proposal:
    """The staged changes as one commit on the proposal's branch (from the knowledge repository's
    HEAD, so a second night replaces the first night's commit), published by the forge."""
    from bot.deliver.knowledge import commit_files_to_branch
    from bot.deliver.pull_request import PullRequestRef

    p.branch = branch_name(p.engine)
    repo = knowledge.repo
    files = changed_files(staging, repo) if staging.root.is_dir() else {}
    p.files = sorted(files)
    if not files:
        p.pr = PullRequestRef("none", note="nothing to propose: no entry's files change")
        return p
    body = p.body()
    (staging.root.parent / "proposal.md").write_text(body)
    p.commit = commit_files_to_branch(repo, p.branch, files, f"{p.title()}\n\n{p.command}\n", now())
    p.pr = forge.publish_knowledge(repo.working_tree_dir, p.branch, p.commit, p.title(), body)
    return p
