"""Report the environment (device, driver, versions) without building a model."""
from runner import env


def run(job) -> dict:
    return {"ok": True, "env": env.capture(job.device, job.engine_sha)}
