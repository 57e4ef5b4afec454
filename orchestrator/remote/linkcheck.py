"""One host's side of `distrun doctor --links`: it sends to one peer and receives from another, round
after round, and says what it received.

Run with `python -I -S` (remote.lean_argv), the program on stdin, then one JSON line per round:
{"to": ADDRESS, "port": PORT} (a round where this host sends to nobody has no "to"). It listens on a
port of its own first and prints {"port": N}; each round it prints {"round": K, "recv": BYTES,
"recv_s": SECONDS, "from": ADDRESS, "error": WHY or null}. The sender's rate is measured where it
arrives: bytes a sender hands its kernel include what waits in its buffer, bytes received do not.
Every wait is bounded; the end of stdin (the controller done or gone) ends the program, which
leaves nothing behind (no file, no qdisc, no process). Imports only what Python has built in.
"""

import json
import socket
import sys
import threading
import time

CHUNK = 1 << 16
CONNECT_S = 5.0
SLACK_S = 10.0  # a receiver waits this much longer than a round's sending, for a slow link's backlog


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def receive(listener, seconds, got):
    """Accept this round's sender and count what it sends until it closes, within the round's bound."""
    deadline = time.monotonic() + seconds + SLACK_S
    try:
        listener.settimeout(seconds + CONNECT_S)
        conn, peer = listener.accept()
    except OSError as exc:
        got["error"] = f"no sender connected: {exc}"
        return
    got["from"] = peer[0]
    with conn:
        total, first, last = 0, None, None
        while time.monotonic() < deadline:
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                data = conn.recv(CHUNK)
            except OSError as exc:
                got["error"] = f"receiving: {exc}"
                break
            if not data:
                break
            last = time.monotonic()
            first = first or last
            total += len(data)
        got["recv"], got["recv_s"] = total, (last - first) if first and last and last > first else 0.0


def send(address, port, seconds):
    """Send zeros to the peer for `seconds`; why it could not, or None."""
    block = bytes(CHUNK)
    try:
        with socket.create_connection((address, port), timeout=CONNECT_S) as conn:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                conn.settimeout(max(0.1, end - time.monotonic()))
                try:
                    conn.send(block)
                except OSError:  # its time is up (socket.timeout), or the peer went away
                    break
    except OSError as exc:
        return f"sending to {address}:{port}: {exc}"
    return None


def one_round(listener, order, seconds):
    got = {"recv": 0, "recv_s": 0.0, "from": None, "error": None}
    receiver = threading.Thread(target=receive, args=(listener, seconds, got), daemon=True)
    receiver.start()
    sent = send(order["to"], int(order["port"]), seconds) if order.get("to") else None
    receiver.join(seconds + SLACK_S + CONNECT_S + 1)
    got["send_error"] = sent
    return got


def main(argv):
    seconds = float(argv[0])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("", 0))
    listener.listen(4)
    say({"port": listener.getsockname()[1]})
    for number, line in enumerate(sys.stdin):
        if not line.strip():
            break
        say(dict(one_round(listener, json.loads(line), seconds), round=number))
    listener.close()
