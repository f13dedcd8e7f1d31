"""Generators: each turns Opportunities into Candidates (one engine commit each, in its own worktree),
plus notes on what it did not make; the generate step (bot/steps/generate.py) calls them in turn.

  candidate.py       the one Candidate; the Optbot-* trailer writer (make_trailers, commit_message)
  commits.py         the git side every generator shares: commits as the bot with hooks off, snapshots
  replay.py          kernel_store entries replayed onto the base
  variants.py        variant search over an entry's Triton config space; its best config as a commit
  compile_region.py  regional torch.compile of the hot repeated blocks
  agent/             the Anthropic agent
"""
