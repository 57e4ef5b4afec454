"""Whether a job's controller still runs, and a signal only to the process that is it.

A job record names its controller by pid and start time (`process_start`): with both, a pid that
the system reused for another process is never taken for the controller, nor signalled.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from orchestrator.store import JobRecord


def process_start(pid: int) -> str | None:
    """When process `pid` started, as `<boot id>:<clock ticks since boot>`; None when it is gone.

    With the pid, it names one process: a pid reused later has another start, and the
    boot id tells ticks of one boot from another's.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return f"{boot}:{fields[19]}" if len(fields) > 19 else None


def controller_alive(rec: JobRecord) -> bool:
    """Whether the job's controller still runs: the recorded pid is alive and started when the
    recorded controller did. A record without a start (an older distrun's) names no process
    that can be told apart from a reused pid, so its controller counts as gone."""
    if not rec.controller_pid or not rec.controller_start:
        return False
    return process_start(rec.controller_pid) == rec.controller_start


def signal_controller(rec: JobRecord, signum: int = signal.SIGTERM) -> bool:
    """Send `signum` to the job's controller if, and only if, it is the recorded process.

    The pid is pinned with a pidfd before its start time is compared, so a pid that is reused
    between the check and the signal cannot receive it (where pidfds exist: Linux 5.3+).

    Returns:
        Whether the controller was signalled.
    """
    if not controller_alive(rec) or rec.controller_pid is None:
        return False
    pidfd_open = getattr(os, "pidfd_open", None)
    send = getattr(signal, "pidfd_send_signal", None)
    try:
        if pidfd_open is None or send is None:
            os.kill(rec.controller_pid, signum)
            return True
        fd = pidfd_open(rec.controller_pid)
    except OSError:
        return False
    try:
        if process_start(rec.controller_pid) != rec.controller_start:
            return False
        send(fd, signum)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
