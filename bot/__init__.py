"""optbot: the orchestration side (CLI, config, engines, analysis, delivery).

Nothing in bot/ imports torch: GPU work happens in runner/ child processes.
"""
__version__ = "0.1.0"
