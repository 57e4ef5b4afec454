"""The default backend: the inventory's hosts, reached over SSH (or this machine through the local transport).

distrun does everything itself: it probes every host, picks the rendezvous address and port,
ships the supervisor over each host's SSH channel (nothing is installed there), heartbeats it,
and stops it through the same channel. A host keeps its own copy of its lines, from which
`distrun logs --recover` rebuilds a job's files.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from orchestrator import remote, telemetry
from orchestrator.backends.base import Backend, LaunchContext, Settled, Stopped, Submitted
from orchestrator.backends.run import EXIT_WAIT, RunView
from orchestrator.console.terminal import ProgressCounter, show
from orchestrator.diagnose.failures import Failure, FailureKind
from orchestrator.errors import ExitCode, InfraError, UsageError, one_line
from orchestrator.facts import HostFacts
from orchestrator.fanout.group import Group, GroupError, GroupResult, parallel
from orchestrator.hostcheck.checks import flight_recorder_missing
from orchestrator.hostcheck.probe import import_options, probe_round
from orchestrator.liveness import signal_controller
from orchestrator.logs.format import note
from orchestrator.logs.recover import FetchedCopy, rebuild
from orchestrator.plan import DEFAULT_PORT, HostPlan, LaunchPlan, build_plan
from orchestrator.remote.config import SupervisorConfig
from orchestrator.spec import (
    Inventory,
    JobSpec,
    NodeSpec,
    default_inventory,
    load_inventory,
    resolve_inventory_path,
    select_with_spares,
)
from orchestrator.spec.model import DEFAULT_STOP_GRACE
from orchestrator.store import JobRecord, JobState
from orchestrator.transport import REMOTE_TIMEOUT, CommandResult, RemoteProcess, Transport, run_remote

STOP_WAIT = 30.0
CLEANUP_WAIT = 15.0  # beyond the stop grace, how long ending a job's processes on a host may take
AUTO_PORT_WINDOW = 1000
# What a host's supervisor runs, dependencies first: with the telemetry sampler, or without.
SUPERVISOR_MODULES = [*remote.SUPERVISOR_IMPORTS, "sampler", "supervisor"]
SUPERVISOR_ONLY = [*remote.SUPERVISOR_IMPORTS, "supervisor"]
STOP_MESSAGE = json.dumps({"op": "stop"}).encode() + b"\n"
T = TypeVar("T")


@dataclass(frozen=True)
class SupervisorChannel:
    """A host's supervisor as started over its transport (backends/run.py's Channel)."""

    proc: RemoteProcess
    transport: Transport

    def write(self, data: bytes) -> None:
        self.proc.write(data)

    def closed(self) -> bool:
        return self.proc.wait(0) is not None

    def link_up(self) -> bool:
        return self.transport.connected()

    def behind(self) -> bool:
        return self.proc.unread()


class SshBackend(Backend):
    """Hosts of an inventory reached over SSH; distrun starts, watches and stops everything itself."""

    NAME = "ssh"
    DESCRIPTION = "the inventory's hosts over SSH: distrun probes, starts, watches and stops them itself"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = Group([])
        self.facts: dict[str, HostFacts] = {}
        self.channels: dict[str, SupervisorChannel] = {}  # a launch's supervisors, by node

    def inventory(self, path: str | None) -> Inventory:
        """`path` (-i), else $DISTRUN_INVENTORY, else the built-in one (this machine)."""
        return resolve_inventory_path(path)

    def finish(self, run: RunView) -> list[str]:
        """The summary's line on the hosts whose torch serves no Flight Recorder, where the job has it on."""
        if not any("DISTRUN_WORKER_SOCKETS" in host.env for host in run.plan.hosts):
            return []
        return flight_recorder_missing({host.node: self.facts[host.node] for host in run.plan.hosts
                                        if host.node in self.facts})

    def release(self) -> None:
        self.group.close()

    # ---------------------------------------------------------------- a launch

    def prepare(self, ctx: LaunchContext) -> LaunchPlan:
        """Select the hosts and plan on them: probing each host, except for a dry run without --probe."""
        asked = ctx.asked
        inventory = self.inventory(asked.inventory)
        nodes, spares = select_with_spares(ctx.job, inventory, asked.selection, asked.nnodes, asked.guard)
        # Spares serve the controller's restarts only; without them the hosts beyond nnodes stay out.
        kept = tuple(node.name for node in spares) if ctx.job.restarts.max else ()
        if asked.dry_run and not asked.probe:
            return replace(self.plan_offline(ctx.job, inventory, nodes, ctx.job_id, asked.extra_args), spares=kept)
        return replace(self.plan_on(ctx.job, inventory, nodes, ctx.job_id, asked.extra_args), spares=kept)

    def replan(self, ctx: LaunchContext, previous: LaunchPlan, hosts: Sequence[str],
               spares: Sequence[str]) -> LaunchPlan:
        """Plan the next attempt on `hosts` (probing each again) with a fresh rendezvous port: with
        `port: auto`, the search starts past the previous attempt's port."""
        inventory = self.inventory(ctx.asked.inventory)
        nodes = [inventory.node(name) for name in hosts]
        port_from = None if ctx.job.rendezvous.port else previous.master_port + 1
        plan = self.plan_on(ctx.job, inventory, nodes, ctx.job_id, ctx.asked.extra_args, port_from=port_from,
                            attempt=previous.attempt + 1)
        return replace(plan, spares=tuple(spares))

    def plan_offline(self, job: JobSpec, inventory: Inventory, nodes: list[NodeSpec], job_id: str,
                     extra_args: Sequence[str] = ()) -> LaunchPlan:
        """The plan without reaching any host: what only the hosts' probe gives is marked unprobed
        (the master's address, a port picked free, processes per GPU, the interface)."""
        master = inventory.master_of(nodes)
        plan = build_plan(
            job, nodes, {}, job_id=job_id, inventory_path=_absolute(inventory.path), master=master,
            master_addr=master.host, master_port=job.rendezvous.port or DEFAULT_PORT, controller_cwd=os.getcwd(),
            controller_env=dict(os.environ), extra_args=list(extra_args), backend=self.NAME,
        )
        unprobed = ["master_addr"]
        unprobed += [] if job.rendezvous.port else ["master_port"]
        unprobed += [] if job.nproc_per_node else ["nproc"]
        unprobed += ["iface"] if len(nodes) > 1 and any(not n.iface for n in nodes) else []
        return replace(plan, unprobed=tuple(unprobed))

    def plan_on(self, job: JobSpec, inventory: Inventory, nodes: list[NodeSpec], job_id: str,
                extra_args: Sequence[str] = (), port_from: int | None = None, attempt: int = 1) -> LaunchPlan:
        """Reach the nodes, probe each once, and build the plan; the connections stay open for the launch.

        The one probe round also tests what the preflight checks: the master listens on the
        rendezvous port while every other host connects to it.

        Raises:
            GroupError: a host is unreachable or its probe failed (each one named).
            InfraError: the rendezvous port is busy on the master.
            UsageError: the plan cannot be built from these inputs (a master only reachable by loopback).
        """
        self.group.close()
        self.group = Group(nodes, progress=ProgressCounter(len(nodes), "connected"))
        master = inventory.master_of(nodes)
        # torch as the job will import it (the node's python, in the workdir, with the job's env),
        # so that the preflight compares the torch each host will really run.
        probed = probe_round(self.group, master, {}, job.rendezvous.port, None,
                             port_from=port_from or auto_port_start(), resolve=False,
                             per_host=import_options(nodes, job, job.workdir or os.getcwd()),
                             progress=ProgressCounter(len(nodes), "probed"))
        self.facts = probed.check()
        if probed.master_addr is None:
            raise UsageError(probed.master_addr_error or f"{master.name}: no address for the master")
        addr = probed.master_addr
        port = master_port(master, self.facts[master.name], job.rendezvous.port, addr)
        return build_plan(
            job, nodes, self.facts, job_id=job_id, inventory_path=_absolute(inventory.path), master=master,
            master_addr=addr, master_port=port, controller_cwd=os.getcwd(), controller_env=dict(os.environ),
            extra_args=list(extra_args), backend=self.NAME, attempt=attempt,
        )

    def preflight(self, ctx: LaunchContext, plan: LaunchPlan) -> None:
        """Python and torch alike on every host; the rendezvous port reachable from every other host
        (from the facts of the probe round that planned the job: no second probe)."""
        from orchestrator.hostcheck.preflight import launch_preflight

        launch_preflight(plan, {name: t.node for name, t in self.group.transports.items()}, self.facts, job=ctx.job)

    def stage(self, ctx: LaunchContext, plan: LaunchPlan) -> None:
        """With `sync: true`, bring every host's workdir up to date with this directory; then refuse
        a checkpoint_dir another user could write on any host (orchestrator/fanout/checkpoints.py)."""
        from orchestrator.fanout.checkpoints import check_checkpoint_dir

        if plan.sync:
            from orchestrator.fanout.sync import sync_workdirs

            for node, count in sync_workdirs(plan, self.group, Path.cwd()).items():
                show(note(node, f"workdir synced ({count} file(s) sent)"))
        check_checkpoint_dir(plan, self.group)

    def submit(self, ctx: LaunchContext, plan: LaunchPlan) -> Submitted:
        """Write plan.json and facts.json into the job's directory; the hosts start in `start`."""
        ctx.files.write_plan(plan.to_dict(), {n: f.raw for n, f in self.facts.items()})
        return Submitted()

    def start(self, run: RunView) -> list[Failure]:
        """Ship the supervisor to every host at once over its channel; a host that does not start fails."""
        self.channels = {}
        started = parallel(run.plan.hosts, lambda host: self._start_host(run, host), key=lambda host: host.node)
        return [run.events.lost(node, one_line(exc), FailureKind.INFRA) for node, exc in started.failed.items()]

    def _start_host(self, run: RunView, host: HostPlan) -> None:
        plan, events, node = run.plan, run.events, host.node
        modules = SUPERVISOR_MODULES if plan.telemetry_interval else SUPERVISOR_ONLY
        facts = self.facts.get(node)
        payload = remote.bundle("supervisor", modules, telemetry.shipped_modules(facts.gpus if facts else 0))
        argv = remote.bootstrap_argv(host.python, payload, "distrun-supervisor", plan.job_id, node)
        transport = self.group[node]
        channel = SupervisorChannel(transport.start(argv), transport)
        self.channels[node] = channel
        events.attach(node, channel)
        channel.proc.stream_bytes(lambda data: events.data(node, data), lambda line: events.stderr(node, line),
                                  lambda: events.end(node))
        channel.write(payload + plan_supervisor_config(plan, host).to_line())

    def stop(self, run: RunView, nodes: list[str]) -> None:
        """Tell each supervisor to stop and wait for the exits of those that can still report
        one (a lost host cannot: it ends the job itself when the heartbeat stops); end the job
        directly where a supervisor died on a host still reachable; close every stdin (a
        supervisor that never heard the stop ends the job when its stdin closes)."""
        channels = [self.channels[node] for node in nodes if node in self.channels]
        for channel in channels:
            channel.write(STOP_MESSAGE)
        run.await_exits(nodes, run.plan.stop_grace + EXIT_WAIT)
        self.end_orphans(run, run.orphaned(nodes))
        for channel in channels:
            channel.proc.close_stdin()

    def end_orphans(self, run: RunView, nodes: list[str]) -> None:
        """End the job's processes on hosts whose supervisor died (its channel closed without an
        exit) while the connection still works: nothing on the host would end them otherwise."""
        reachable = [node for node in nodes if self.group[node].connected()]
        if not reachable:
            return
        grace = run.plan.stop_grace
        results = self.group.run(lambda t: json.loads(_cleanup(t, run.plan.job_id, grace).strip().splitlines()[-1]),
                                 only=reachable)
        for node, result in results.items():
            if isinstance(result, Exception):
                run.sink.note(node, f"its supervisor died; the job's processes there could not be ended: {result}")
            else:
                run.sink.note(node, f"its supervisor died; distrun ended the {result['found']} process(es) of the "
                              f"job left there ({result['killed']} needed SIGKILL)")
                for line in result.get("gpus_freed", []):
                    run.sink.note(node, line)

    # ---------------------------------------------------------------- recorded jobs

    def stop_job(self, record: JobRecord, current: Callable[[], JobRecord]) -> Stopped:
        """Stop through the live controller (which records the end); when it is gone, end the job's
        processes on its hosts."""
        if record.state.finished and record.state is not JobState.LOST:
            return Stopped(int(ExitCode.OK), (f"job {record.id} already ended ({record.state.value})",))
        if signal_controller(record, signal.SIGTERM):
            deadline = time.monotonic() + STOP_WAIT
            while time.monotonic() < deadline and not current().state.finished:
                time.sleep(0.2)
            ended = current()
            if ended.state.finished:
                return Stopped(int(ExitCode.OK), (f"job {record.id} stopped",), gpus_freed=tuple(ended.gpus_freed))
        return self.stop_on_hosts(record)

    def stop_on_hosts(self, record: JobRecord) -> Stopped:
        """End a job's processes on each of its hosts, found by the job id; the job is to be recorded stopped."""
        results = on_record_hosts(record, lambda t: _cleanup(t, record.id))
        freed = tuple(f"{node}: {line}" for node, output in results.succeeded.items()
                      for line in json.loads(output.strip().splitlines()[-1]).get("gpus_freed", []))
        said = (f"job {record.id} stopped on {len(results.succeeded)} of {len(results)} host(s)",)
        settled = Settled(JobState.STOPPED)
        if results.failed:
            return Stopped(int(ExitCode.INFRA), said, (GroupError(results).render(),), freed, settled)
        return Stopped(int(ExitCode.OK), said, gpus_freed=freed, settled=settled)

    def recover(self, record: JobRecord) -> dict[str, int]:
        """Rebuild a job's lines, metrics and telemetry from the copies its hosts kept.

        What the controller saw of each host is replaced by what the host wrote: the whole story
        when the controller died or lost the host before the job ended. Lines keep their order
        across hosts, and distrun's own notes stay (logs/recover.py).

        Returns:
            {node: lines recovered}.

        Raises:
            GroupError: a host could not be reached or read (each one named).
        """
        copies = on_record_hosts(record, lambda t: fetch_copy(t, record.id)).check("cannot read its copies")
        return rebuild(self.job_dirs(record.id), copies)

    def remove_copies(self, records: Sequence[JobRecord]) -> dict[str, str]:
        """Remove each host's ~/.distrun/jobs/<id> of these jobs: every host of an inventory at once,
        all of its jobs in one program.

        Returns:
            {job id: the hosts that could not be reached or cleaned, and why}.
        """
        by_inventory: dict[str, list[JobRecord]] = {}
        for record in records:
            by_inventory.setdefault(record.inventory, []).append(record)
        left: dict[str, str] = {}
        for path, jobs in by_inventory.items():
            left.update(_remove_copies(path, jobs))
        return left

    def run_near(self, record: JobRecord, node: str, argv: Sequence[str],
                 timeout: float | None = None) -> CommandResult:
        """Run `argv` on the host of `node` (as the job's recorded inventory reaches it).

        Raises:
            UsageError: the job did not run on `node`.
            InfraError: the host could not be reached, or the command did not finish in `timeout`.
        """
        if node not in record.hosts:
            raise UsageError(f"{node}: job {record.id} ran on {', '.join(record.hosts)}")
        return on_record_hosts(record, lambda t: t.run(argv, timeout=timeout), only=[node]).check()[node]

    def run_remote_near(self, record: JobRecord, nodes: Sequence[str], main: str, modules: list[str],
                        args: Sequence[str] = (), timeout: float | None = None) -> GroupResult[str]:
        """Run a remote program on the hosts of `nodes` (as the job's recorded inventory reaches them),
        all at once; it gets `JOB_ID NODE *args`."""
        limit = REMOTE_TIMEOUT if timeout is None else timeout
        return on_record_hosts(record, lambda t: run_remote(t, main, modules, b"", record.id, t.name, *args,
                                                            timeout=limit), only=list(nodes))


