"""Sends back a job's host-side copies, for `distrun logs JOB --recover`. argv: JOB_ID NODE.

Prints one JSON object: {"log": the node's log as the supervisor wrote it, "telemetry":
the sampler's copy of its samples}, each "" when the host has none.
"""

from __future__ import annotations

import json
import os
import sys


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def main(argv: list[str]) -> None:
    job_id, node = argv[0], argv[1]
    root = os.path.expanduser(os.path.join("~/.distrun", "jobs", job_id))
    copies = {"log": read(os.path.join(root, f"{node}.log")),
              "telemetry": read(os.path.join(root, f"{node}.telemetry.jsonl"))}
    sys.stdout.write(json.dumps(copies) + "\n")
