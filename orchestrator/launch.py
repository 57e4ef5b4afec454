"""Executes a plan: connect, probe, start every host's supervisor, stream, fail fast, tear down.

The first failure observed (a host's torchrun exiting non-zero, or a host going silent)
stops every other host; the summary leads with that root cause, as torch elastic's does.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from orchestrator import remote, telemetry
from orchestrator.errors import ExitCode, InfraError
from orchestrator.logs import LogSink
from orchestrator.parallel import failures, for_each
from orchestrator.plan import DEFAULT_PORT, HostFacts, HostPlan, LaunchPlan, build_plan, choose_master_addr
from orchestrator.spec.model import Inventory, JobSpec, NodeSpec
from orchestrator.store import JobDir, JobRecord, JobState, Store
from orchestrator.transport import RemoteProcess, Transport, transport_for

PROBE_TIMEOUT = 30.0
AUTO_PORT_WINDOW = 1000
HEARTBEAT_EVERY = 1.0
SETTLE = 1.5  # after a first failure, how long to wait for its peers' failures before blaming one
EXIT_WAIT = 10.0  # beyond the stop grace, how long stopped hosts get to report their exit
SUMMARY_LINES = 20
SUPERVISOR_MODULES = ["sampler", "supervisor"]  # what a host's supervisor runs, dependencies first
ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
# torchrun prints this (at ERROR, unlike its INFO "will restart") once per failed attempt.
FAILED_ATTEMPT = re.compile(r"failed \(exitcode: -?\d+\) local_rank: \d+")
COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|DistBackendError|Broken pipe|"
    r"SIGTERM|Signal 15|heartbeat silent|stopped by the controller"
)


# ---------------------------------------------------------------- preparing


def connect_all(nodes: list[NodeSpec]) -> dict[str, Transport]:
    """Open a connection to every node at once.

    Raises:
        InfraError: one or more hosts could not be reached; the message names each.
    """
    transports = {n.name: transport_for(n) for n in nodes}
    results = for_each(transports.values(), lambda t: t.connect(), key=lambda t: t.name)
    failed = failures(results)
    if failed:
        close_all(transports)
        raise InfraError("; ".join(_one_line(e) for e in failed.values()))
    return transports


def close_all(transports: dict[str, Transport]) -> None:
    for_each(transports.values(), lambda t: t.close(), key=lambda t: t.name)


def _one_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def run_remote(transport: Transport, main: str, modules: list[str], stdin_line: dict[str, Any] | bytes,
               *tags: str, timeout: float = PROBE_TIMEOUT) -> str:
    """Ship remote modules to a host, run `main`, return its stdout.

    `stdin_line` follows the bundle on stdin: a dict is sent as one JSON line, bytes as they are.

    Raises:
        InfraError: the program failed on the host.
    """
    payload = remote.bundle(main, modules)
    argv = remote.bootstrap_argv(transport.node.python, payload, *tags)
    tail = stdin_line if isinstance(stdin_line, bytes) else json.dumps(stdin_line).encode() + b"\n"
    result = transport.run(argv, stdin=payload + tail, timeout=timeout)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise InfraError(
            f"{transport.name}: {main} failed with exit code {result.returncode} using python "
            f"'{transport.node.python}': {last}"
        )
    return result.stdout


def probe_facts(transport: Transport, options: dict[str, Any]) -> dict[str, Any]:
    out = run_remote(transport, "probe", ["probe"], options, "distrun-probe")
    return json.loads(out.strip().splitlines()[-1])


def auto_port_start() -> int:
    """Where the search for a free port starts: a random point of a window above 29500, so
    two jobs launched at the same moment on the same master do not both pick 29500."""
    return DEFAULT_PORT + random.randrange(AUTO_PORT_WINDOW)


def gather_facts(transports: dict[str, Transport], master: NodeSpec, port: int | None,
                 route_to: str) -> dict[str, dict[str, Any]]:
    """Probe every host at once; the master also checks the rendezvous port.

    Raises:
        InfraError: a host's probe failed (each failing host named).
    """
    def options(t: Transport) -> dict[str, Any]:
        opts: dict[str, Any] = {"route_to": route_to}
        if t.name == master.name:
            opts.update({"port_exact": port} if port else {"port_from": auto_port_start()})
        return opts

    results = for_each(transports.values(), lambda t: probe_facts(t, options(t)), key=lambda t: t.name)
    failed = failures(results)
    if failed:
        raise InfraError("; ".join(_one_line(e) for e in failed.values()))
    return {k: v for k, v in results.items() if not isinstance(v, Exception)}


def master_port(master: NodeSpec, facts: dict[str, Any], port: int | None, addr: str) -> int:
    """The rendezvous port: the job's, verified free, or the first free one from 29500.

    Raises:
        InfraError: the job's port is busy on the master, or no port near 29500 is free.
    """
    if port is not None:
        if not facts.get("port_exact_free"):
            raise InfraError(
                f"{master.name}: rendezvous port {port} is already in use on the master ({addr}) "
                "(stop what holds it, or set `rendezvous.port: auto`)"
            )
        return port
    if not facts.get("free_port"):
        raise InfraError(f"{master.name}: no free TCP port from {DEFAULT_PORT} on the master ({addr})")
    return int(facts["free_port"])


@dataclass
class Prepared:
    plan: LaunchPlan
    transports: dict[str, Transport]
    facts: dict[str, dict[str, Any]]


def prepare(job: JobSpec, inventory: Inventory, nodes: list[NodeSpec], *, job_id: str,
            extra_args: list[str], backend: str = "ssh") -> Prepared:
    """Connect to the selected hosts, probe them, and build the plan.

    Raises:
        InfraError: a host is unreachable, its probe failed, or the port is busy.
        UsageError: the plan cannot be built from these inputs.
    """
    master = next((n for n in nodes if n.name == inventory.master), nodes[0])
    transports = connect_all(nodes)
    try:
        peer = transports[master.name].peer_address()
        facts = gather_facts(transports, master, job.rendezvous.port, peer)
        master_facts = HostFacts.from_probe(master.name, facts[master.name])
        addr = choose_master_addr(master, master_facts, peer, len(nodes))
        port = master_port(master, facts[master.name], job.rendezvous.port, addr)
        plan = build_plan(
            job, nodes, {k: HostFacts.from_probe(k, v) for k, v in facts.items()},
            job_id=job_id, inventory_path=_absolute(inventory.path), master=master, master_addr=addr,
            master_port=port, controller_cwd=os.getcwd(), controller_env=dict(os.environ),
            extra_args=extra_args, backend=backend,
        )
    except BaseException:
        close_all(transports)
        raise
    return Prepared(plan, transports, facts)


def _absolute(path: str) -> str:
    """A file path made absolute so the record reloads it from anywhere; `<built-in>` as is."""
    return path if path.startswith("<") else os.path.abspath(path)


# ---------------------------------------------------------------- running


@dataclass
class Failure:
    node: str
    observed: float
    reason: str
    rc: int | None = None
    rank: int | None = None
    lost: bool = False


def _exit_text(rc: int | None) -> str:
    if rc is None:
        return "no exit status"
    if rc < 0:
        return f"killed by signal {signal.Signals(-rc).name}"
    return f"exit code {rc}"


@dataclass
class HostRun:
    """One host's supervisor as the controller sees it."""

    plan: HostPlan
    transport: Transport | None  # None where a scheduler starts the supervisor (Slurm)
    sink: LogSink
    on_telemetry: Any = None
    extra_modules: dict[str, str] = field(default_factory=dict)
    proc: RemoteProcess | None = None
    last_seen: float = field(default_factory=time.monotonic)
    exit_rc: int | None = None
    exit_error: str | None = None
    failed_attempts: int = 0
    exited: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event | None = None  # set on exit, so the launcher need not wait for its next poll
    root_rank: int | None = None
    root_exit: int | None = None
    _in_root_cause: bool = False

    @property
    def node(self) -> str:
        return self.plan.node

    def start(self, launch_plan: LaunchPlan) -> None:
        if self.transport is None:
            raise InfraError(f"{self.node}: no transport to start its supervisor with")
        modules = SUPERVISOR_MODULES if launch_plan.telemetry_interval else ["supervisor"]
        payload = remote.bundle("supervisor", modules, self.extra_modules)
        argv = remote.bootstrap_argv(self.plan.python, payload, "distrun-supervisor", launch_plan.job_id, self.node)
        config = {
            "job_id": launch_plan.job_id, "node": self.node, "argv": self.plan.argv,
            "env": launch_plan.host_env(self.plan), "cwd": self.plan.workdir,
            "heartbeat_timeout": launch_plan.heartbeat_timeout, "stop_grace": launch_plan.stop_grace,
            "telemetry_interval": launch_plan.telemetry_interval,
        }
        self.proc = self.transport.start(argv)
        self.proc.stream(self.on_stdout, self.on_stderr)
        self.last_seen = time.monotonic()
        self.proc.write(payload + json.dumps(config).encode() + b"\n")

    def send(self, message: dict[str, Any]) -> None:
        if self.proc is not None:
            self.proc.write(json.dumps(message).encode() + b"\n")

    def on_stdout(self, line: str) -> None:
        self.last_seen = time.monotonic()
        if line.startswith("\x1e"):
            self.on_event(json.loads(line[1:]))
            return
        self._watch(line)
        self.sink.line(self.node, line)

    def on_stderr(self, line: str) -> None:
        self.sink.note(self.node, f"supervisor: {line}")

    def _watch(self, line: str) -> None:
        """Pick torchrun's own root-cause block and restarts out of its output."""
        if "Root Cause (first observed failure)" in line:
            self._in_root_cause = True
        elif self._in_root_cause and (m := ROOT_RANK.match(line)):
            self.root_rank = int(m.group(1))
        elif self._in_root_cause and (m := ROOT_EXIT.match(line)):
            self.root_exit = int(m.group(1))
            self._in_root_cause = False
        elif FAILED_ATTEMPT.search(line):
            self.failed_attempts += 1

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "exit":
            self.exit_rc = int(event.get("rc", 1))
            self.exit_error = event.get("error")
            if self.exit_error:
                self.sink.note(self.node, self.exit_error)
            self.exited.set()
            if self.wake is not None:
                self.wake.set()
        elif kind == "note":
            self.sink.note(self.node, str(event.get("msg")))
        elif kind == "tel" and self.on_telemetry is not None:
            self.on_telemetry(self.node, event)

    @property
    def restarts(self) -> int:
        """Attempts torchrun restarted: its failed attempts, less the last if the host failed."""
        return max(0, self.failed_attempts - (1 if self.exit_rc else 0))

    def channel_closed(self) -> bool:
        return self.proc is not None and self.proc.wait(0) is not None and not self.exited.is_set()


