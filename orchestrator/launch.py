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
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from orchestrator import remote, telemetry
from orchestrator.errors import ExitCode, InfraError, one_line
from orchestrator.failures import STOPPED_BY_DISTRUN, Failure, FailureKind, failed_summary, root_cause
from orchestrator.group import Group, parallel
from orchestrator.interrupts import on_signals
from orchestrator.logs import LogSink
from orchestrator.plan import DEFAULT_PORT, HostFacts, HostPlan, LaunchPlan, build_plan, choose_master_addr
from orchestrator.spec.model import Inventory, JobSpec, NodeSpec
from orchestrator.store import JobDir, JobRecord, JobState, Store
from orchestrator.transport import RemoteProcess, Transport

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


# ---------------------------------------------------------------- preparing


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


def gather_facts(group: Group, master: NodeSpec, port: int | None, route_to: str) -> dict[str, dict[str, Any]]:
    """Probe every host at once; the master also checks the rendezvous port.

    Raises:
        GroupError: a host's probe failed (each failing host named).
    """
    def options(t: Transport) -> dict[str, Any]:
        opts: dict[str, Any] = {"route_to": route_to}
        if t.name == master.name:
            opts.update({"port_exact": port} if port else {"port_from": auto_port_start()})
        return opts

    return group.run(lambda t: probe_facts(t, options(t))).check()


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
    """A plan, the open connections to its hosts, and what each host's probe found."""

    plan: LaunchPlan
    group: Group
    facts: dict[str, dict[str, Any]]


def prepare(job: JobSpec, inventory: Inventory, group: Group, *, job_id: str,
            extra_args: list[str], backend: str = "ssh") -> Prepared:
    """Connect to the group's hosts, probe them, and build the plan.

    Args:
        group: The selected hosts; the caller closes it.

    Raises:
        GroupError: a host is unreachable or its probe failed.
        InfraError: the port is busy.
        UsageError: the plan cannot be built from these inputs.
    """
    nodes = [t.node for t in group.transports.values()]
    master = master_of(inventory, nodes)
    group.connect()
    peer = group[master.name].peer_address()
    facts = gather_facts(group, master, job.rendezvous.port, peer)
    master_facts = HostFacts.from_probe(master.name, facts[master.name])
    addr = choose_master_addr(master, master_facts, peer, len(nodes))
    port = master_port(master, facts[master.name], job.rendezvous.port, addr)
    plan = build_plan(
        job, nodes, {k: HostFacts.from_probe(k, v) for k, v in facts.items()},
        job_id=job_id, inventory_path=_absolute(inventory.path), master=master, master_addr=addr,
        master_port=port, controller_cwd=os.getcwd(), controller_env=dict(os.environ),
        extra_args=extra_args, backend=backend,
    )
    return Prepared(plan, group, facts)


def master_of(inventory: Inventory, nodes: list[NodeSpec]) -> NodeSpec:
    """The inventory's `master` when selected, else the first selected node."""
    return next((n for n in nodes if n.name == inventory.master), nodes[0])


def _absolute(path: str) -> str:
    """A file path made absolute so the record reloads it from anywhere; `<built-in>` as is."""
    return path if path.startswith("<") else os.path.abspath(path)


# ---------------------------------------------------------------- running


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
    exit_time: float | None = None  # when the exit event arrived (time.time())
    stop_sent: bool = False  # the controller asked this host to stop (before or after its exit)
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
            self.exit_time = time.time()
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

    def last_lines(self, rank: int | None) -> tuple[str, ...]:
        """The last SUMMARY_LINES lines of a rank of this host, else of the host itself."""
        if rank is not None and rank in self.sink.rank_tail:
            return tuple(list(self.sink.rank_tail[rank])[-SUMMARY_LINES:])
        return tuple(list(self.sink.node_tail.get(self.node, []))[-SUMMARY_LINES:])

    def failure(self, lost_after: float) -> Failure | None:
        """This host's failure as seen now: a non-zero exit, a closed channel, or silence; else None."""
        if self.exited.is_set():
            if not self.exit_rc:
                return None
            rc = self.root_exit or self.exit_rc
            return Failure.from_returncode(self.node, rc, rank=self.root_rank, reason=self.exit_error or "",
                                           address=self.plan.host, last_lines=self.last_lines(self.root_rank),
                                           time=self.exit_time or time.time())
        if self.channel_closed():
            return self.lost("connection to the host closed")
        if time.monotonic() - self.last_seen > lost_after:
            return self.lost(f"host lost: nothing heard for {lost_after:g} s (network cut or host down)")
        return None

    def lost(self, reason: str, kind: FailureKind = FailureKind.LOST) -> Failure:
        """A failure of this host that it did not report itself."""
        return Failure(self.node, kind, reason=reason, address=self.plan.host, last_lines=self.last_lines(None))

    def end(self) -> str:
        """How the host ended, for the summary's `Other hosts` line."""
        if self.stop_sent and self.exited.is_set():
            return STOPPED_BY_DISTRUN
        if self.exit_rc is None:
            return "no exit status"
        if self.exit_rc < 0:
            return Failure.from_returncode(self.node, self.exit_rc).describe()
        return f"exit code {self.exit_rc}"


