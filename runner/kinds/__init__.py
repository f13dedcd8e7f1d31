"""Job kinds: one module per kind, each with ``run(job) -> dict`` (the result, with "ok": True).

``python -m runner`` imports ``runner.kinds.<job.kind>`` and calls ``run``; adding a kind is adding
a module here. Failures are raised; runner/__main__.py turns them into {"ok": false, ...}.
"""
