"""The one grammar of `/optimize` comments, read from the comment's first line only:

    /optimize <workload> [--preset tiny|full] [--gpus N] [--shards N] [--budget 30m|2h|1h30m] [--engine NAME]
              [--quant fp8]

`--gpus N` is one host's local pool; `--shards N` (2 and more) fans the validation out over N GPU
runners of the workflow's matrix (docs/optimize.md, Fan-out).

A first line that does not start with the ASCII characters `/optimize` is no command (ignored);
one that does but is not exactly this grammar gets the help text. The comment stays data: the
line is split on ASCII spaces and tabs only, every word must match a narrow ASCII pattern, and
names must be in optbot's own lists (its workloads, their engines), so look-alike characters,
shell syntax, control characters and huge bodies are refused before anything reads them as
more. A problem is said in optbot's own words: the comment's text is never echoed back.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from bot.workload import PRESETS, available_workloads, load_workload
from runner.job import QUANT_RECIPES

COMMAND = "/optimize"
MAX_LINE = 200  # characters of the first line; the grammar's longest line is far shorter
MAX_GPUS = 8  # one host's GPUs
MAX_SHARDS = 8  # runners of one fan-out (.github/workflows/optimize.yml's matrix); 1 = one host
MAX_BUDGET_S = 5 * 3600  # under the workflow's job time limit (bot/trigger/dispatch.RUN_WINDOW_S)
OPTIONS = ("--preset", "--gpus", "--shards", "--budget", "--engine", "--quant")
# [0-9], not \d: \d and int() also take other scripts' digits ("٣")
WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
GPUS = re.compile(r"[1-9][0-9]?")
BUDGET = re.compile(r"(?:([0-9]{1,2})h)?(?:([0-9]{1,3})m)?")
SEPARATOR = re.compile(r"[ \t]+")  # not str.split(): that also splits on Unicode spaces


@dataclass(frozen=True)
class OptimizeCommand:
    """What a valid `/optimize` line asks for; None means optimize's own default."""
    workload: str
    preset: str | None = None
    gpus: int = 1
    budget_s: float | None = None
    engine: str | None = None  # a name the workload defines, never a path or URL
    shards: int = 1  # GPU runners the validation fans out over; 1: the whole run on one host
    quant: str | None = None  # a quantization recipe (optbot's own list): FP8 linear layers, docs/fp8.md

    def run_key(self) -> tuple[str, str, str]:
        """What one run owns: its branches are named by workload (+ recipe) and the engine's base, so
        two commands with the same key would write the same branch; other keys run side by side.
        The engine is resolved to the workload's default, so naming it changes nothing. Only for a
        command that passed check()."""
        return (self.workload, self.engine or load_workload(self.workload).default_engine, self.quant or "")


@dataclass(frozen=True)
class Parsed:
    command: OptimizeCommand | None  # None: not understood
    problem: str = ""  # why not, in optbot's words


def first_line(body: str) -> str:
    return body.split("\n", 1)[0].rstrip("\r").strip(" \t")


def is_command(body: str) -> bool:
    """Does the comment address optbot at all? (Only these get a reply.)"""
    return first_line(body).startswith(COMMAND)


def parse(body: str) -> Parsed:
    line = first_line(body)
    if not line.startswith(COMMAND):
        return Parsed(None, "the first line does not start with /optimize")
    if len(line) > MAX_LINE:
        return Parsed(None, f"the first line is longer than {MAX_LINE} characters")
    words = SEPARATOR.split(line)
    if words[0] != COMMAND:
        return Parsed(None, "/optimize must be followed by a space and the workload")
    if not all(w in OPTIONS or WORD.fullmatch(w) for w in words[1:]):
        return Parsed(None, "the line holds characters other than ASCII letters, digits, '.', '_', '-' and spaces")
    known = available_workloads()
    if len(words) < 2 or words[1] in OPTIONS:
        return Parsed(None, f"the workload comes right after /optimize: one of {', '.join(known)}")
    if words[1] not in known:
        return Parsed(None, f"unknown workload; known: {', '.join(known)}")
    given: dict[str, str] = {}
    rest = words[2:]
    for i in range(0, len(rest), 2):
        opt = rest[i]
        if opt not in OPTIONS:
            return Parsed(None, f"after the workload only options may follow: {', '.join(OPTIONS)}")
        if opt in given:
            return Parsed(None, f"{opt} is given twice")
        if i + 1 >= len(rest) or rest[i + 1] in OPTIONS:
            return Parsed(None, f"{opt} needs a value")
        given[opt] = rest[i + 1]
    gpus = given.get("--gpus", "1")
    if not GPUS.fullmatch(gpus):
        return Parsed(None, f"--gpus takes a whole number from 1 to {MAX_GPUS}")
    shards = given.get("--shards", "1")
    if not GPUS.fullmatch(shards):
        return Parsed(None, f"--shards takes a whole number from 1 to {MAX_SHARDS}")
    budget_s = None
    if "--budget" in given:
        budget_s = parse_budget(given["--budget"])
        if budget_s is None:
            return Parsed(None, "--budget takes a wall time like 30m, 2h or 1h30m")
    cmd = OptimizeCommand(words[1], given.get("--preset"), int(gpus), budget_s, given.get("--engine"), int(shards),
                          given.get("--quant"))
    problem = check(cmd)
    return Parsed(None if problem else cmd, problem)


