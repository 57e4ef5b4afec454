"""Removes the copies a host keeps of finished jobs, for `distrun prune`. argv: JOB_ID ...

Only a directory directly under ~/.distrun/jobs whose name is a job id is removed, never a
link, with the socket directory under the temporary directory its supervisor recorded there and
did not remove (a SIGKILLed supervisor's, remote/sockdir.py); prints one JSON object:
{"removed": [ids whose copy was there]}.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys

from orchestrator.remote.sockdir import remove_recorded

JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _remove_tree(path: str) -> None:
    """rmtree that tolerates entries vanishing under it: hosts that share a home (NFS, or
    the test cluster's namespaces) prune the same copy at once."""
    while os.path.isdir(path) and not os.path.islink(path):
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            continue


def main(argv: list[str]) -> None:
    root = os.path.expanduser(os.path.join("~/.distrun", "jobs"))
    removed = []
    for job_id in argv:
        if not JOB_ID.fullmatch(job_id) or ".." in job_id:
            continue
        path = os.path.join(root, job_id)
        if os.path.isdir(path) and not os.path.islink(path):
            for record in glob.glob(os.path.join(glob.escape(path), "*.sockdir")):
                remove_recorded(path, job_id, os.path.basename(record)[:-len(".sockdir")])
            _remove_tree(path)
            removed.append(job_id)
    sys.stdout.write(json.dumps({"removed": removed}) + "\n")
