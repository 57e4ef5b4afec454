"""Sends back a job's host-side copies, for `distrun logs JOB --recover`. argv: JOB_ID NODE.

Prints one JSON object: {"files": {path: text}, "telemetry": text}: every file of the node's copy
of the job's lines (`~/.distrun/jobs/<id>/<node>/`, the layout of remote/linestore.py) by its
path in the copy, and the sampler's copy of its samples; bytes that are not UTF-8 travel as
surrogate escapes. A host without a copy sends {} and "".
"""

from __future__ import annotations

import json
import os
import sys


def read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "surrogateescape")
    except OSError:
        return ""


def copy_files(root: str) -> dict[str, str]:
    """Every file under `root` by its path relative to it."""
    files = {}
    for folder, subdirs, names in os.walk(root):
        # torchrun's own files (unmasked), left only by a supervisor that died: not the copy.
        subdirs[:] = [d for d in subdirs if d != "torchrun"]
        for name in names:
            path = os.path.join(folder, name)
            files[os.path.relpath(path, root)] = read(path)
    return files


def main(argv: list[str]) -> None:
    job_id, node = argv[0], argv[1]
    root = os.path.expanduser(os.path.join("~/.distrun", "jobs", job_id))
    copies = {"files": copy_files(os.path.join(root, node)),
              "telemetry": read(os.path.join(root, f"{node}.telemetry.jsonl"))}
    sys.stdout.write(json.dumps(copies) + "\n")
