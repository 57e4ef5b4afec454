"""The job's checkpoint_dir checked on every host before anything of the job starts.

A checkpoint_dir that another user owns or can write (a component of it, the workdir's included)
is refused in one line, exit 2, naming the host and the component (remote/safedirs.py has the
rule). The supervisor checks it again as it creates the directory, so a directory made unsafe in
between still stops that host before torchrun runs.
"""

from __future__ import annotations

import json

from orchestrator.errors import UsageError
from orchestrator.fanout.group import Group
from orchestrator.plan import LaunchPlan
from orchestrator.transport import Transport, run_remote

MODULES = ["private", "safedirs"]


def check_checkpoint_dir(plan: LaunchPlan, group: Group) -> None:
    """Refuse the job when its checkpoint_dir is unsafe on any of its hosts.

    Raises:
        UsageError: a host found a component another user owns or can write (the first named).
        DistrunError: a host could not be reached or the check failed there.
    """
    if not plan.checkpoint_dir:
        return
    workdirs = {host.node: host.workdir for host in plan.hosts}

    def ask(transport: Transport) -> str | None:
        request = {"path": plan.checkpoint_dir, "cwd": workdirs.get(transport.name)}
        answer = run_remote(transport, "safedirs", MODULES, request)
        return json.loads(answer.strip().splitlines()[-1])["refused"]

    answers = group.run(ask, only=list(workdirs)).check("checkpoint_dir check failed")
    for node, why in answers.items():
        if why:
            raise UsageError(f"{node}: checkpoint_dir {plan.checkpoint_dir}: {why}; "
                             "use a directory only you (or root) can write")