def parse_budget(text: str) -> float | None:
    m = BUDGET.fullmatch(text)
    if not m or not any(m.groups()):
        return None
    return float(int(m.group(1) or 0) * 3600 + int(m.group(2) or 0) * 60)


def check(cmd: OptimizeCommand) -> str:
    """"" when `cmd` is within the grammar's limits and names only what optbot knows, else why not.
    Parsing ends here, and a request file read back is checked here again."""
    known = available_workloads()
    if not isinstance(cmd.workload, str) or cmd.workload not in known:
        return f"unknown workload; known: {', '.join(known)}"
    wl = load_workload(cmd.workload)
    # the type checks are for a request file read back: the parser makes only these types
    if cmd.preset is not None and not (isinstance(cmd.preset, str) and cmd.preset in PRESETS
                                       and cmd.preset in wl.presets):
        return f"--preset takes one of {', '.join(sorted(wl.presets))}"
    if not (type(cmd.gpus) is int and 1 <= cmd.gpus <= MAX_GPUS):
        return f"--gpus takes a whole number from 1 to {MAX_GPUS}"
    if not (type(cmd.shards) is int and 1 <= cmd.shards <= MAX_SHARDS):
        return f"--shards takes a whole number from 1 to {MAX_SHARDS}"
    if cmd.budget_s is not None and not (type(cmd.budget_s) in (int, float) and 0 < cmd.budget_s <= MAX_BUDGET_S):
        return f"--budget is more than 0 and at most {MAX_BUDGET_S // 3600}h"
    if cmd.engine is not None and not (isinstance(cmd.engine, str) and cmd.engine in wl.engines):
        return f"--engine for {cmd.workload} takes one of {', '.join(sorted(wl.engines))}"
    if cmd.quant is not None and not (isinstance(cmd.quant, str) and cmd.quant in QUANT_RECIPES):
        return f"--quant takes one of {', '.join(QUANT_RECIPES)}"
    return ""


def help_text(problem: str) -> str:
    """The reply to an `/optimize` comment optbot did not understand (markdown)."""
    lines = [f"**optbot** did not start a run: {problem}.", "",
             "On the first line of a comment on a pull request:", "",
             "```", f"{COMMAND} <workload> [--preset tiny|full] [--gpus N] [--shards N] [--budget 30m|2h|1h30m] "
                    "[--engine NAME] [--quant fp8]",
             "```", ""]
    for name in available_workloads():
        wl = load_workload(name)
        lines.append(f"- `{name}`: engines {', '.join(f'`{e}`' for e in sorted(wl.engines))} "
                     f"(default `{wl.default_engine}`)")
    lines += [f"- `--preset`: `tiny` or `full` (default: `full` on a GPU runner); `--gpus`: 1 to {MAX_GPUS} "
              f"GPUs of one runner (default 1); `--shards`: 1 to {MAX_SHARDS} GPU runners the validation is "
              f"spread over (default 1); `--budget`: wall time, at most {MAX_BUDGET_S // 3600}h; `--quant fp8`: "
              "the linear layers in FP8, judged against the FP8 baseline", "",
              "The run measures the pull request's head commit as it was when the comment was made. "
              "People with write, maintain or admin permission on the repository can start runs."]
    return "\n".join(lines)
