"""The nine steps of `optbot optimize`, one module each: its Result dataclass and ``run(ctx) -> Result``.

  checkout  baseline  profile  analyze  generate  validate  combine  learn  deliver

A step reads the typed results of the steps before it from ``ctx.results`` (bot/run/state.py) and
returns its own; the orchestrator (bot/run/orchestrator.py) records it before the next step starts.
jobs.py holds the runner jobs that profile and analyze share with their commands.
"""
