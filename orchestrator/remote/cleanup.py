"""Ends one job's processes on a host, found by its id; used by `distrun stop` when the
job's controller is gone. argv: JOB_ID [GRACE_SECONDS]."""

from __future__ import annotations

import json
import os
import sys

from orchestrator.remote.supervisor import end_job, job_processes


def main(argv: list[str]) -> None:
    job_id = argv[0]
    grace = float(argv[1]) if len(argv) > 1 else 5.0
    found = len(job_processes(job_id, os.getpid()))
    killed = end_job(job_id, None, grace)
    sys.stdout.write(json.dumps({"found": found, "killed": killed}) + "\n")
