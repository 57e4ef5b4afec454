"""`distrun exec` without a cluster: selection, exit codes, the report, the local transport."""

from __future__ import annotations

import io
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import ExitCode, InfraError
from orchestrator.fanout.execute import ExecRequest, ExecResult, exec_on_hosts, exit_code, report
from orchestrator.spec import inventory_from_text
from orchestrator.spec.model import NodeSpec
from orchestrator.transport.base import REACH_HINT, ConnectError, ConnectFailure
from tests.helpers import REPO

INVENTORY = inventory_from_text(
    "nodes:\n"
    "  - {name: node0, host: 10.0.0.10, labels: [a100]}\n"
    "  - {name: node1, host: 10.0.0.11, labels: [h100, ib]}\n"
    "  - {name: node2, host: 10.0.0.12, labels: [h100]}\n",
    "inv.yaml",
)
NODE = NodeSpec(name="node1", host="10.0.0.11")


def children(pid: int) -> list[int]:
    """Pids whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def names(nodes: list[NodeSpec]) -> list[str]:
    return [node.name for node in nodes]


def test_exit_code_is_zero_only_when_every_host_succeeded() -> None:
    ok = ExecResult.finished(NODE, 0, "", "")
    failed = ExecResult.finished(NODE, 2, "", "")
    down = ExecResult.failed(NODE, ConnectError("node1 (10.0.0.11:22): unreachable: x", ConnectFailure.UNREACHABLE))
    assert exit_code([ok, ok]) is ExitCode.OK
    assert exit_code([ok, failed]) is ExitCode.FAILED
    assert exit_code([ok, down]) is ExitCode.INFRA
    assert exit_code([failed, down]) is ExitCode.INFRA


def test_a_failure_after_connecting_is_not_an_unreachable_host() -> None:
    result = ExecResult.failed(NODE, InfraError("node1: cannot start x: channel closed"))
    assert (result.unreachable, result.failure, result.rc) == (False, "error", None)
    assert exit_code([result]) is ExitCode.FAILED


def test_report_gathers_output_and_summarises_failures() -> None:
    results = [
        ExecResult.finished(NodeSpec("node0", "a"), 0, "same", ""),
        ExecResult.finished(NodeSpec("node1", "b"), 0, "same", ""),
        ExecResult.finished(NodeSpec("node2", "c"), 1, "", "boom"),
        ExecResult.failed(NodeSpec("node3", "d"), ConnectError("node3 (d:22): authentication failed as root with k "
                                                               "(check identity_file / user)", ConnectFailure.AUTH)),
    ]
    out, err = io.StringIO(), io.StringIO()
    report(results, out, err)
    assert out.getvalue() == (
        "---------------\nnode[0-1] (2)\n---------------\nsame\n"
        "---------------\nnode2 (1): exit code 1\n---------------\nboom\n"
        "---------------\nnode3 (1): auth failed\n---------------\n"
        "authentication failed as root with k (check identity_file / user)\n"
    )
    assert err.getvalue() == ("distrun: 2 of 4 hosts failed: node2 (exit code 1), node3 (auth failed)\n"
                              f"distrun: fix: {REACH_HINT}\n")


def test_prefix_prints_each_line_as_pdsh_does_host_colon_line_in_host_order_nothing_gathered() -> None:
    results = [
        ExecResult.finished(NodeSpec("node0", "a"), 0, "same\ntwo", ""),
        ExecResult.finished(NodeSpec("node1", "b"), 0, "same\ntwo", ""),
        ExecResult.finished(NodeSpec("node2", "c"), 1, "", "boom"),
    ]
    out, err = io.StringIO(), io.StringIO()
    report(results, out, err, prefix=True)
    assert out.getvalue() == "node0: same\nnode0: two\nnode1: same\nnode1: two\nnode2: boom\n"
    assert err.getvalue() == "distrun: 1 of 3 hosts failed: node2 (exit code 1)\n"


def test_hosts_that_failed_to_connect_alike_share_one_block() -> None:
    results = [ExecResult.failed(NodeSpec(f"node{i}", f"10.0.0.{i}"), ConnectError(
        f"node{i} (10.0.0.{i}:22): authentication failed as root with k", ConnectFailure.AUTH)) for i in range(3)]
    out, err = io.StringIO(), io.StringIO()
    report(results, out, err)
    assert out.getvalue() == ("---------------\nnode[0-2] (3): auth failed\n---------------\n"
                              "authentication failed as root with k\n")
    assert err.getvalue().count(REACH_HINT) == 1


def test_json_lists_every_documented_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)
    out = io.StringIO()
    code = exec_on_hosts(ExecRequest(argv=("sh", "-c", "echo a; echo b; echo e >&2; exit 3"), as_json=True), out=out)
    assert code == ExitCode.FAILED
    assert json.loads(out.getvalue()) == [
        {"node": "localhost", "host": "localhost", "rc": 3, "stdout": "a\nb", "stderr": "e", "error": None}
    ]


def test_runs_on_the_built_in_local_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)
    out, err = io.StringIO(), io.StringIO()
    assert exec_on_hosts(ExecRequest(argv=("echo", "$(hostname)")), out=out, err=err) == ExitCode.OK
    assert out.getvalue() == "---------------\nlocalhost (1)\n---------------\n$(hostname)\n"
    assert err.getvalue() == ""


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_ends_the_commands_and_exits_at_once(signum: int, code: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "exec", "--", "sleep", "60"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children(proc.pid), "the command never started"
    began = time.monotonic()
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == code
    assert time.monotonic() - began < 5
    assert "Traceback" not in stderr


def test_a_command_that_starts_after_ctrl_c_is_ended_at_once():
    from orchestrator.fanout.execute import _Running

    ended: list[str] = []

    class Proc:
        def __init__(self, name: str) -> None:
            self.name = name

        def terminate(self) -> None:
            ended.append(self.name)

    running = _Running()
    running.add(Proc("early"))  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        running.interrupt(signal.SIGINT)
    with pytest.raises(InfraError, match="interrupted before the command started"):
        running.add(Proc("late"))  # type: ignore[arg-type]
    assert ended == ["early", "late"]


def seconds(whole: int) -> str:
    """A `sleep` argument no other process on this machine has: `whole` seconds and a random fraction."""
    return f"{whole}.{secrets.randbelow(10**9):09d}"


def with_arg(marker: str) -> list[int]:
    """Pids of processes whose command line has `marker` as an argument."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in path.read_bytes().split(b"\0"):
                found.append(int(path.parent.name))
        except OSError:
            continue
    return found


