"""Validation (DESIGN decision 6): THE validator and what it is made of (docs/validate.md).

  validator.py    validate(target, candidate) -> Verdict: Options, the order of checks, crash
                  verdicts, the tamper check
  context.py      Context: what one validation's checks share (target, options, seeds, shapes, run dir)
  resolve.py      a candidate REF or patch file -> the Revision to validate, in its own worktree
  correctness.py  outputs compared in a clean process; the kernel checks the candidate names
  engagement.py   declared kernels run / removed ones gone, else the op histogram must differ
  speed.py        interleaved timing processes, the noise band, speed_outcome, implausible numbers
  verdict.py      the one Verdict: accepted | rejected (reason) | held, with every number
  ablate.py       leave-one-out ablation of a stack
"""
from bot.validate.validator import Options, fresh_seeds, shared_seeds, validate, validate_workload  # noqa: F401  the package's API