def _absolute(path: str) -> str:
    """A file path made absolute so the record reloads it from anywhere; `<built-in>` as is."""
    return path if path.startswith("<") else os.path.abspath(path)


def auto_port_start() -> int:
    """Where the search for a free port starts: a random point of a window above 29500, so
    two jobs launched at the same moment on the same master do not both pick 29500."""
    return DEFAULT_PORT + random.randrange(AUTO_PORT_WINDOW)


def master_port(master: NodeSpec, facts: HostFacts, port: int | None, addr: str) -> int:
    """The rendezvous port: the job's, found free, or the free one the master's probe listened on.

    Raises:
        InfraError: the job's port is busy on the master, or no port near 29500 is free.
    """
    listening = facts.listen is not None and facts.listen.ok
    if port is not None:
        if not listening:
            raise InfraError(
                f"{master.name}: rendezvous port {port} is already in use on the master ({addr}) "
                "(stop what holds it, or set `rendezvous.port: auto`)"
            )
        return port
    if not listening or facts.listen is None or not facts.listen.port:
        raise InfraError(f"{master.name}: no free TCP port from {DEFAULT_PORT} on the master ({addr})")
    return facts.listen.port


def on_record_hosts(record: JobRecord, fn: Callable[[Transport], T], only: list[str] | None = None) -> GroupResult[T]:
    """Connect to the hosts a job ran on (from its recorded inventory) and call fn on each;
    a host that cannot be reached has its connection error as its result."""
    inventory = record_inventory(record.inventory)
    known = {node.name for node in inventory.nodes}
    gone = [name for name in record.hosts if name not in known]
    if gone:
        raise UsageError(f"job {record.id} ran on {', '.join(gone)}, which {record.inventory} no longer lists: "
                         f"put them back there, or forget finished records here with `distrun prune --local`")
    with Group([inventory.node(name) for name in record.hosts]) as group:
        return group.run(fn, only=only)


