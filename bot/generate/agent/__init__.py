"""The Anthropic agent generator (docs/generate.md): a Messages API tool-use loop over a candidate's
worktree, several strategies in parallel, budgets, prompt caching and transcripts.

  config.py      model, budgets, strategies, samples, rounds, opportunities (env: OPTBOT_AGENT_*); off without
                 ANTHROPIC_API_KEY
  prices.py      the price table and the cost of a response from its usage
  budget.py      turns / tokens / USD budgets (USD shared by all agents)
  prompts.py     the cached system prompt (rules + knowledge) and the first user message (strategy, sample,
                 brief; for a refinement the other agents' findings)
  tools.py       worktree-confined file tools + validator/profile/lessons/store tools
  validation.py  the agent's calls of THE validator (bot.validate): verdicts reused per tree, ranking
  loop.py        one agent: request -> tools -> results, until done or out of budget; its candidate
  parallel.py    samples of every strategy in parallel; the strongest refined over rounds (one opportunity;
                 bot/steps/generate.py works the opportunities in rank order)
  transcript.py  JSON-lines transcripts in the run directory

Candidate commits go through bot/generate/commits.py and are the one bot/generate/candidate.Candidate.
"""
