"""optbot runner: the GPU side.

Runs in a child process whose import path starts with the engine worktree. It imports only torch,
triton, numpy and the engine, so it runs on a GPU box where nothing else is installed. The bot hands
it a JSON job (runner/job.py) and reads back a JSON result file; stdout is only a log.
"""