def test_timeout_ends_the_command_and_every_process_it_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)
    out, err = io.StringIO(), io.StringIO()
    first, second = seconds(301), seconds(302)
    script = f"echo started; sleep {first} & sleep {second}"
    assert exec_on_hosts(ExecRequest(argv=("sh", "-c", script), timeout=1.0), out=out, err=err) == ExitCode.FAILED
    assert "started" in out.getvalue() and "timed out after 1 s" in out.getvalue()
    deadline = time.monotonic() + 10
    while (with_arg(first) or with_arg(second)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not with_arg(first) and not with_arg(second), "the command (or its child) outlived --timeout"


def test_ctrl_c_ends_the_command_and_every_process_it_started() -> None:
    first, second = seconds(303), seconds(304)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "exec", "--", "sh", "-c",
                             f"sleep {first} & sleep {second}"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (with_arg(first) and with_arg(second)) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while (with_arg(first) or with_arg(second)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.returncode == 130 and not with_arg(first) and not with_arg(second)


def test_a_command_killed_by_a_signal_exits_as_a_shell_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)
    out = io.StringIO()
    exec_on_hosts(ExecRequest(argv=("sh", "-c", "kill -9 $$"), as_json=True), out=out)
    assert json.loads(out.getvalue())[0]["rc"] == 128 + signal.SIGKILL


def test_a_missing_command_exits_127_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRUN_INVENTORY", raising=False)
    out = io.StringIO()
    exec_on_hosts(ExecRequest(argv=("no-such-command-here",), as_json=True), out=out)
    entry = json.loads(out.getvalue())[0]
    assert entry["rc"] == 127
    assert entry["stderr"] == "distrun: cannot run no-such-command-here: No such file or directory"


def test_an_end_asked_while_the_guard_starts_its_command_ends_the_command_once_started() -> None:
    """The guard's handlers are in place before the command starts: a SIGTERM in between used to
    kill the guard alone and leave the command running, holding exec's pipes open (exec hung)."""
    from orchestrator.remote.guard import Guard

    wakeup, wake = os.pipe()
    guard = Guard(grace=1.0, stdin=None, wakeup=wakeup)
    guard.ask_end()  # what the SIGTERM handler does
    began = time.monotonic()
    guard.start(["sleep", "60"])
    try:
        assert guard.wait() == 128 + signal.SIGTERM
    finally:
        os.close(wakeup)
        os.close(wake)
    assert time.monotonic() - began < 5


def run_guard(*argv: str, grace: float = 5.0, python: tuple[str, ...] = (sys.executable,)) -> subprocess.Popen[bytes]:
    """The guard as exec starts it on a host (isolated python, its source on stdin), stdin left open."""
    from orchestrator import remote

    program = remote.module_source("guard").encode()
    python_argv = remote.lean_argv(python[0], program, f"{grace:g}", *argv)
    guard = subprocess.Popen([*python, *python_argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    assert guard.stdin is not None
    guard.stdin.write(program)
    guard.stdin.flush()
    return guard


def test_the_end_of_the_guards_stdin_ends_the_command_and_every_process_it_started() -> None:
    """A dropped connection or a closed channel is the end of the guard's stdin."""
    first, second = seconds(306), seconds(307)
    guard = run_guard("sh", "-c", f"sleep {first} & sleep {second}")
    deadline = time.monotonic() + 30
    while not (with_arg(first) and with_arg(second)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guard.stdin is not None
    guard.stdin.close()
    assert guard.wait(timeout=10) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while (with_arg(first) or with_arg(second)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not with_arg(first) and not with_arg(second)


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    guard = run_guard("sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done", grace=1.0)
    assert guard.stdout is not None and guard.stdout.readline() == b"ready\n"
    began = time.monotonic()
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(timeout=10) == 128 + signal.SIGKILL
    assert 0.9 < time.monotonic() - began < 5


def test_the_command_gets_sigpipe_at_its_default_as_under_a_shell() -> None:
    """Python ignores SIGPIPE; a command started with it ignored prints `Broken pipe` errors."""
    guard = run_guard("sh", "-c", "yes | head -n 1")
    assert guard.stdout is not None and guard.stderr is not None
    out, err = guard.stdout.read(), guard.stderr.read()
    assert (guard.wait(timeout=30), out, err) == (0, b"y\n", b"")


def test_the_guard_imports_only_what_python_has_at_hand() -> None:
    """It runs once per host for every exec: site, subprocess, threading or signal (enum) would
    triple the host's CPU for `exec true` (bench/results/exec.md)."""
    guard = run_guard("true", python=(sys.executable, "-X", "importtime"))
    assert guard.stderr is not None
    stderr = guard.stderr.read()
    # os and what it imports are frozen into the interpreter: no file is read for them.
    bare = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", "-c", "import os"], capture_output=True,
                          timeout=30)

    def imported(stderr: bytes) -> set[str]:
        lines = stderr.decode().splitlines()
        return {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}

    assert guard.wait(timeout=30) == 0
    assert imported(stderr) - imported(bare.stderr) - {"import time:"} <= {"_signal", "select", "time"}


def test_a_host_python_older_than_3_8_is_one_line_naming_it_and_the_fix() -> None:
    from orchestrator import remote

    older = ("import sys;sys.version_info=(3,7,3,'final',0);g={'__name__':'distrun'};"
             "exec(sys.stdin.read(),g);g['main'](['5','true'])")
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", older], input=remote.module_source("guard"),
                         capture_output=True, text=True, timeout=30)
    assert ran.returncode == 126
    assert ran.stderr == ("distrun: exec needs Python 3.8 or later on this host, and its python is 3.7.3: point the "
                          "node's `python:` in the inventory at a newer one\n")
