"""Whether this host's torchrun reached the job's rendezvous, as its TCP sockets to the rendezvous
address and port say (/proc/net/tcp and tcp6). Stdlib only; the sampler reads it while torchrun
has no workers yet, so that the controller can name the hosts that never joined
(telemetry/rendezvous.py).

    established   a socket of the job's processes to the endpoint is connected
    connecting    one is still sending SYNs: no answer (a firewall drops them, or no route)
    none          none: its connections were refused or reset, or it has not tried yet
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterable

TCP_STATES = {"01": "established", "02": "connecting"}  # TCP_ESTABLISHED, TCP_SYN_SENT
PROC_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def endpoint(argv: list[str]) -> tuple[str, int] | None:
    """The rendezvous address and port in torchrun's argv: `--rdzv-endpoint ADDR:PORT`, else
    `--master-addr ADDR --master-port PORT`; None when it names neither."""
    options = {argv[i]: argv[i + 1] for i in range(len(argv) - 1)}  # the hosts' python may be 3.8
    given = options.get("--rdzv-endpoint") or options.get("--rdzv_endpoint")
    if given and ":" in given:
        addr, _, port = given.rpartition(":")
    else:
        addr = options.get("--master-addr") or options.get("--master_addr") or ""
        port = options.get("--master-port") or options.get("--master_port") or ""
    addr = addr.strip("[]")
    return (addr, int(port)) if addr and port.isdigit() else None


def proc_address(addr: str, port: int) -> set[str]:
    """`addr:port` as /proc/net/tcp and tcp6 write a remote address (IPv4, and IPv4 mapped in IPv6)."""
    with contextlib.suppress(OSError, UnicodeError):
        addr = socket.getaddrinfo(addr, None, socket.AF_INET)[0][4][0]
    try:
        packed = socket.inet_pton(socket.AF_INET, addr)
        forms = [packed, b"\0" * 10 + b"\xff\xff" + packed]
    except OSError:
        try:
            forms = [socket.inet_pton(socket.AF_INET6, addr)]
        except OSError:
            return set()
    return {f"{_kernel_hex(raw)}:{port:04X}" for raw in forms}


def _kernel_hex(raw: bytes) -> str:
    """An address as the kernel prints it: each 32-bit word in the host's byte order, in hex."""
    words = [raw[i:i + 4] for i in range(0, len(raw), 4)]
    return "".join((w[::-1] if sys.byteorder == "little" else w).hex().upper() for w in words)


def socket_inodes(pids: Iterable[int]) -> set[str]:
    """The inodes of the sockets the processes hold open."""
    inodes = set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"{fd_dir}/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    return inodes


def connection(remote: set[str], pids: Iterable[int]) -> str:
    """How the processes `pids` stand with the endpoint `remote` (`proc_address`'s): established,
    connecting or none."""
    inodes = socket_inodes(pids)
    found = set()
    for table in PROC_TABLES:
        with contextlib.suppress(OSError), open(table, encoding="ascii") as fh:
            next(fh, None)
            for line in fh:
                fields = line.split()
                if len(fields) > 9 and fields[2] in remote and fields[9] in inodes and fields[3] in TCP_STATES:
                    found.add(TCP_STATES[fields[3]])
    return "established" if "established" in found else "connecting" if found else "none"
