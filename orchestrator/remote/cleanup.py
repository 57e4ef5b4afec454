"""Ends one job's processes on a host, found by descent from the roots its supervisor recorded
(remote/provenance.py), and removes the socket directory the supervisor made under the temporary
directory, if it recorded one (remote/sockdir.py); used by `distrun stop` when the job's controller
is gone, and by the controller when a host's supervisor died. argv: JOB_ID NODE [GRACE_SECONDS]."""

from __future__ import annotations

import json
import os
import sys

from orchestrator.remote.provenance import record_path, recorded
from orchestrator.remote.sockdir import remove_recorded
from orchestrator.remote.supervisor import end_job_freeing_gpus, job_processes

HOST_JOBS = "~/.distrun/jobs"


def main(argv: list[str]) -> None:
    job_id, node = argv[0], argv[1]
    grace = float(argv[2]) if len(argv) > 2 else 5.0
    job_dir = os.path.expanduser(os.path.join(HOST_JOBS, job_id))
    roots = recorded(record_path(job_dir, node))
    found = len(job_processes(job_id, os.getpid(), node, roots))
    killed, freed = end_job_freeing_gpus(job_id, node, None, grace, roots)
    remove_recorded(job_dir, job_id, node)
    sys.stdout.write(json.dumps({"found": found, "killed": killed, "gpus_freed": freed}) + "\n")
