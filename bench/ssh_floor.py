"""The controller's CPU for one paramiko connection: the floor under doctor's CPU per host.

Starts its own OpenSSH sshd on loopback (fresh ed25519 host and user keys, in a temporary
directory), then opens CONNECTIONS connections in a row, each stopping after the handshake
(key exchange, host key checked against the recorded one), after public-key authentication,
or after one session running `true` to its exit; with aes128-ctr + hmac-sha2-256 (paramiko's
first choice) and with aes128-gcm (distrun's). Prints this client's CPU (user + sys) per
connection, the median of ROUNDS rounds, as a markdown table.

    .venv/bin/python bench/ssh_floor.py [--connections 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import paramiko

STAGES = ("handshake: key exchange and host-key check", "+ public-key authentication",
          "+ one session running `true` to its exit")
CIPHERS = ("aes128-ctr", "aes128-gcm@openssh.com")


def sshd(state: Path, port: int) -> subprocess.Popen[bytes]:
    """An sshd on 127.0.0.1:port accepting the key state/user (its own host key state/host)."""
    for name in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(state / name)], check=True)
    (state / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1:{port}\nHostKey {state / 'host'}\nPidFile {state / 'pid'}\n"
        f"AuthorizedKeysFile {state / 'user.pub'}\nUsePAM no\nStrictModes no\nMaxStartups 100\n"
        "PasswordAuthentication no\n")
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(state / "sshd_config")],
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sshd did not start")


def connect(port: int, host_key: paramiko.PKey, user_key: paramiko.PKey, cipher: str, stage: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    link = paramiko.Transport(sock)
    link.get_security_options().ciphers = [cipher]
    done = threading.Event()
    link.start_client(event=done)
    done.wait(10)
    try:
        if link.get_remote_server_key().asbytes() != host_key.asbytes():
            raise RuntimeError("host key mismatch")
        if stage >= 1:
            link.auth_publickey(os.environ.get("USER", "root"), user_key)
        if stage >= 2:
            channel = link.open_session()
            channel.exec_command("true")
            channel.recv_exit_status()
    finally:
        link.close()


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="distrun-ssh-floor-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = sshd(state, port)
    try:
        host_key = paramiko.PKey.from_path(str(state / "host"))  # compared by its public half
        user_key = paramiko.PKey.from_path(str(state / "user"))
        ms: dict[tuple[int, str], list[float]] = {}
        for _ in range(args.rounds):
            for stage in range(len(STAGES)):
                for cipher in CIPHERS:
                    connect(port, host_key, user_key, cipher, stage)  # untimed
                    began = cpu()
                    for _ in range(args.connections):
                        connect(port, host_key, user_key, cipher, stage)
                    ms.setdefault((stage, cipher), []).append((cpu() - began) / args.connections * 1000)
    finally:
        server.terminate()
        server.wait()
    print(f"| what the connection does | {' | '.join(CIPHERS)} |\n|---|---|---|")
    for stage, label in enumerate(STAGES):
        cells = " | ".join(f"{statistics.median(ms[stage, c]):.2f} ms" for c in CIPHERS)
        print(f"| {label} | {cells} |")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
