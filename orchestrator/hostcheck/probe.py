"""Driving the shipped probe (`orchestrator.remote.probe`) on many hosts at once.

A probe round runs the probe on every host of a group: the master's probe listens on the
rendezvous port and reports its interfaces at once; the controller then chooses the master's
address and tells every other host's probe to connect to it, resolve its names and find the
interface whose route reaches it. Doctor runs a `full` round; a launch runs a fast one, once,
and plans and preflights from its facts. In both, each host's probe finds torch as the job
would import it (`import_options`): the torch a check or the preflight names is the job's.

The master listens until every other host has tried. Each host is told where to connect as soon
as its probe runs and the master listens, and has PROBE_TIMEOUT from then to report: the wait
grows with the fan-out, so hosts reached last in a large one get the same time as the first. A
host that reports only after the master stopped listening, without having connected, could not
try: its `connect` is marked `skipped` (doctor shows it as skipped, never as failed).
"""

from __future__ import annotations

import json
import math
import posixpath
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import util
from typing import Any

from orchestrator import remote
from orchestrator.console.terminal import ProgressCounter
from orchestrator.errors import InfraError, UsageError, one_line
from orchestrator.facts import Connect, HostFacts
from orchestrator.fanout.group import Group, GroupResult, parallel
from orchestrator.plan import DEFAULT_PORT, choose_master_addr
from orchestrator.spec.model import JobSpec, NodeSpec
from orchestrator.transport import RemoteProcess, Transport

PROBE_MODULES = ["output", "pyspy", "gpu", "pyenv", "probe"]  # what the probe runs, dependencies first
PROBE_TIMEOUT = 60.0  # for the master to listen; for another host to report once told where to connect
BACKSTOP_PER_HOST = 0.5  # seconds a round may take per host before probes stop waiting on their own
LATE = "the master stopped listening before this host's probe ran"
POLL = 0.01
EXIT_GRACE = 5.0
EVENT = "\x1e"


@dataclass
class ProbeResult:
    """What became of one host: its facts, or why there are none."""

    node: str
    facts: HostFacts | None = None
    error: str | None = None
    unreachable: bool = False  # SSH connection or authentication failed (else: the probe failed)
    exception: Exception | None = field(default=None, repr=False, compare=False)


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def pynvml_source() -> str | None:
    """The source of this controller's nvidia-ml-py `pynvml` module, to ship to hosts without it."""
    spec = util.find_spec("pynvml")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as fh:
        return fh.read()