class Launcher:
    """Runs a plan to its end and returns the exit code."""

    def __init__(self, prepared: Prepared, store: Store, record: JobRecord, terminal: TextIO | None,
                 colour: bool = False, live: bool = False) -> None:
        self.plan = prepared.plan
        self.group = prepared.group
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
        self.hosts = [HostRun(h, self.group.transports.get(h.node), self.sink, self._on_telemetry,
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

    def _on_signal(self, signum: int) -> None:
        self.interrupted = signum

    def run(self) -> int:
        """Start every host, follow the job to its end, stop what is left; the exit code."""
        try:
            with on_signals(self._on_signal):
                self.monitor.start()
                return self._run()
        finally:
            self.monitor.stop()
            self.sink.close()
            self.telemetry_file.close()

    def _run(self) -> int:
        started = parallel(self.hosts, lambda h: h.start(self.plan), key=lambda h: h.node)
        self.store.update(self.plan.job_id, state=JobState.RUNNING)
        failed = [self._host(node).lost(one_line(exc), FailureKind.INFRA) for node, exc in started.failed.items()]
        if not failed:
            failed = self._monitor()
        if self.interrupted is not None:
            return self._finish_interrupted()
        if failed:
            return self._finish_failed(failed)
        return self._finish_succeeded()

    def _host(self, node: str) -> HostRun:
        return next(h for h in self.hosts if h.node == node)

    def _monitor(self) -> list[Failure]:
        """Heartbeat every host and watch for the first failure, or the end of all.

        Returns:
            The failures seen (the first and those that followed it within SETTLE seconds),
            in host order; [] when every host ended well or distrun was interrupted.
        """
        next_hb = 0.0
        lost_after = self.plan.heartbeat_timeout
        while self.interrupted is None:
            now = time.monotonic()
            if now >= next_hb:
                for host in self.hosts:
                    host.send({"op": "hb"})
                next_hb = now + HEARTBEAT_EVERY
            failed = self._failures(lost_after)
            if failed:
                return self._settle(failed)
            if all(h.exited.is_set() for h in self.hosts):
                return []
            self.wake.wait(0.05)
            self.wake.clear()
        return []

    def _failures(self, lost_after: float) -> list[Failure]:
        """Every host's failure as seen now, in host order."""
        return [f for f in (h.failure(lost_after) for h in self.hosts) if f is not None]

    def _settle(self, first: list[Failure]) -> list[Failure]:
        """Wait briefly for a failure's echoes on other hosts, so that the root cause is chosen
        among all of them (a lost host has no echoes to wait for: they came before it)."""
        seen = {f.host: f for f in first}
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline and first[0].kind is not FailureKind.LOST:
            for failure in self._failures(self.plan.heartbeat_timeout):
                seen.setdefault(failure.host, failure)
            time.sleep(0.05)
        return [seen[h.node] for h in self.hosts if h.node in seen]

    def _stop_all(self, reason: str) -> None:
        live = [h for h in self.hosts if not h.exited.is_set()]
        for host in live:
            self.sink.note(host.node, f"stopping ({reason})")
            host.stop_sent = True
            host.send({"op": "stop"})
        deadline = time.monotonic() + self.plan.stop_grace + EXIT_WAIT
        for host in live:
            host.exited.wait(max(0.0, deadline - time.monotonic()))
        for host in live:
            if host.proc is not None:
                host.proc.close_stdin()

    def _finish(self, state: JobState, code: int, detail: str, failures: list[Failure] | None = None) -> int:
        self.sink.flush()
        self.monitor.stop()
        detail = "\n".join([detail, *telemetry.summary_lines(self.record.alerts)])
        restarts = max((h.restarts for h in self.hosts), default=0)
        self.store.end(self.plan.job_id, state, code, detail, restarts=restarts,
                       failures=[f.to_dict() for f in failures or []])
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

    def _finish_failed(self, failures: list[Failure]) -> int:
        """Stop every host, then record and show the root cause and how each other host ended."""
        root = root_cause(failures)
        self._stop_all(f"{root.host} failed")
        # Lines that arrived while the others were stopped belong to the root cause's story too.
        root = replace(root, last_lines=self._host(root.host).last_lines(root.rank) or root.last_lines)
        own = {f.host: f for f in failures}
        others = {h.node: own[h.node].describe() if h.node in own else h.end()
                  for h in self.hosts if h.node != root.host}
        ordered = [root, *(f for f in failures if f.host != root.host)]
        return self._finish(JobState.FAILED, int(ExitCode.FAILED), failed_summary(self.plan.job_id, root, others),
                            ordered)

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
