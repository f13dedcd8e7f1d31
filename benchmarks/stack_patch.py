"""One patch file for a stack of kernel-store entries, for `optbot bench --candidate` and
`optbot validate --candidate` on a machine that has only the working tree:

    python benchmarks/stack_patch.py WORKLOAD OUT.patch [--aside] [--engine NAME] ENTRY[:aside] [ENTRY[:aside] ...]

The entries are applied in the order given, each onto the last (bot/generate/replay.apply_entry,
the replay step's own code: `git apply --3way`), in the workload's engine at its base. OUT.patch is
the diff from the base to the stack's tip, after a message whose trailers name every entry and
every declared kernel (the validator reads them: kernel checks, engagement), as one commit would. --engine NAME: the engine
the entries patch (default: the workload's own, diffusers), e.g. sglang.
--aside writes UNDER_COMPILE = "reference" into every kernel file (replay.under_compile's choice,
forced): the same stack with its kernels stepping aside under torch.compile, to bench beside it;
ENTRY:aside does it for that entry's kernels only.
"""
from __future__ import annotations

import sys
from pathlib import Path

from bot.generate.commits import run_git
from bot.generate.candidate import commit_message, make_trailers
from bot.generate.replay import apply_entry
from bot.knowledge.location import locate
from bot.knowledge.store import get_entry
from bot.target import resolve_target


def main(workload: str, out: str, entries: list[str], aside: bool = False, engine: str | None = None) -> None:
    t = resolve_target(workload, engine, None, "full", "cpu")
    store = locate().kernel_store
    onto, adds, removes = t.checkout.base_sha, [], []
    for i, spec in enumerate(entries):
        eid, _, flag = spec.partition(":")
        if flag not in ("", "aside"):
            sys.exit(f"{spec}: expected ENTRY or ENTRY:aside")
        e = get_entry(eid, store)
        this_aside = (aside or flag == "aside") and bool(e.kernel_files())
        r = apply_entry(t.checkout, e, name=f"stack-{workload}-{i}-{eid}{'-aside' if this_aside else ''}", onto=onto,
                        aside=("reference", "forced by stack_patch.py") if this_aside else ("op", ""))
        if r.status != "applied":
            sys.exit(f"{eid}: {r.status}: {r.reason}")
        onto = r.candidate.commit_sha
        adds += e.adds_kernels
        removes += e.removes_kernels
    wt = Path(r.worktree)
    diff = run_git(wt, "diff", "--no-color", t.checkout.base_sha, onto).stdout
    trailers = make_trailers("none", "stack", adds, removes, ", ".join(e.partition(":")[0] for e in entries))
    msg = commit_message(f"optbot stack{' (kernels aside under compile)' if aside else ''}: {', '.join(entries)}",
                         f"{len(entries)} kernel-store entries applied in this order onto {t.checkout.base_sha[:12]}.",
                         trailers)
    Path(out).write_text(msg.rstrip("\n") + "\n\n" + diff)
    print(f"wrote {out}: {len(entries)} entries, tip {onto[:12]}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rest = sys.argv[3:]
    engine = None
    if "--engine" in rest:
        i = rest.index("--engine")
        if i + 1 >= len(rest):
            sys.exit("--engine needs a name, e.g. --engine sglang")
        engine = rest[i + 1]
        rest = rest[:i] + rest[i + 2:]
    main(sys.argv[1], sys.argv[2], [a for a in rest if a != "--aside"], "--aside" in rest, engine)
