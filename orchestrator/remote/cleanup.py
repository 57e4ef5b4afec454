"""Ends one job's processes on a host, found by job id and node name; used by `distrun stop`
when the job's controller is gone. argv: JOB_ID NODE [GRACE_SECONDS]."""

from __future__ import annotations

import json
import os
import sys

from orchestrator.remote.supervisor import end_job_freeing_gpus, job_processes


def main(argv: list[str]) -> None:
    job_id, node = argv[0], argv[1]
    grace = float(argv[2]) if len(argv) > 2 else 5.0
    found = len(job_processes(job_id, os.getpid(), node))
    killed, freed = end_job_freeing_gpus(job_id, node, None, grace)
    sys.stdout.write(json.dumps({"found": found, "killed": killed, "gpus_freed": freed}) + "\n")
