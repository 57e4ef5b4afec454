"""A rank's children end with the job whatever their environment (issue 46.3): a child started with an
environment of its own (no distrun markers), in a session of its own or not, or detached as a
daemon, is the job's by descent from the supervisor, and is ended at the job's end and on a stop,
and after a SIGKILLed supervisor by the cleanup that follows (the supervisor records its adoptions);
a process beside the job (this user's with the job's markers, another user's) is never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_ONLY
from orchestrator.remote import cleanup
from tests.test_security_round2 import as_impostor
from tests.test_supervisor_lifecycle import config, decode

# Three children of each rank, none with distrun's markers, each running python with the job's tag.
PARENT = """\
import os, subprocess, sys
env = {"PATH": os.environ["PATH"]}
child = [sys.executable, "-c", "import time; time.sleep(611)", sys.argv[1]]
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # as a rank's under torchrun hold no pipe
subprocess.Popen(child, env=env, **quiet)
subprocess.Popen(child, env=env, start_new_session=True, **quiet)
subprocess.run(["setsid", "-f", *child], env=env, check=True, **quiet)  # a daemon: reparented at once
print("children started", flush=True)
if sys.argv[2] == "wait":
    import time
    time.sleep(600)
"""


def tagged(tag: str) -> set[int]:
    """Pids of the running (not zombie) processes with `tag` as an argument."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if tag.encode() in argv and state not in (b"Z", b"X"):
            found.add(int(entry))
    return found


def wait_until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def beside(tmp_path: Path) -> Iterator[tuple[str, set[int]]]:
    """A tag, and two processes carrying it beside the job: this user's with the job's markers, and
    another user's; both must outlive the job."""
    tag = f"children-{os.getpid()}-{time.monotonic_ns()}"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", tag]
    markers = {**os.environ, "DISTRUN_JOB_ID": tag, "DISTRUN_NODE": "n0"}
    procs = [subprocess.Popen(sleeper, env=markers), subprocess.Popen(as_impostor(sleeper), env=markers)]
    try:
        assert wait_until(lambda: len(tagged(tag)) == 2, 10)
        yield tag, {p.pid for p in procs}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for pid in tagged(tag):  # what a failing run left
            os.kill(pid, 9)


def supervise(cfg: dict[str, object], stop_when_started: bool) -> tuple[list[str], list[dict[str, object]]]:
    """Run the shipped supervisor; with `stop_when_started`, send the controller's stop once the
    ranks have started their children."""
    payload = remote.bundle("supervisor", SUPERVISOR_ONLY)
    argv = remote.bootstrap_argv(sys.executable, payload, "distrun-supervisor", str(cfg["job_id"]), "n0")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload + json.dumps(cfg).encode() + b"\n")
    proc.stdin.flush()
    out = b""
    if stop_when_started:
        while out.count(b"children started") < 2:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, out[-2000:]
            out += chunk
        proc.stdin.write(b'{"op": "stop"}\n')
        proc.stdin.flush()
    out += proc.communicate(timeout=60)[0]
    return decode(out)


@pytest.mark.parametrize("end", ["the job succeeds", "the controller stops the job"])
def test_a_ranks_children_with_their_own_environment_end_with_the_job_and_nothing_beside_it_does(
        tmp_path: Path, beside: tuple[str, set[int]], end: str) -> None:
    tag, bystanders = beside
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    stopped = end == "the controller stops the job"
    rank = [sys.executable, str(script), tag, "wait" if stopped else "end"]
    cfg = config(tmp_path, ["sh", "-c", f'{" ".join(rank)} & {" ".join(rank)} & wait'],
                 heartbeat_timeout=30 if stopped else None)
    ended_at = time.monotonic()
    lines, events = supervise(cfg, stopped)
    took = time.monotonic() - ended_at
    assert lines.count("children started") == 2, lines
    assert events[-1]["ev"] == "exit" and (events[-1]["stop_cause"] == "controller") == stopped
    left = tagged(tag) - bystanders
    assert left == set(), f"6 children expected gone when the supervisor returned ({took:.1f} s), left: {left}"
    assert tagged(tag) == bystanders  # this user's process with the job's markers, another user's: untouched


def test_a_daemon_the_supervisor_adopted_goes_with_the_stop_that_follows_its_sigkill(
        tmp_path: Path, beside: tuple[str, set[int]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILLed, the supervisor's adoptions go to init; it recorded them (each heartbeat), so the
    cleanup the controller runs next (`distrun stop`'s) still ends them."""
    tag, bystanders = beside
    monkeypatch.setenv("HOME", str(tmp_path))
    daemon = [sys.executable, "-c", "import time; time.sleep(611)", tag]
    rank = ("import subprocess, sys, time\n"
            f"subprocess.run(['setsid', '-f', *{daemon!r}], env={{'PATH': '/usr/bin:/bin'}}, check=True,"
            " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print('children started', flush=True)\ntime.sleep(600)\n")
    cfg = config(tmp_path, [sys.executable, "-c", rank], host_dir="~/.distrun")
    payload = remote.bundle("supervisor", SUPERVISOR_ONLY)
    argv = remote.bootstrap_argv(sys.executable, payload, "distrun-supervisor", str(cfg["job_id"]), "n0")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload + json.dumps(cfg).encode() + b"\n")
    proc.stdin.flush()
    out = b""
    while b"children started" not in out:
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, out[-2000:]
        out += chunk
    assert wait_until(lambda: len(tagged(tag) - bystanders) == 1, 10)
    time.sleep(2.5)  # two heartbeats: the adoption is recorded
    proc.kill()
    proc.wait()
    assert len(tagged(tag) - bystanders) == 1  # the daemon outlived its supervisor
    cleanup.main([str(cfg["job_id"]), "n0", "1"])
    assert json.loads(capsys.readouterr().out)["found"] >= 2  # the rank and the daemon
    assert wait_until(lambda: tagged(tag) == bystanders, 5), tagged(tag) - bystanders
