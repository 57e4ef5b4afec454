"""`distrun exec`: run one command on many hosts at once and show what each host said.

Text output gathers hosts whose output (stdout, then stderr) and status are identical into
one block headed by their host range, as `clush -b` does; a host that could not be
reached shows its error as its output. A last line on stderr names the hosts that failed
and why. Control characters a host printed (an escape sequence that would retitle or clear
the terminal) are shown as text, `\x1b`; `--json` keeps the output exact, JSON-escaped.

`--prefix` prints each line as pdsh does instead, `node0: line`, the hosts in inventory order,
nothing gathered (for grep, sort and awk, and pdsh's dshbak).

`--json` prints one list instead, in inventory order, one object per host:

    [{"node": "node0", "host": "10.0.0.10", "rc": 0, "stdout": "...", "stderr": "", "error": null}, ...]

- `node`: the inventory name; `host`: the inventory `host` (address or ssh_config alias).
- `rc`: the command's exit status; null when it never ran or did not finish.
- `stdout`, `stderr`: the output lines joined by "\\n" (no final newline).
- `error`: null when the command ran to its end, whatever its exit status; otherwise one
  line saying why not (unreachable, authentication failed, host key, timed out).

The command runs under remote/guard.py in the host's python: after `--timeout`, Ctrl-C or a
dropped connection, it ends with every process it started (no pty ends a remote command).

Exit status: 3 when any host could not be reached or logged into, whatever the others did
(the answer is incomplete); else 1 when the command failed on any host (non-zero exit, or
it ran past `--timeout`); else 0.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from orchestrator import remote
from orchestrator.console.display import HostOutput, failure_summary, gather, render_blocks
from orchestrator.console.interrupts import on_signals
from orchestrator.console.terminal import ProgressCounter, show
from orchestrator.errors import ExitCode, InfraError, UsageError, one_line
from orchestrator.fanout.group import Group, without_host
from orchestrator.remote.redact import escape_controls, escape_json
from orchestrator.spec.model import NodeSpec
from orchestrator.spec.select import HostSelection, SelectionGuard, select_hosts
from orchestrator.transport import RemoteProcess, Transport
from orchestrator.transport.base import ConnectError, reach_hint

STOP_WAIT = 5.0  # after --timeout, how long a stopped command may take to report


@dataclass(frozen=True)
class ExecRequest:
    """What `distrun exec` was asked."""

    argv: tuple[str, ...]
    inventory: str | None = None
    selection: HostSelection = field(default_factory=HostSelection)
    guard: SelectionGuard | None = None
    timeout: float | None = None
    as_json: bool = False
    prefix: bool = False  # pdsh's `node: line` lines instead of gathered blocks


@dataclass(frozen=True)
class ExecResult:
    """How the command went on one host.

    `failure` is the summary's few words for a host that did not succeed ("exit code 2",
    "unreachable", "timed out"); "" for one that did.
    """

    node: str
    host: str
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    failure: str = ""
    unreachable: bool = False
    exception: Exception | None = field(default=None, compare=False, repr=False)

    @classmethod
    def finished(cls, node: NodeSpec, rc: int, stdout: str, stderr: str) -> ExecResult:
        """The command ran to its end with status `rc`."""
        return cls(node.name, node.host, rc, stdout, stderr, failure="" if rc == 0 else f"exit code {rc}")

    @classmethod
    def failed(cls, node: NodeSpec, exc: Exception) -> ExecResult:
        """The command could not run; a ConnectError means the host was not reached at all."""
        message = one_line(exc)
        if isinstance(exc, ConnectError):
            return cls(node.name, node.host, error=message, failure=exc.failure.value, unreachable=True,
                       exception=exc)
        return cls(node.name, node.host, error=message, failure="error", exception=exc)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "rc": self.rc, "stdout": self.stdout,
                "stderr": self.stderr, "error": self.error}


def exec_on_hosts(request: ExecRequest, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run the command on the selected hosts in parallel and print the results.

    Args:
        request: The command, inventory and selection.
        out: Where the per-host output (or the JSON list) goes.
        err: Where the failure summary goes.

    Returns:
        The exit status: 0 all succeeded, 1 the command failed somewhere, 3 a host was not reached.

    Raises:
        UsageError: no command, the selection names unknown nodes or labels, or the guard refused.
        SpecError: the inventory file is not valid.
    """
    from orchestrator.spec import resolve_inventory_path

    if not request.argv:
        raise UsageError("exec: no command given (usage: distrun exec [OPTIONS] -- COMMAND ...)")
    nodes = select_hosts(resolve_inventory_path(request.inventory), request.selection, request.guard, "exec")
    results = run_on_all(nodes, request.argv, request.timeout)
    if request.as_json:
        show(escape_json(json.dumps([r.to_json() for r in results], indent=2, ensure_ascii=False)), stream=out)
    else:
        report(results, out, err, request.prefix)
    return int(exit_code(results))


