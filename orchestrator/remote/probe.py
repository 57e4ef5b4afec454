"""Facts about a host, as JSON on stdout. Runs on the host with its own python, stdlib only.

Reads one JSON line of options on stdin:
    route_to: an address; report the interface whose route reaches it
    port_from: report the first free TCP port from this one (on the master only)
    port_exact: report whether exactly this port is free
Fast: nothing is imported that takes long (torch's version comes from its metadata).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from typing import Any

PORT_SPAN = 200


def interfaces() -> dict[str, list[str]]:
    """Interface name -> IPv4 addresses with prefix length, from `ip -o -4 addr`."""
    try:
        text = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet":
            found.setdefault(parts[1], []).append(parts[3])
    return found


def route_iface(addr: str) -> str | None:
    """The interface the kernel would use to reach `addr`."""
    try:
        text = subprocess.run(
            ["ip", "-o", "route", "get", addr], capture_output=True, text=True, timeout=5, check=False
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return text[text.index("dev") + 1] if "dev" in text else None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104 - torchrun's store listens on every address
        except OSError:
            return False
    return True


def first_free_port(start: int) -> int | None:
    return next((p for p in range(start, min(start + PORT_SPAN, 65536)) if port_free(p)), None)


def gpu_count() -> int:
    """GPUs the NVIDIA driver exposes, without loading any library."""
    try:
        return len([d for d in os.listdir("/proc/driver/nvidia/gpus") if d])
    except OSError:
        return 0


def package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def facts(options: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "python_path": sys.executable,
        "torch": package_version("torch"),
        "gpus": gpu_count(),
        "interfaces": interfaces(),
        "home": os.path.expanduser("~"),
    }
    if options.get("route_to"):
        result["route_iface"] = route_iface(options["route_to"])
    if options.get("port_from"):
        result["free_port"] = first_free_port(int(options["port_from"]))
    if options.get("port_exact"):
        result["port_exact_free"] = port_free(int(options["port_exact"]))
    return result


def main(argv: list[str]) -> None:
    options = json.loads(sys.stdin.buffer.readline() or b"{}")
    sys.stdout.write(json.dumps(facts(options)) + "\n")
    sys.stdout.flush()