def plan_supervisor_config(plan: LaunchPlan, host: HostPlan) -> SupervisorConfig:
    """A host's supervisor configuration from the plan. To label and mask the host's lines it gets
    the secrets' names (their values come with the environment), the host's first global rank,
    whether torchrun's ranks follow from it (static rendezvous; c10d assigns them at rendezvous),
    and the attempt."""
    return SupervisorConfig(
        job_id=plan.job_id, node=host.node, argv=list(host.argv), env=plan.host_env(host), cwd=host.workdir,
        heartbeat_timeout=plan.heartbeat_timeout, stop_grace=plan.stop_grace,
        telemetry_interval=plan.telemetry_interval, secret_names=list(host.secret_names),
        first_rank=plan.first_rank(host.node), exact_ranks="--node-rank" in host.argv, attempt=plan.attempt,
        make_dirs=[plan.checkpoint_dir] if plan.checkpoint_dir else [], programs=remote.program_sources(),
    )


def fetch_copy(transport: Transport, job_id: str) -> FetchedCopy:
    """A host's copy of a job's lines and telemetry (remote/fetch.py).

    Raises:
        InfraError: the host could not run the fetch.
    """
    answer = json.loads(run_remote(transport, "fetch", ["fetch"], b"", job_id, transport.name).strip().splitlines()[-1])
    files = {path: text.encode("utf-8", "surrogateescape") for path, text in answer["files"].items()}
    return FetchedCopy(files, answer["telemetry"])