class ProbeRun:
    """One host's probe as the controller runs it: started, talked to, its facts collected."""

    def __init__(self, transport: Transport, options: dict[str, Any]) -> None:
        self.transport = transport
        self.options = options
        self.proc: RemoteProcess | None = None
        self.listening: dict[str, Any] | None = None
        self.facts: dict[str, Any] | None = None
        self.stderr: list[str] = []
        self.told_at: float | None = None  # when told where to connect (time.monotonic)
        self.facts_at: float | None = None  # when the facts arrived
        self._heard = threading.Event()

    @property
    def name(self) -> str:
        return self.transport.name

    def start(self) -> None:
        """Start the probe on the (connected) host and send it its options.

        Raises:
            InfraError: the command could not be started.
        """
        payload = remote.bundle("probe", PROBE_MODULES)
        self.proc = self.transport.start(remote.bootstrap_argv(self.transport.node.python, payload, "distrun-probe"))
        self.proc.stream(self._on_stdout, self.stderr.append)
        self.proc.write(payload + _line(self.options))

    def send(self, message: dict[str, Any]) -> None:
        if self.proc is not None:
            self.proc.write(_line(message))

    def tell(self, message: dict[str, Any]) -> None:
        """Send the `connect_to` message; this host's time to report starts now."""
        self.told_at = time.monotonic()
        self.send(message)

    def time_left(self) -> float:
        """Seconds left of this host's PROBE_TIMEOUT to report, counted from when it was told."""
        told = self.told_at if self.told_at is not None else time.monotonic()
        return max(0.0, told + PROBE_TIMEOUT - time.monotonic())

    def _on_stdout(self, line: str) -> None:
        try:
            data = json.loads(line.removeprefix(EVENT))
        except ValueError:
            return  # a login script's chatter, not the probe
        if not isinstance(data, dict):
            return
        if line.startswith(EVENT):
            self._on_event(data)
            return
        if isinstance(data.get("clock"), (int, float)):
            data["clock_skew"] = data["clock"] - time.time()
        self.facts = data
        self.facts_at = time.monotonic()
        self._heard.set()

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("ev") == "listening":
            self.listening = event
            self._heard.set()
        elif event.get("ev") == "need":
            self.send({"module": event.get("module"), "source": pynvml_source()})

    def _wait_heard(self, timeout: float) -> None:
        """Until a line the controller waits for arrives, the probe exits, or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not self._heard.wait(POLL) and time.monotonic() < deadline:
            if self.proc is None or self.proc.wait(0) is not None:
                return

    def wait_listening(self, timeout: float) -> dict[str, Any] | None:
        """The master's `listening` event, or None when the probe ended or timed out first."""
        self._wait_heard(timeout)
        self._heard.clear()
        return self.listening

    def wait_facts(self, timeout: float) -> None:
        """Until the facts arrive, the probe exits, or `timeout` passes."""
        if self.facts is None:
            self._wait_heard(timeout)

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for the facts, then for the probe to exit.

        Raises:
            InfraError: no facts came: the probe failed or timed out.
        """
        if self.proc is None:
            raise InfraError(f"{self.name}: probe not started")
        self.wait_facts(timeout)
        self.proc.close_stdin()
        rc = self.proc.wait(EXIT_GRACE)
        if rc is None:
            self.proc.terminate()
        if self.facts is not None:
            return self.facts
        last = (self.stderr or [f"no output (exit code {rc})" if rc is not None else "timed out"])[-1]
        raise InfraError(f"{self.name}: probe failed using python '{self.transport.node.python}': {last}")


class ConnectRelay:
    """Tells each other host's probe where to connect as soon as it runs and the master listens,
    so that a host reached early does not wait for the last one of a large fan-out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._message: dict[str, Any] | None = None
        self._waiting: list[ProbeRun] = []

    def started(self, run: ProbeRun) -> None:
        """`run`'s probe runs: tell it now if the master's address is known, else when it is."""
        with self._lock:
            message = self._message
            if message is None:
                self._waiting.append(run)
                return
        run.tell(message)

    def announce(self, message: dict[str, Any]) -> None:
        """Tell every host started so far, and each one started later; only the first call counts."""
        with self._lock:
            if self._message is not None:
                return
            self._message, waiting, self._waiting = message, self._waiting, []
        for run in waiting:
            run.tell(message)


@dataclass
class Round:
    """A probe on every host, the master listening while the others connect."""

    results: dict[str, ProbeResult]
    master_addr: str | None = None
    master_addr_error: str | None = None
    master_hostname: str | None = None

    def facts(self) -> dict[str, HostFacts]:
        """The facts of every host that has them, in host order."""
        return {name: r.facts for name, r in self.results.items() if r.facts is not None}

    def check(self) -> dict[str, HostFacts]:
        """Every host's facts, when every host gave them.

        Raises:
            GroupError: some host could not be reached or probed (each one named).
        """
        failed: GroupResult[HostFacts] = GroupResult(
            {name: r.facts if r.facts is not None else r.exception or InfraError(f"{name}: {r.error}")
             for name, r in self.results.items()})
        failed.unreached = frozenset(name for name, r in self.results.items() if r.unreachable)
        return failed.check()