class Launcher:
    """Runs a plan to its end and returns the exit code."""

    def __init__(self, prepared: Prepared, store: Store, record: JobRecord, terminal: TextIO | None,
                 colour: bool = False, live: bool = False) -> None:
        self.plan = prepared.plan
        self.transports = prepared.transports
        self.store = store
        self.record = record
        self.dir: JobDir = store.job_dir(self.plan.job_id)
        self.terminal = terminal
        self.monitor = telemetry.Monitor([h.node for h in self.plan.hosts], self.plan.telemetry_interval,
                                         self._on_alert, self._running, title=self.plan.job_id)
        self.sink = LogSink(self.dir, self.monitor.terminal(terminal, live), colour, on_metrics=self._on_metrics)
        self.telemetry_lock = threading.Lock()
        self.telemetry_file = open(self.dir.telemetry, "a", encoding="utf-8")  # noqa: SIM115 - closed in run()
        self.wake = threading.Event()
        self.hosts = [HostRun(h, self.transports.get(h.node), self.sink, self._on_telemetry,
                              telemetry.shipped_modules(prepared.facts.get(h.node)), wake=self.wake)
                      for h in self.plan.hosts]
        self.interrupted: int | None = None
        self.last_metrics: dict[str, Any] | None = None
        self.final_metrics: dict[str, Any] | None = None

    def _on_metrics(self, _line: Any, record: dict[str, Any]) -> None:
        self.monitor.metrics(record)
        self.last_metrics = record
        if record.get("final"):
            self.final_metrics = record

    def _on_telemetry(self, node: str, event: dict[str, Any]) -> None:
        sample = {k: v for k, v in event.items() if k != "ev"}
        sample.setdefault("node", node)
        with self.telemetry_lock:
            self.telemetry_file.write(json.dumps(sample) + "\n")
            self.telemetry_file.flush()
        self.monitor.sample(node, sample)

    def _on_alert(self, alert: telemetry.Alert) -> None:
        """An alert is a log line of its host and part of the job's record."""
        self.sink.note(alert.node, alert.line())
        with self.telemetry_lock:
            self.record.alerts.append(alert.record())
            alerts = list(self.record.alerts)
        self.store.update(self.plan.job_id, alerts=alerts)

    def _running(self, node: str) -> bool:
        return any(h.node == node and not h.exited.is_set() for h in self.hosts)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.interrupted = signum

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.monitor.start()
            return self._run()
        finally:
            self.monitor.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.sink.close()
            self.telemetry_file.close()
            close_all(self.transports)

    def _run(self) -> int:
        started = for_each(self.hosts, lambda h: h.start(self.plan), key=lambda h: h.node)
        start_failed = failures(started)
        self.store.update(self.plan.job_id, state=JobState.RUNNING)
        failure = None
        if start_failed:
            node, exc = next(iter(start_failed.items()))
            failure = Failure(node, time.monotonic(), _one_line(exc), lost=True)
        else:
            failure = self._monitor()
        if self.interrupted is not None:
            return self._finish_interrupted()
        if failure is not None:
            return self._finish_failed(failure)
        return self._finish_succeeded()

    def _monitor(self) -> Failure | None:
        """Heartbeat every host and watch for the first failure, or the end of all."""
        next_hb = 0.0
        lost_after = self.plan.heartbeat_timeout
        while self.interrupted is None:
            now = time.monotonic()
            if now >= next_hb:
                for host in self.hosts:
                    host.send({"op": "hb"})
                next_hb = now + HEARTBEAT_EVERY
            failed = self._failures(now, lost_after)
            if failed:
                return self._root_cause(failed)
            if all(h.exited.is_set() for h in self.hosts):
                return None
            self.wake.wait(0.05)
            self.wake.clear()
        return None

    def _failures(self, now: float, lost_after: float) -> list[Failure]:
        found = []
        for host in self.hosts:
            if host.exited.is_set():
                if host.exit_rc:
                    found.append(Failure(host.node, now, "exit", rc=host.root_exit or host.exit_rc,
                                         rank=host.root_rank))
            elif host.channel_closed():
                found.append(Failure(host.node, now, "connection to the host closed", lost=True))
            elif now - host.last_seen > lost_after:
                found.append(Failure(host.node, now, f"host lost: nothing heard for {lost_after:g} s "
                                     "(network cut or host down)", lost=True))
        return found

    def _root_cause(self, first: list[Failure]) -> Failure:
        """Wait briefly for the failure's echoes on other hosts, then blame the likeliest origin."""
        deadline = time.monotonic() + SETTLE
        seen = {f.node: f for f in first}
        while time.monotonic() < deadline and not first[0].lost:
            for failure in self._failures(time.monotonic(), self.plan.heartbeat_timeout):
                seen.setdefault(failure.node, failure)
            time.sleep(0.05)
        ordered = sorted(seen.values(), key=lambda f: (self._collateral(f), f.observed))
        return ordered[0]

    def _collateral(self, failure: Failure) -> bool:
        """True when a host failed only because another host's ranks went away."""
        if failure.lost:
            return False
        tail = self.sink.rank_tail.get(failure.rank, []) if failure.rank is not None else []
        return any(COLLATERAL.search(line) for line in list(tail)[-SUMMARY_LINES:])

    def _stop_all(self, reason: str) -> None:
        live = [h for h in self.hosts if not h.exited.is_set()]
        for host in live:
            self.sink.note(host.node, f"stopping ({reason})")
            host.send({"op": "stop"})
        deadline = time.monotonic() + self.plan.stop_grace + EXIT_WAIT
        for host in live:
            host.exited.wait(max(0.0, deadline - time.monotonic()))
        for host in live:
            if host.proc is not None:
                host.proc.close_stdin()

    def _finish(self, state: JobState, code: int, detail: str) -> int:
        self.sink.flush()
        self.monitor.stop()
        detail = "\n".join([detail, *telemetry.summary_lines(self.record.alerts)])
        restarts = max((h.restarts for h in self.hosts), default=0)
        self.store.update(self.plan.job_id, state=state, exit_code=code, ended=time.time(),
                          detail=detail, restarts=restarts)
        (self.dir.root / "summary.txt").write_text(detail + "\n", encoding="utf-8")
        self.sink.summary(detail)
        self._say(detail)
        return code

    def _say(self, text: str) -> None:
        out = self.terminal or sys.stderr
        out.write(text + "\n")
        out.flush()

    def _finish_interrupted(self) -> int:
        name = signal.Signals(self.interrupted or signal.SIGINT).name
        self._stop_all(f"distrun got {name}")
        code = ExitCode.INTERRUPTED if self.interrupted == signal.SIGINT else ExitCode.TERMINATED
        return self._finish(JobState.STOPPED, int(code), f"job {self.plan.job_id} stopped ({name}); "
                            f"every host's processes ended")

    def _finish_failed(self, failure: Failure) -> int:
        self._stop_all(f"{failure.node} failed")
        lines = [f"job {self.plan.job_id} FAILED", "Root Cause (first observed failure):",
                 f"  host: {failure.node} ({self._address(failure.node)})"]
        if failure.rank is not None:
            lines.append(f"  rank: {failure.rank}")
        lines.append(f"  {'reason' if failure.lost else 'exit'}: "
                     f"{failure.reason if failure.lost else _exit_text(failure.rc)}")
        tail = self._tail(failure)
        if tail:
            label = f"rank {failure.rank}" if failure.rank is not None else failure.node
            lines.append(f"  last {len(tail)} lines of {label}:")
            lines += [f"    {line}" for line in tail]
        others = [f"{h.node}: {_exit_text(h.exit_rc)}" for h in self.hosts if h.node != failure.node]
        if others:
            lines.append("Other hosts: " + ", ".join(others))
        return self._finish(JobState.FAILED, int(ExitCode.FAILED), "\n".join(lines))

    def _address(self, node: str) -> str:
        return next(h.host for h in self.plan.hosts if h.node == node)

    def _tail(self, failure: Failure) -> list[str]:
        if failure.rank is not None and failure.rank in self.sink.rank_tail:
            return list(self.sink.rank_tail[failure.rank])[-SUMMARY_LINES:]
        return list(self.sink.node_tail.get(failure.node, []))[-SUMMARY_LINES:]

    def _finish_succeeded(self) -> int:
        lines = [f"job {self.plan.job_id} succeeded: {self.plan.nnodes} host(s), world size {self.plan.world_size}"]
        metrics = self.final_metrics or self.last_metrics
        if metrics:
            rate = metrics.get("mean_samples_per_s", metrics.get("samples_per_s"))
            if rate is not None:
                lines.append(f"  throughput: {float(rate):.1f} samples/s (mean over steady-state steps)")
            if metrics.get("peak_mem_mb") is not None:
                lines.append(f"  peak memory: {float(metrics['peak_mem_mb']):.0f} MB per process")
        restarts = max((h.restarts for h in self.hosts), default=0)
        if restarts:
            lines.append(f"  restarts: {restarts}")
        return self._finish(JobState.SUCCEEDED, int(ExitCode.OK), "\n".join(lines))


def new_record(plan: LaunchPlan, backend: str) -> JobRecord:
    return JobRecord(
        id=plan.job_id, name=plan.job_name, spec_path=plan.spec_path, inventory=plan.inventory_path,
        hosts=[h.node for h in plan.hosts], master_addr=plan.master_addr, master_port=plan.master_port,
        backend=backend, state=JobState.PENDING, controller_pid=os.getpid(),
    )


def write_plan(job_dir: JobDir, prepared: Prepared) -> None:
    """plan.json (secrets masked) and facts.json (what each host's probe found)."""
    job_dir.create()
    job_dir.plan.write_text(json.dumps(prepared.plan.to_dict(), indent=2) + "\n", encoding="utf-8")
    job_dir.facts.write_text(json.dumps(prepared.facts, indent=2) + "\n", encoding="utf-8")
