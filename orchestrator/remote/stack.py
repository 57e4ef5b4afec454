"""Dumps the Python stack of every rank of a job on this host with py-spy; used by `distrun stack`
and by the launcher's hang watchdog. argv: JOB_ID NODE [--native] [--flight].

Ranks are the job's processes (DISTRUN_JOB_ID and DISTRUN_NODE in their environment, as the
supervisor starts them, and provably the job's: this user's, descending from the supervisor or
torchrun recorded in the host's job directory, remote/provenance.py) that torchrun gave a RANK.
py-spy is looked for beside the host's python first (the venv that runs the job, where `pip
install py-spy` puts it), then on PATH. Every rank is dumped at once, so a host's dump takes as
long as its slowest rank's, not their sum.

With --flight, each rank's Flight Recorder dump is fetched first from its socket in
DISTRUN_WORKER_SOCKETS (remote/flightrec.py), where the rank serves it, and believed only when the
process serving the socket is that rank (or another of the job's processes); py-spy stops a rank while
it dumps it, and a stopped rank cannot answer.

A rank stopped from outside (state T in /proc/PID/stat: SIGSTOP, SIGTSTP; t: held by a tracer)
cannot be read by py-spy (it fails with "unexpected waitpid result") nor answer for its Flight
Recorder: its stack is what the kernel says of it instead (`stopped`: its state and its kernel
wait channel, /proc/PID/wchan), and neither py-spy nor the fetch is tried.

Prints one JSON line: {"pyspy": path or null, "ranks": [{"rank", "local_rank", "pid",
"threads" (py-spy's --json output) or "error", with --flight "flight" (fr_trace_json's JSON) or
"flight_error", "flight_seconds"}]}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from orchestrator.remote.flightrec import fetch
from orchestrator.remote.provenance import Root, proven, record_path, recorded
from orchestrator.remote.pyspy import find_pyspy
from orchestrator.remote.sockdir import socket_path
from orchestrator.remote.supervisor import job_processes

HOST_JOBS = "~/.distrun/jobs"

DUMP_TIMEOUT = 20.0
STOPPED_STATES = {"T": "stopped by a signal (SIGSTOP, SIGTSTP)", "t": "stopped by a tracer (a debugger)"}
RECHECK_S = 0.2  # a rank seen stopped is looked at again after this: py-spy itself holds a rank a moment


RANK_VARS = (b"RANK", b"LOCAL_RANK", b"DISTRUN_WORKER_SOCKETS")


def rank_env(pid: int) -> dict[str, str]:
    """RANK, LOCAL_RANK and DISTRUN_WORKER_SOCKETS of a process ({} when it has no RANK: torchrun
    itself, or gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            pairs = [item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item]
    except OSError:
        return {}
    env = {k.decode(): v.decode(errors="replace") for k, v in pairs if k in RANK_VARS}
    return env if "RANK" in env else {}


def dump(pyspy: str, pid: int, native: bool) -> dict[str, object]:
    """py-spy's JSON dump of one process, or {"error": its last line}."""
    argv = [pyspy, "dump", "--pid", str(pid), "--json", *(["--native"] if native else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DUMP_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"py-spy did not finish within {DUMP_TIMEOUT:g} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        return {"error": f"py-spy failed (exit code {done.returncode}): {last}"}
    try:
        return {"threads": json.loads(done.stdout)}
    except ValueError:
        return {"error": "py-spy printed no JSON"}


def proc_state(pid: int) -> tuple[str, str]:
    """A process's state letter (/proc/PID/stat's third field) and kernel wait channel (/proc/PID/wchan;
    "" where the kernel does not say); ("", "") when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "", ""
    try:
        with open(f"/proc/{pid}/wchan", encoding="ascii", errors="replace") as fh:
            wchan = fh.read().strip()
    except OSError:
        wchan = ""
    return state, "" if wchan == "0" else wchan


def stopped(pid: int) -> str | None:
    """What a stopped rank's stack is instead of py-spy's (which cannot read it): its state and its
    kernel wait channel; None when it runs (or sleeps), or was stopped only for a moment."""
    if proc_state(pid)[0] not in STOPPED_STATES:
        return None
    time.sleep(RECHECK_S)
    state, wchan = proc_state(pid)
    if state not in STOPPED_STATES:
        return None
    return (f"stopped: state {state} in /proc/{pid}/stat ({STOPPED_STATES[state]}), kernel wait channel "
            f"{wchan or 'not shown'}; py-spy cannot read a stopped process")


def flight(env: dict[str, str], pid: int, roots: list[Root]) -> dict[str, object]:
    """The rank's Flight Recorder dump (or why there is none) and how long fetching it took; only a
    socket served by the rank `pid` itself (or another of the job's processes) is believed."""
    if "DISTRUN_WORKER_SOCKETS" not in env:
        return {"flight_error": "no DISTRUN_WORKER_SOCKETS in its environment"}
    started = time.monotonic()
    got = fetch(socket_path(env["DISTRUN_WORKER_SOCKETS"], env["RANK"]),
                peer=lambda served_by: served_by == pid or proven(served_by, roots))
    return {**got, "flight_seconds": round(time.monotonic() - started, 3)}


def dump_ranks(job_id: str, node: str, native: bool, with_flight: bool = False) -> dict[str, object]:
    """Every rank of the job on this host, dumped at once (one thread per rank)."""
    pyspy = find_pyspy()
    ranks = []
    envs: dict[int, dict[str, str]] = {}
    roots = recorded(record_path(os.path.expanduser(os.path.join(HOST_JOBS, job_id)), node))
    for pid in job_processes(job_id, os.getpid(), node, roots):
        env = rank_env(pid)
        if env:
            envs[pid] = env
            ranks.append({"rank": int(env["RANK"]), "local_rank": int(env.get("LOCAL_RANK", "0")), "pid": pid})

    def one(entry: dict[str, object]) -> None:
        pid = int(str(entry["pid"]))
        why = stopped(pid)
        if why is not None:
            entry["error"] = why
            if with_flight:
                entry.update(flight_error=f"it cannot answer: {why.split(';')[0]}", flight_seconds=0.0)
            return
        if with_flight:
            entry.update(flight(envs[pid], pid, roots))
        if pyspy is not None:
            entry.update(dump(pyspy, pid, native))

    threads = [threading.Thread(target=one, args=(entry,)) for entry in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"pyspy": pyspy, "ranks": sorted(ranks, key=lambda r: int(str(r["rank"])))}


def main(argv: list[str]) -> None:
    job_id, node = argv[0], argv[1]
    sys.stdout.write(json.dumps(dump_ranks(job_id, node, "--native" in argv[2:], "--flight" in argv[2:])) + "\n")
