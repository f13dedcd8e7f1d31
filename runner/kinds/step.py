"""Build, run and time one step; save outputs with digests (runner/harness.py does the work)."""
from runner.harness import run_step_job as run  # noqa: F401