def import_options(nodes: Sequence[NodeSpec], job: JobSpec | None, workdir: str) -> dict[str, dict[str, Any]]:
    """Each node's probe options `import_from` (find torch as the job would import it) and, for
    a job, `entry` (look for its script or module the same way).

    That is the node's python with the directory its workers put first on sys.path (the
    script's own directory; the workdir for a `module:` job, or without a job), and the
    inventory's env with the job's over it (as the plan sets them; secrets stay out: they do not
    move an import). torchrun itself runs with safe paths and searches neither. A relative
    script is looked for in the workdir; a job with `sync: true` gets its workdir only after
    the probe, so its entry is not looked for unless the sync does not bring it (`brought_by_sync`).

    Args:
        nodes: The nodes probed.
        job: The job, if any (doctor may run without one).
        workdir: The directory the job runs in on every host.

    Returns:
        {node name: {"import_from": {...}, "entry": {...}}}, as `probe_round` takes per host.
    """
    job_env = job.env if job else {}
    first = posixpath.dirname(posixpath.join(workdir, job.script)) if job and job.script else workdir
    entry = ({} if job is None or brought_by_sync(job) else
             {"entry": {"module": job.module} if job.module else {"script": job.script, "cwd": workdir}})
    return {n.name: {"import_from": {"python": n.python, "cwd": first, "env": {**n.env, **job_env}}, **entry}
            for n in nodes}


def brought_by_sync(job: JobSpec) -> bool:
    """Whether `sync: true` brings the job's entry to the hosts: a module, or a script under the
    current directory (the one synced, where the JobSpec keeps it relative); an absolute script
    lies outside and must already be on the hosts at that path."""
    return job.sync and not (job.script and posixpath.isabs(job.script))


def probe_round(group: Group, master: NodeSpec, base: dict[str, Any], port: int | None,
                master_addr: str | None, port_from: int = DEFAULT_PORT, resolve: bool = True,
                per_host: Mapping[str, dict[str, Any]] | None = None, progress: ProgressCounter | None = None) -> Round:
    """Run the probe on every host at once; the master listens until each other host has tried
    to connect to it (or its probe ended, or PROBE_TIMEOUT passed since it was told where to).

    Args:
        group: Every selected node; each host is connected first where it is not yet.
        master: The rendezvous host, one of the group's.
        base: Options for every host's probe (e.g. {"full": True}).
        port: The rendezvous port to listen on; None = the first free one from `port_from`.
        master_addr: The address the others connect to; None = chosen as launch would.
        port_from: Where the search for a free port starts when `port` is None.
        resolve: Have the other hosts look up the master's address and host name (doctor's
            master-resolves check; a launch skips it, as a slow DNS would slow every launch).
        per_host: More options for some hosts' probes, by node name (`import_options`).
        progress: Counts the hosts whose probe finished (`probed 41/64` on a terminal).

    Returns:
        Every host's result (facts or error), in the group's order, and the master's address as used;
        a host that could not try has its `connect.skipped` set.
    """
    own = per_host or {}
    runs = {name: ProbeRun(t, _options(name == master.name, {**base, **own.get(name, {})}, port, port_from,
                                       len(group)))
            for name, t in group.transports.items()}
    outcome = Round({})
    started = _start_all(group, master, runs, outcome, master_addr, resolve)
    results = {name: ProbeResult(name, error=one_line(exc), unreachable=name in started.unreached, exception=exc)
               for name, exc in started.failed.items()}
    live = {name: run for name, run in runs.items() if name not in results}
    master_run = live.pop(master.name, None)
    for run in live.values():
        run.wait_facts(run.time_left())
    closed_at = _stop_listening(master_run)
    if master_run is not None:
        live[master.name] = master_run
    for name, value in _finish_all(live.values(), progress).items():
        results[name] = ProbeResult(name, error=one_line(value), exception=value) if isinstance(value, Exception) \
            else ProbeResult(name, facts=_facts(runs[name], value, closed_at if name != master.name else math.inf))
    outcome.results = {name: results[name] for name in group.names}
    return outcome


