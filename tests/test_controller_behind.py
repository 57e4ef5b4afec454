"""A controller that falls behind its hosts' output does not blame them for the silence: output of a
host that waits unread in the controller (in the pipe, or in a reader busy with it) is a word from
it. A host that truly says nothing is still lost within its heartbeat timeout.

The host is a real process started by the local transport, writing the supervisor's stream
(remote/stream.py) through a real pipe to a real HostRun; the controller is made late by holding
its reader (a sink that does not return) or by reading nothing for a while.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backends.ssh import SupervisorChannel
from orchestrator.logs import LogSink
from orchestrator.plan import HostPlan
from orchestrator.remote.stream import Batch
from orchestrator.run.hostrun import HostRun
from orchestrator.spec.model import NodeSpec
from orchestrator.store import Store
from orchestrator.telemetry import view
from orchestrator.telemetry.alerts import Alert, AlertRules
from orchestrator.transport.local import LocalProcess, LocalTransport

LOST_AFTER = 1.0
LATE = 3 * LOST_AFTER  # how long the controller is behind: well past the heartbeat timeout
# A supervisor's stream: a heartbeat event and a line of rank 0, ten times a second.
SPEAKER = ("import sys, time\n"
           "while True:\n"
           "    sys.stdout.buffer.write(b'\\x1e{\"ev\": \"hb\"}\\n\\x1f0 o 1 5 -\\ntick\\n')\n"
           "    sys.stdout.buffer.flush()\n"
           "    time.sleep(0.1)\n")


@pytest.fixture
def speaker() -> Iterator[LocalProcess]:
    transport = LocalTransport(NodeSpec(name="node1", host="127.0.0.1"))
    proc = transport.start([sys.executable, "-c", SPEAKER])
    yield proc
    os.kill(proc.popen.pid, signal.SIGKILL)
    proc.popen.wait()


def host_on(proc: LocalProcess, tmp_path: Path) -> HostRun:
    plan = HostPlan("node1", "127.0.0.1", 1, 1, sys.executable, "/w", [], {}, [], None)
    host = HostRun(plan, LogSink(Store(tmp_path).job_dir("behind-1")))
    host.attach(SupervisorChannel(proc, LocalTransport(NodeSpec(name="node1", host="127.0.0.1"))))
    return host


def declared_lost_within(host: HostRun, seconds: float) -> bool:
    """Whether the run loop's check (every 50 ms, as attempt.POLL) finds the host lost within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if host.failure(LOST_AFTER) is not None:
            return True
        time.sleep(0.05)
    return False


def test_a_host_whose_output_waits_unread_in_the_pipe_is_not_lost(speaker: LocalProcess, tmp_path: Path):
    host = host_on(speaker, tmp_path)
    assert not declared_lost_within(host, LATE)  # nothing read yet: the host's output waits in the pipe
    speaker.stream_bytes(host.on_data, lambda _line: None)
    assert not declared_lost_within(host, LOST_AFTER)
    assert host.sink.last_lines("node1", 0, 1) == ("tick",)  # it spoke all along


def test_a_host_is_not_lost_while_the_controller_is_stuck_handling_its_output(speaker: LocalProcess,
                                                                               tmp_path: Path):
    host = host_on(speaker, tmp_path)
    stuck, release = threading.Event(), threading.Event()
    batch = host.sink.batch

    def slow(node: str, lines: Batch) -> None:
        stuck.set()
        release.wait()
        batch(node, lines)

    host.sink.batch = slow  # type: ignore[method-assign]
    speaker.stream_bytes(host.on_data, lambda _line: None)
    assert stuck.wait(10)
    try:
        assert not declared_lost_within(host, LATE)
    finally:
        release.set()


def test_a_host_that_says_nothing_is_lost_within_its_timeout_though_the_controller_was_behind(
        speaker: LocalProcess, tmp_path: Path):
    host = host_on(speaker, tmp_path)
    time.sleep(LATE)  # the controller behind: the host's output waits in the pipe
    speaker.stream_bytes(host.on_data, lambda _line: None)
    time.sleep(0.5)  # caught up
    os.kill(speaker.popen.pid, signal.SIGSTOP)  # from now on the host says nothing
    silent_from = time.monotonic()
    assert declared_lost_within(host, LOST_AFTER + 1.0)
    assert time.monotonic() - silent_from >= LOST_AFTER - 0.2
    lost = host.failure(LOST_AFTER)
    assert lost is not None and lost.describe() == "host lost: nothing heard for 1 s (network cut or host down)"


def test_a_host_whose_output_waits_unread_gets_no_telemetry_silence_alert_until_read_with_no_sample(
        speaker: LocalProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(view, "TICK", 0.05)
    host = host_on(speaker, tmp_path)  # it sends heartbeats and lines, never a telemetry sample
    alerts: list[Alert] = []
    monitor = view.Monitor(["node1"], 0.1, alerts.extend, lambda _node: True, title="behind-1",
                           rules=AlertRules(silent_min_s=LOST_AFTER, silent_intervals=1),
                           waiting=lambda _node: host.output_waiting())
    monitor.aggregator.observe("node1", {"kind": "host"})
    monitor.start()
    try:
        time.sleep(LATE)  # the controller behind: the host's output waits in the pipe
        assert alerts == []
        speaker.stream_bytes(host.on_data, lambda _line: None)  # read: no sample in it
        deadline = time.monotonic() + LOST_AFTER + 5.0
        while not alerts and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        monitor.stop()
    assert [(a.node, a.rule) for a in alerts] == [("node1", "silent")]
