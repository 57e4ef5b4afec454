"""The supervisor's lifecycle on this machine: it ends the job whatever fails, a full disk for its copy is
a warning, `~` in the workdir is the home, and it signals only what is certainly the job's."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_ONLY
from orchestrator.remote import provenance
from orchestrator.remote.config import SupervisorConfig
from orchestrator.remote.leader import Leader
from orchestrator.remote.relay import Relay
from orchestrator.remote.stream import Batch, FrameReader, StreamWriter
from orchestrator.remote.supervisor import Supervisor, job_processes, signal_job_process


def config(tmp_path: Path, argv: list[str], **more: Any) -> dict[str, Any]:
    return {"job_id": f"sv-{os.getpid()}-{time.monotonic_ns()}", "node": "n0", "argv": argv,
            "heartbeat_timeout": None, "stop_grace": 1.0, "telemetry_interval": None,
            "host_dir": str(tmp_path / "host"), **more}


def decode(stream: bytes) -> tuple[list[str], list[dict[str, Any]]]:
    """The job's lines (their text, in order) and the supervisor's events in a framed stream."""
    lines: list[str] = []
    events: list[dict[str, Any]] = []

    def batch(b: Batch) -> None:
        lines.extend(b.data.decode().splitlines())

    reader = FrameReader(batch, lambda data: events.append(json.loads(data)), lambda line: lines.append(line.decode()))
    reader.feed(stream)
    reader.close()
    return lines, events


def run_shipped(cfg: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Run the supervisor as a host does (the bundle through the bootstrap); its lines and events."""
    payload = remote.bundle("supervisor", SUPERVISOR_ONLY)
    argv = remote.bootstrap_argv(sys.executable, payload, "distrun-supervisor", cfg["job_id"], cfg["node"])
    done = subprocess.run(argv, input=payload + json.dumps(cfg).encode() + b"\n", capture_output=True, timeout=60,
                          check=False)
    return decode(done.stdout)


def test_a_full_disk_for_the_host_copy_is_a_warning_and_the_job_runs_to_its_end(tmp_path: Path) -> None:
    cfg = config(tmp_path, [sys.executable, "-c", "import sys\nfor i in range(5000): sys.stdout.write(f'line {i}\\n')"])
    copy_dir = tmp_path / "host" / "jobs" / cfg["job_id"] / "n0"
    copy_dir.mkdir(parents=True)
    (copy_dir / "lines.idx").symlink_to("/dev/full")  # every write there fails with ENOSPC

    lines, events = run_shipped(cfg)

    assert lines == [f"line {i}" for i in range(5000)]
    notes = [e["msg"] for e in events if e["ev"] == "note"]
    assert any("host-side copy" in n and "No space left on device" in n and "still goes to the controller" in n
               for n in notes)
    assert [e for e in events if e["ev"] == "exit"] == [{"ev": "exit", "rc": 0, "reason": None,
                                                          "oom_kills": events[-1]["oom_kills"],
                                                          "workers_at_stop": None, "stop_at": None,
                                                          "alive_at_stop": None, "raised_at_stop": [],
                                                          "gpus_freed": [],
                                                          "stop_cause": None, "workers": [], "restarts": 0}]


def test_the_job_ends_with_its_supervisor_whatever_fails(tmp_path: Path, monkeypatch) -> None:
    cfg = config(tmp_path, ["sh", "-c", "sleep 300 & exec sleep 301"])
    monkeypatch.setattr(Supervisor, "_catch_signals", lambda self: None)

    def broken_relay(self: Relay, child: subprocess.Popen[bytes]) -> None:
        time.sleep(0.3)  # the job and its child are running
        raise RuntimeError("relay broke")

    monkeypatch.setattr(Relay, "run", broken_relay)
    out = io.BytesIO()
    supervisor = Supervisor(SupervisorConfig.from_dict(cfg), StreamWriter(out))

    supervisor.run(io.BytesIO())

    assert job_processes(cfg["job_id"], os.getpid(), "n0") == []
    exit_event = decode(out.getvalue())[1][-1]
    assert exit_event["ev"] == "exit" and exit_event["error"] == "supervisor failed: RuntimeError: relay broke"
    assert exit_event["rc"] == -signal.SIGTERM


def test_a_job_that_cannot_start_reports_why_and_leaves_nothing(tmp_path: Path) -> None:
    _, events = run_shipped(config(tmp_path, ["/no/such/program"]))
    assert events[-1]["ev"] == "exit" and events[-1]["rc"] == 127
    assert events[-1]["error"].startswith("cannot start /no/such/program: [Errno 2] No such file or directory")


def test_a_workdir_under_tilde_is_the_hosts_home(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    cfg = config(tmp_path, [sys.executable, "-c", "import os; print(os.getcwd())"], cwd="~/project")
    monkeypatch.setenv("HOME", str(home))
    lines, events = run_shipped(cfg)
    assert lines == [str(home / "project")] and events[-1]["rc"] == 0


def test_a_process_group_is_signalled_until_its_leader_is_reaped_and_never_after(monkeypatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    leader = Leader(subprocess.Popen(["true"], start_new_session=True))

    leader.wait_exit()  # exited, not reaped: the pid (and so the group) is still this job's
    leader.signal_group(signal.SIGTERM)
    assert leader.wait() == 0
    leader.signal_group(signal.SIGKILL)  # reaped: the pid may belong to anyone now

    assert sent == [(leader.pid, signal.SIGTERM)]


def argv_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]
    except OSError:
        return []


def test_only_what_descends_from_the_jobs_root_is_signalled_markers_or_not() -> None:
    """The root stands for the supervisor: its child without markers is the job's; its child that
    names another job (one the job started) and a process beside it carrying the job's markers are not."""
    root = subprocess.Popen(["sh", "-c", "env -i sleep 31 & DISTRUN_JOB_ID=j-other sleep 32 & wait"])
    claims = subprocess.Popen(["sleep", "33"], env={**os.environ, "DISTRUN_JOB_ID": "j-42", "DISTRUN_NODE": "n0"})
    by_argv: dict[str, int] = {}
    try:
        roots = [provenance.root_of(root.pid)]
        deadline = time.monotonic() + 5
        while len(by_argv) < 2 and time.monotonic() < deadline:
            children = [int(p) for p in os.listdir("/proc") if p.isdigit() and provenance.proven(int(p), roots)]
            by_argv = {" ".join(argv_of(p)): p for p in children if argv_of(p)[:1] == ["sleep"]}
            time.sleep(0.01)  # until both children have exec'd with their own environments
        unmarked, other_job = by_argv["sleep 31"], by_argv["sleep 32"]
        assert sorted(job_processes("j-42", os.getpid(), "n0", roots)) == sorted([root.pid, unmarked])
        for pid in (unmarked, other_job, claims.pid):
            signal_job_process(pid, signal.SIGTERM, "j-42", "n0", roots)
        assert wait_gone(unmarked)
        assert argv_of(other_job) == ["sleep", "32"] and claims.poll() is None
    finally:
        for pid in by_argv.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for proc in (root, claims):
            proc.kill()
            proc.wait()


def wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in (b"Z", b"X"):
            return True
        time.sleep(0.01)
    return False


def test_the_exit_event_counts_the_hosts_oom_kills_during_the_job(tmp_path: Path) -> None:
    _, events = run_shipped(config(tmp_path, ["true"]))
    assert events[-1]["oom_kills"] == 0