def _start_all(group: Group, master: NodeSpec, runs: Mapping[str, ProbeRun], outcome: Round,
               master_addr: str | None, resolve: bool) -> GroupResult[None]:
    """Start every host's probe, the master's first; tell each other host where to connect as soon
    as it runs and the master listens (`outcome` gets the master's address and host name)."""
    relay = ConnectRelay()

    def start(transport: Transport) -> None:
        run = runs[transport.name]
        if transport.name != master.name:
            run.start()
            relay.started(run)
            return
        listening = None
        try:
            run.start()
            listening = run.wait_listening(PROBE_TIMEOUT)
            if listening is not None:
                outcome.master_hostname = listening.get("hostname")
                outcome.master_addr, outcome.master_addr_error = _master_addr(
                    master, listening, transport, len(group), master_addr)
        finally:
            relay.announce(_connect_message(listening, outcome, resolve))

    # The master first: its pool thread starts at once, however many hosts there are.
    started = group.run(start, only=[master.name, *(n for n in group.names if n != master.name)])
    relay.announce(_connect_message(None, outcome, resolve))  # the master was not reached: nothing to connect to
    return started


def _finish_all(runs: Iterable[ProbeRun], progress: ProgressCounter | None) -> GroupResult[dict[str, Any]]:
    """Every probe's facts (or why none came), once each has exited."""
    def finish(run: ProbeRun) -> dict[str, Any]:
        try:
            return run.finish(PROBE_TIMEOUT)
        finally:
            if progress is not None:
                progress.tick(run.name)

    finished = parallel(runs, finish, key=lambda r: r.name)
    if progress is not None:
        progress.clear()
    return finished


def round_backstop(hosts: int) -> float:
    """How long a probe waits on its own in a round of `hosts` (the master listening, another host
    for where to connect) should the controller never tell it: well past the controller's own
    wait, which grows with the fan-out. Ending the controller (stdin closes) ends them at once."""
    return 2 * (PROBE_TIMEOUT + BACKSTOP_PER_HOST * hosts)


def _stop_listening(master_run: ProbeRun | None) -> float:
    """Tell the master to stop listening; return when it stopped at the latest (time.monotonic).
    Its facts come only after it stopped: facts already in mean its backstop ended it earlier."""
    stopped = time.monotonic()
    if master_run is None:
        return stopped
    master_run.send({"stop": True})
    return min(stopped, master_run.facts_at if master_run.facts_at is not None else math.inf)


def _facts(run: ProbeRun, data: dict[str, Any], closed_at: float) -> HostFacts:
    """A host's facts; a failed or missing connection reported after the master stopped
    listening (`closed_at`) is marked as not tried, not failed."""
    facts = HostFacts.from_probe(run.name, data)
    connect = facts.connect
    late = run.facts_at is None or run.facts_at > closed_at
    if not late or (connect is not None and connect.ok):
        return facts
    return replace(facts, connect=replace(connect or Connect(), skipped=LATE))


def _options(is_master: bool, base: dict[str, Any], port: int | None, port_from: int, hosts: int) -> dict[str, Any]:
    backstop = round_backstop(hosts)
    if not is_master:
        return {**base, "connect_later": True, "connect_wait": backstop}
    return {**base, "listen_seconds": backstop, **({"port_exact": port} if port else {"port_from": port_from})}


def _master_addr(master: NodeSpec, listening: dict[str, Any], transport: Transport, nnodes: int,
                 given: str | None) -> tuple[str | None, str | None]:
    """(address, None), or (None, why) when only a loopback address is known for several hosts."""
    if given:
        return given, None
    facts = HostFacts.from_probe(master.name, {"interfaces": listening.get("interfaces") or {}})
    try:
        return choose_master_addr(master, facts, transport.peer_address(), nnodes), None
    except UsageError as exc:
        return None, str(exc)


def _connect_message(listening: dict[str, Any] | None, outcome: Round, resolve: bool) -> dict[str, Any]:
    """What the other hosts' probes are told: where to connect (None: nothing listens), what to
    resolve, and the address whose route names the interface they would use."""
    names = [n for n in (outcome.master_addr, outcome.master_hostname) if n and resolve]
    target = None
    if listening is not None and listening.get("ok") and outcome.master_addr:
        target = [outcome.master_addr, listening["port"]]
    return {"connect_to": target, "resolve": names, "route_to": outcome.master_addr}