def _remove_copies(inventory_path: str, jobs: list[JobRecord]) -> dict[str, str]:
    """Remove the jobs' host copies on the hosts of one recorded inventory; {job id: why not} for the rest."""
    try:
        inventory = record_inventory(inventory_path)
    except UsageError as exc:
        return {job.id: str(exc) for job in jobs}
    known = {node.name for node in inventory.nodes}
    ids_on = {name: [job.id for job in jobs if name in job.every_host] for name in known}
    ids_on = {name: ids for name, ids in ids_on.items() if ids}
    nodes = [inventory.node(name) for name in ids_on]
    with Group(nodes, progress=ProgressCounter(len(nodes), "connected")) as group:
        done = group.run(lambda t: run_remote(t, "prune", ["private", "sockdir", "prune"], b"", *ids_on[t.name]))
    failed = done.failed
    left = {job.id: f"{job.every_host[0]}: not in inventory {inventory_path} any more" for job in jobs
            if not set(job.every_host) <= known}
    if failed:
        why = GroupError(done, "cannot remove job copies").render()
        left.update({job.id: why for job in jobs if set(job.every_host) & set(failed)})
    return left


def record_inventory(path: str) -> Inventory:
    """The inventory a job was recorded with (`<built-in>`: this machine's)."""
    return default_inventory() if path == "<built-in>" else load_inventory(path)


def _cleanup(transport: Transport, job_id: str, grace: float = DEFAULT_STOP_GRACE) -> str:
    return run_remote(transport, "cleanup", [*SUPERVISOR_ONLY, "cleanup"], {}, job_id, transport.name, f"{grace:g}",
                      timeout=grace + CLEANUP_WAIT)
