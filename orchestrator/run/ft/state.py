"""`groups.json`, what a fault-tolerant parent job writes in its job directory (replicas.py) and
`ps` and `logs --group` read: each replica group's job, hosts and state, and the latest quorum."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from orchestrator.console.display import fold_hosts
from orchestrator.errors import DistrunError, UsageError
from orchestrator.store import Store

GROUPS_FILE = "groups.json"
GROUP_JOB = re.compile(r"(.+)-g\d+")  # a replica group's job id: its parent's, then -g<K>


def read_groups(job_root: Path) -> dict[str, Any] | None:
    """The job's groups.json, or None for a job that has none (not fault-tolerant, or not started)."""
    try:
        state = json.loads((job_root / GROUPS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("groups") else None


def group_job_id(store: Store, job_id: str, index: int) -> str:
    """The job of replica group `index` of job `job_id` (`<job>-g<K>`); given a group's own job
    (as `last` is once a fault-tolerant job ran), of its parent's.

    Raises:
        UsageError: the job has no replica groups, or none with that index.
    """
    state = read_groups(store.job_dir(job_id).root)
    parent = GROUP_JOB.fullmatch(job_id)
    if state is None and parent is not None:
        state = read_groups(store.job_dir(parent[1]).root)
        job_id = parent[1] if state is not None else job_id
    if state is None:
        raise UsageError(f"--group {index}: job {job_id} has no replica groups (only a job with "
                         "fault_tolerance: has them)")
    groups = state["groups"]
    if not 0 <= index < len(groups):
        have = "0" if len(groups) == 1 else f"0-{len(groups) - 1}"
        raise UsageError(f"--group {index}: job {job_id} has replica group(s) {have}")
    return str(groups[index]["job"])


def groups_view(store: Store, job_id: str) -> dict[str, Any] | None:
    """What `ps` shows of a fault-tolerant job: each group (index, job, hosts, state, relaunches),
    from the group's own record where there is one, and the latest quorum; None without groups."""
    state = read_groups(store.job_dir(job_id).root)
    if state is None:
        return None
    return {"groups": [_group_view(store, group) for group in state["groups"]], "quorum": state.get("quorum")}


def _group_view(store: Store, group: dict[str, Any]) -> dict[str, Any]:
    """A group as groups.json has it, its hosts and state brought up to date by its own record
    (a relaunch on a spare changes its hosts; each relaunch is an attempt of its job)."""
    try:
        record = store.get(str(group["job"]))
    except DistrunError:
        record = None
    if record is None:
        return {**group, "relaunches": 0}
    return {"index": group["index"], "job": record.id, "hosts": list(record.hosts or group["hosts"]),
            "state": record.state.value, "relaunches": max(len(record.attempts) - 1, 0)}


def group_lines(view: dict[str, Any]) -> list[str]:
    """`ps`'s lines under a fault-tolerant job: a group a line, then the latest quorum."""
    lines = [f"  group {g['index']}  {g['state']:<9}  relaunches={g['relaunches']}  {fold_hosts(g['hosts'])}  "
             f"({g['job']})" for g in view["groups"]]
    quorum = view["quorum"]
    if quorum:
        lines.append(f"  quorum: {len(quorum['participants'])} group(s) ({', '.join(quorum['participants'])}) "
                     f"at step {quorum['step']}")
    return lines
