"""The Anthropic agent generator (docs/generate.md): a Messages API tool-use loop over a candidate's
worktree, several strategies in parallel, budgets, prompt caching and transcripts.

  config.py      model, budgets, strategies (env: OPTBOT_AGENT_*); off without ANTHROPIC_API_KEY
  prices.py      the price table and the cost of a response from its usage
  budget.py      turns / tokens / USD budgets (USD shared by all agents)
  tools.py       worktree-confined file tools + validator/profile/lessons/store tools
  validation.py  the one adapter into the validator (fallback: runner step job, labelled)
  loop.py        one agent: request -> tools -> results, until done or out of budget
  parallel.py    strategies in parallel; the strongest is refined
  candidates.py  snapshot and candidate commits with Optbot-* trailers
  transcript.py  JSON-lines transcripts in the run directory
"""
