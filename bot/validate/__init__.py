"""Validation (DESIGN decision 6): THE validator and what it is made of.

  validator.py  validate(target, candidate) -> Verdict: the order of checks, each in a runner process
  verdict.py    the one Verdict: accepted | rejected (reason) | held, with every number
  resolve.py    a candidate REF or patch file -> the commit to validate, in its own worktree
  ablate.py     leave-one-out ablation of a stack
"""
from bot.validate.validator import Options, fresh_seeds, validate  # noqa: F401  the package's API
