"""Workdir sync, host side. argv: WORKDIR MODE.

MODE `manifest`: print {relative path: sha256} of the files under WORKDIR as one JSON line.
MODE `unpack`: read a tar from stdin and extract it into WORKDIR (no absolute paths, no
`..`, no links that leave WORKDIR); print how many files were written.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile


def manifest(root: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            if os.path.islink(path):
                continue
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    digest.update(block)
            found[os.path.relpath(path, root)] = digest.hexdigest()
    return found


def main(argv: list[str]) -> None:
    root = os.path.expanduser(argv[0])
    os.makedirs(root, exist_ok=True)
    if argv[1] == "manifest":
        sys.stdout.write(json.dumps(manifest(root)) + "\n")
        return
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as stream:
        count = 0
        for member in stream:
            check_member(member, root)
            stream.extract(member, root)
            count += member.isfile()
    sys.stdout.write(json.dumps({"written": count}) + "\n")


def check_member(member: tarfile.TarInfo, root: str) -> None:
    """Raise ValueError for anything but a file or directory inside `root`."""
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, member.name))
    if not (member.isfile() or member.isdir()) or os.path.commonpath([real_root, target]) != real_root:
        raise ValueError(f"refusing to write {member.name!r} outside {root}")
