"""The host group: parallel connections, per-host results, one error carrying them; no cluster needed.

Hosts are the real local transport (commands run on this machine) and fake transports whose
connect fails the way an SSH connection does, so every path runs without sshd.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Mapping, Sequence
from typing import ClassVar

import pytest

from orchestrator.console.terminal import ProgressCounter
from orchestrator.errors import ExitCode, InfraError, UsageError
from orchestrator.fanout.group import Group, GroupError, GroupResult, parallel
from orchestrator.spec.model import NodeSpec, TransportKind
from orchestrator.transport import RemoteProcess, Transport, transport_for
from orchestrator.transport.base import REACH_HINT, ConnectError, ConnectFailure
from tests.helpers import REPO

FIX = f" (fix: {REACH_HINT})"


def local(name: str) -> NodeSpec:
    return NodeSpec(name=name, host="localhost", python=sys.executable, transport=TransportKind.LOCAL)


class FakeTransport(Transport):
    """A host whose connect fails with `error` (or succeeds, slowly when asked); counts closes."""

    closed: ClassVar[list[str]] = []

    def __init__(self, node: NodeSpec, error: Exception | None = None, delay: float = 0.0) -> None:
        super().__init__(node)
        self.error = error
        self.delay = delay
        self.connects = 0

    def connect(self) -> None:
        self.connects += 1
        time.sleep(self.delay)
        if self.error is not None:
            raise self.error

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> RemoteProcess:
        raise InfraError(f"{self.name}: fake hosts run nothing")

    def peer_address(self) -> str:
        return "10.0.0.1"

    def close(self) -> None:
        FakeTransport.closed.append(self.name)


def refused(name: str, addr: str) -> ConnectError:
    return ConnectError(f"{name} ({addr}:22): unreachable: connection refused", ConnectFailure.UNREACHABLE)


def fakes(errors: dict[str, Exception | None], delay: float = 0.0) -> Group:
    FakeTransport.closed = []
    return Group([NodeSpec(name=n, host=n) for n in errors],
                 make=lambda node: FakeTransport(node, errors[node.name], delay))


def test_run_on_local_hosts_gives_every_hosts_value_in_order():
    with Group([local("a"), local("b"), local("c")]) as group:
        result = group.run(lambda t: t.run([sys.executable, "-c", f"print('{t.name}')"]).stdout)
    assert list(result) == ["a", "b", "c"]
    assert result.succeeded == {"a": "a", "b": "b", "c": "c"} and result.failed == {}
    assert result.check() == result.succeeded


def test_one_hosts_exception_is_its_result_and_the_others_still_run():
    def fn(transport: Transport) -> int:
        if transport.name == "b":
            raise InfraError("b: disk full")
        return transport.run(["true"]).returncode

    with Group([local("a"), local("b"), local("c")]) as group:
        result = group.run(fn)
    assert result.succeeded == {"a": 0, "c": 0}
    assert list(result.failed) == ["b"] and str(result.failed["b"]) == "b: disk full"
    assert result.unreachable == {}


def test_connect_names_every_unreachable_host_after_all_answered_and_closes_all():
    group = fakes({"node0": refused("node0", "10.0.0.10"), "node1": None, "node2": refused("node2", "10.0.0.12")})
    with pytest.raises(GroupError) as caught:
        group.connect()
    error = caught.value
    assert set(error.failed) == {"node0", "node2"} and set(error.result.unreachable) == {"node0", "node2"}
    assert str(error) == "node[0,2]: unreachable: connection refused" + FIX
    assert error.render(fold=False) == ("node0 (10.0.0.10:22): unreachable: connection refused; "
                                        "node2 (10.0.0.12:22): unreachable: connection refused" + FIX)
    assert error.exit_code == ExitCode.INFRA
    assert sorted(FakeTransport.closed) == ["node0", "node1", "node2"]


def test_a_host_alone_with_its_error_keeps_its_own_message():
    group = fakes({"node0": refused("node0", "10.0.0.10"), "node1": None,
                   "node2": ConnectError("node2 (10.0.0.12:22): authentication failed as root",
                                         ConnectFailure.AUTH)})
    with pytest.raises(GroupError) as caught:
        group.connect()
    assert str(caught.value) == ("node0 (10.0.0.10:22): unreachable: connection refused; "
                                 "node2 (10.0.0.12:22): authentication failed as root" + FIX)


def test_connect_without_strict_reports_instead_of_raising():
    with fakes({"node0": None, "node1": refused("node1", "10.0.0.11")}) as group:
        result = group.connect(strict=False)
    assert list(result.succeeded) == ["node0"] and list(result.unreachable) == ["node1"]


def test_leaving_the_block_closes_every_connection_even_on_an_error():
    with pytest.raises(RuntimeError, match="boom"), fakes({"a": None, "b": None}):
        raise RuntimeError("boom")
    assert sorted(FakeTransport.closed) == ["a", "b"]


def test_what_is_named_after_the_hosts_that_share_an_error():
    result: GroupResult[int] = GroupResult(a=InfraError("a: tar failed"), b=InfraError("b: tar failed"), c=1)
    with pytest.raises(GroupError) as caught:
        result.check("workdir sync failed")
    assert str(caught.value) == "a,b: workdir sync failed: tar failed"


def test_the_exit_code_is_the_one_the_errors_share():
    usage: GroupResult[None] = GroupResult(a=UsageError("a: bad"), b=UsageError("b: bad"))
    mixed: GroupResult[None] = GroupResult(a=UsageError("a: bad"), b=InfraError("b: down"))
    assert GroupError(usage).exit_code == ExitCode.USAGE
    assert GroupError(mixed).exit_code == ExitCode.INFRA


def test_hosts_are_reached_at_once_not_one_after_the_other():
    group = fakes({f"n{i}": None for i in range(16)}, delay=0.5)
    began = time.monotonic()
    with group:
        group.connect()
    assert time.monotonic() - began < 4  # one after the other would take 8 s


def test_run_connects_each_host_itself_so_a_slow_host_does_not_hold_back_the_others():
    finished: dict[str, float] = {}
    errors: dict[str, Exception | None] = {"fast": None, "slow": None}
    group = Group([NodeSpec(name=n, host=n) for n in errors],
                  make=lambda node: FakeTransport(node, None, 1.0 if node.name == "slow" else 0.0))
    began = time.monotonic()
    with group:
        group.run(lambda t: finished.setdefault(t.name, time.monotonic() - began))
    assert finished["fast"] < 0.5 <= finished["slow"]


def test_only_calls_the_named_hosts():
    with Group([local("a"), local("b")]) as group:
        assert list(group.run(lambda t: t.name, only=["b"])) == ["b"]


def test_parallel_keeps_the_items_order_and_runs_them_together():
    barrier = threading.Barrier(3, timeout=5)
    result = parallel(["x", "y", "z"], lambda item: (barrier.wait(), item.upper())[1], key=str)
    assert result == {"x": "X", "y": "Y", "z": "Z"}


def test_a_local_group_runs_the_real_transport():
    node = local("here")
    with Group([node]) as group:
        group.connect()
        assert isinstance(group["here"], type(transport_for(node)))
        assert group.run(lambda t: t.run(["echo", "hi"]).stdout).check() == {"here": "hi"}


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_connecting_shows_how_many_hosts_answered_on_a_terminal_then_erases_it():
    out = Tty()
    errors: dict[str, Exception | None] = {"node0": None, "node1": refused("node1", "10.0.0.11"), "node2": None}
    FakeTransport.closed = []
    group = Group([NodeSpec(name=n, host=n) for n in errors], make=lambda node: FakeTransport(node, errors[node.name]),
                  progress=ProgressCounter(3, "connected", out))
    with group:
        group.connect(strict=False)
        group.run(lambda _t: None)
    shown = out.getvalue()
    assert shown.count("connected ") == 2 and "connected 2/3" in shown
    assert shown.endswith("\r\x1b[2K")


def test_a_signal_the_kernel_gives_to_a_worker_thread_still_runs_the_main_threads_handler() -> None:
    """Ctrl-C or SIGTERM during `exec` can land on any thread; the main thread, waiting for the
    hosts, must still run its handler at once (exec once hung until every host answered)."""
    script = textwrap.dedent("""
        import signal, sys, threading, time
        from orchestrator.fanout.group import parallel

        stop = threading.Event()

        def handler(signum, frame):
            stop.set()
            raise SystemExit(7)

        def host(_item):
            time.sleep(0.5)  # the main thread is waiting for this host by now
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this worker thread only
            stop.wait(30)

        signal.signal(signal.SIGTERM, handler)
        parallel([0], host, key=str)
    """)
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.returncode, time.monotonic() - began < 10) == (7, True), done.stderr
