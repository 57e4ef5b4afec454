"""Which terminal a command is typed in, as far as distrun tells them apart: the session of the
process (a terminal's shell and all it starts, a tmux pane, an ssh login, a script's or a CI job's).
A launch records it, and `last` is the newest job launched from the same one."""

from __future__ import annotations

import os
from pathlib import Path

ORIGIN_ENV = "DISTRUN_ORIGIN"  # set for a detached launch's controller (a session of its own): its terminal's


def origin_here() -> str:
    """This process's origin: `<session leader's pid>@<its start, in clock ticks since boot>` (a
    reused pid is another origin), or $DISTRUN_ORIGIN where set."""
    given = os.environ.get(ORIGIN_ENV)
    if given:
        return given
    leader = os.getsid(0)
    try:
        start = Path(f"/proc/{leader}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        start = ""  # the leader is gone (its shell exited), or no /proc: the pid alone
    return f"{leader}@{start}"