def run_on_all(nodes: Sequence[NodeSpec], argv: Sequence[str], timeout: float | None) -> list[ExecResult]:
    """Connect to every node and run `argv` there, all at once; one host's failure is its result.

    SIGINT or SIGTERM ends every command, then stops as it would have (130 or 143).

    Returns:
        One result per node, in the nodes' order.
    """
    running = _Running()
    with Group(nodes, progress=ProgressCounter(len(nodes), "connected")) as group, on_signals(running.interrupt):
        results = group.run(lambda t: _run_on(t, argv, timeout, running))
    return [_as_result(node, results[node.name]) for node in nodes]


def _run_on(transport: Transport, argv: Sequence[str], timeout: float | None, running: _Running) -> ExecResult:
    node = transport.node
    proc = running.add(start_guarded(transport, argv))
    out: list[str] = []
    errs: list[str] = []
    proc.stream(out.append, errs.append)
    rc = proc.wait(timeout)
    if rc is None:
        proc.terminate()
        proc.wait(STOP_WAIT)
        return ExecResult(node.name, node.host, None, "\n".join(out), "\n".join(errs),
                          error=f"{node.name}: timed out after {timeout:g} s", failure="timed out")
    return ExecResult.finished(node, rc, "\n".join(out), "\n".join(errs))


def start_guarded(transport: Transport, argv: Sequence[str]) -> RemoteProcess:
    """Start `argv` on the host under remote/guard.py: the command and its process group end
    when this command's channel closes (`terminate`, Ctrl-C, a dropped connection), which a
    command run over SSH without a pty would not. Its stdin stays open: its end is that signal.

    Raises:
        InfraError: the command could not be started.
    """
    program = remote.module_source("guard").encode()
    proc = transport.start(remote.lean_argv(transport.node.python, program, f"{STOP_WAIT:g}", *argv))
    proc.write(program)
    return proc


def _as_result(node: NodeSpec, outcome: ExecResult | Exception) -> ExecResult:
    return outcome if isinstance(outcome, ExecResult) else ExecResult.failed(node, outcome)


class _Running:
    """The commands under way, so that Ctrl-C or SIGTERM can end them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[RemoteProcess] = []
        self._stopped = False

    def add(self, proc: RemoteProcess) -> RemoteProcess:
        """Track a command just started; one that starts after an interrupt is ended at once.

        Raises:
            InfraError: the command started after the interrupt (a host that was still connecting).
        """
        with self._lock:
            if not self._stopped:
                self._procs.append(proc)
                return proc
        proc.terminate()
        raise InfraError("interrupted before the command started")

    def interrupt(self, signum: int) -> None:
        """End every command, then unwind as the signal would have (130 on SIGINT, else 143)."""
        with self._lock:
            self._stopped = True
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(InfraError, OSError):
                proc.terminate()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(int(ExitCode.TERMINATED))


def report(results: Sequence[ExecResult], out: TextIO, err: TextIO, prefix: bool = False) -> None:
    """Print gathered blocks (with `prefix`, pdsh's `node: line` lines) to `out` and, when some
    host failed, the summary line to `err`."""
    shown = ("".join(f"{r.node}: {line}\n" for r in results for line in _shown(r).lines) if prefix
             else render_blocks(gather({r.node: _shown(r) for r in results})))
    show(shown, stream=out, end="", flush=True)
    summary = failure_summary({r.node: r.failure for r in results if r.failure}, len(results))
    if summary:
        show(f"distrun: {summary}", stream=err)
    hint = reach_hint(r.exception for r in results if r.exception is not None)
    if hint:
        show(f"distrun: fix: {hint}", stream=err)


def _shown(result: ExecResult) -> HostOutput:
    lines = [*_lines(result.stdout), *_lines(result.stderr)]
    if result.error is not None:
        # Without its host name, so that hosts with the same error share one block.
        lines.append(without_host(result.node, result.error))
    return HostOutput(tuple(escape_controls(line) for line in lines), result.failure)


def _lines(text: str) -> list[str]:
    return text.split("\n") if text else []


def exit_code(results: Sequence[ExecResult]) -> ExitCode:
    """3 if a host was not reached, else 1 if the command failed on a host, else 0."""
    if any(r.unreachable for r in results):
        return ExitCode.INFRA
    if any(r.failure for r in results):
        return ExitCode.FAILED
    return ExitCode.OK
