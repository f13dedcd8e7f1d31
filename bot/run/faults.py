"""Fault injection for the resume tests: stop a run at a named point as a kill would."""
from __future__ import annotations

import os


class InjectedAbort(BaseException):
    """Raised at an abort point named by $OPTBOT_ABORT_AFTER (tests of resume). A BaseException, so
    that nothing on the way up treats it as a step failure: to the run it looks like a kill."""


def maybe_abort(point: str) -> None:
    """$OPTBOT_ABORT_AFTER=STEP (or deliver:knowledge-pr, deliver:engine-pr) stops the run right
    after that point; with $OPTBOT_ABORT_MODE=kill the process SIGKILLs itself (as the OOM killer or a
    runner reboot would), else InjectedAbort is raised."""
    if os.environ.get("OPTBOT_ABORT_AFTER") != point:
        return
    if os.environ.get("OPTBOT_ABORT_MODE") == "kill":
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedAbort(point)
