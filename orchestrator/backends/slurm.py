"""The Slurm backend: the same job spec, logs, records and failure summary, with Slurm placing the job.

`launch` renders an sbatch script from the plan (see slurm_script), submits it, shows the pending
reason until Slurm allocates nodes, then follows each node's stream file in the shared job
directory and reports them to the same run loop (backends/run.py) the SSH backend reports its channels to.
The inventory only gives the nodes' settings (python, iface, env, gpus), from its first selected
node; Slurm chooses the hosts. Slurm owns the job's lifetime: `distrun stop` is `scancel`, and a
node that fails ends the step on all nodes through `srun --kill-on-bad-exit`. With `restarts`,
each attempt is a batch job of its own that excludes (`--exclude`) the nodes earlier failures
quarantined (`replan`). Slurm's own commands are wrapped in slurm_commands.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator import remote, telemetry
from orchestrator.backends.base import (
    Asked,
    Backend,
    Conclusion,
    LaunchContext,
    Learnt,
    Refused,
    Settled,
    Stopped,
    Submitted,
)
from orchestrator.backends.options import Option, OptionType
from orchestrator.backends.run import EXIT_WAIT, RunView
from orchestrator.backends.slurm_commands import (
    SLURM_TIMEOUT,
    SlurmJob,
    cancel,
    check_node_count,
    hostnames,
    in_queue,
    node_addresses,
    partition_nodes,
    query_job,
    sbatch,
    srun_on,
)
from orchestrator.backends.slurm_script import (
    BOOTSTRAP,
    BatchJob,
    SlurmFiles,
    SlurmOptions,
    node_argv,
    node_config,
    render_script,
    torchrun_options_end,
)
from orchestrator.backends.ssh import SUPERVISOR_MODULES
from orchestrator.console.terminal import show
from orchestrator.diagnose.failures import Failure, FailureKind, root_cause
from orchestrator.errors import ExitCode, InfraError, UsageError
from orchestrator.fanout.group import GroupResult, parallel
from orchestrator.hostcheck.probe import PROBE_MODULES
from orchestrator.liveness import controller_alive
from orchestrator.logs.sink import append_note
from orchestrator.plan import LaunchPlan, build_plan
from orchestrator.remote.follow import Follower, appended
from orchestrator.remote.private import make_private_dirs, write_private
from orchestrator.spec import JobSpec, NodeSpec, resolve_inventory_path, select_nodes
from orchestrator.store import JobDir, JobRecord, JobState

POLL = 0.5  # between two `scontrol show job` while pending or running
FOLLOW_POLL = 0.1  # between two reads of a stream file at its end
CHUNK = 1 << 16
DRAIN = 2.0  # after Slurm ended the job, how long the nodes' last lines get to arrive
SETTLE = 5.0  # after the nodes ended, how long Slurm gets to show the job's final state
RELEASE_WAIT = 30.0  # how long the controller waits for Slurm to release the nodes at the end
STOP_WAIT = 30.0

# States in which Slurm itself ended a job that distrun had not seen fail.
ENDED_BY_SLURM = frozenset({"TIMEOUT", "NODE_FAIL", "PREEMPTED", "DEADLINE", "OUT_OF_MEMORY", "BOOT_FAIL"})
# Pending reasons that no amount of waiting resolves.
HOPELESS = frozenset({"PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS"})
MASTER_LINE = re.compile(r"^distrun: master (\S+):(\d+)$")


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class NodeTemplate:
    """What the inventory says about a Slurm job's nodes: the settings of its first selected node."""

    node: NodeSpec
    selected: int
    inventory_path: str


def node_template(job: JobSpec, asked: Asked, options: SlurmOptions) -> NodeTemplate:
    """The inventory node (the master, else the first selected) whose settings every node gets.

    Raises:
        UsageError: --nodes, --exclude or --label was given (Slurm places the job), the inventory is
            wrong, or the guard refused a job on every node of a large inventory.
    """
    chosen = asked.selection
    if chosen.nodes or chosen.exclude or chosen.labels:
        flag = "--nodes" if chosen.nodes else ("--exclude" if chosen.exclude else "--label")
        raise UsageError(f"{flag}: Slurm chooses the nodes of a Slurm job (use --nnodes, or "
                         "slurm.extra: ['--nodelist=a,b'] in the job)")
    inventory = resolve_inventory_path(asked.inventory)
    selected = select_nodes(replace(job, nnodes=None), inventory)
    if asked.guard is not None and not (asked.nnodes or job.nnodes):
        asked.guard.check(selected, inventory, chosen.all or bool(job.select.names or job.select.labels), "launch")
    node = inventory.master_of(selected)
    if options.gpus_per_node:
        node = replace(node, gpus=options.gpus_per_node)
    return NodeTemplate(node, len(selected), inventory.path)


def slurm_plan(job: JobSpec, asked: Asked, template: NodeTemplate, job_id: str, attempt: int = 1,
               nnodes: int | None = None) -> LaunchPlan:
    """The plan for every node: one torchrun argv whose per-node values each node fills in.

    Nodes are named rank0.. until Slurm allocates them (see `allocated_plan`); their number is
    `nnodes` (a later attempt's), else --nnodes, else the job's nnodes, else the inventory's
    selected nodes.
    """
    nnodes = nnodes or asked.nnodes or job.nnodes or template.selected
    extra_args = list(asked.extra_args)
    nodes = [replace(template.node, name=f"rank{i}") for i in range(nnodes)]
    plan = build_plan(job, nodes, {}, job_id=job_id, inventory_path=template.inventory_path, master=nodes[0],
                      master_addr="$MASTER_ADDR", master_port=0, controller_cwd=os.getcwd(),
                      controller_env=dict(os.environ), extra_args=extra_args, backend=SlurmBackend.NAME,
                      attempt=attempt)
    hosts = [replace(h, argv=node_argv(h.argv, torchrun_options_end(job, h.argv, extra_args)))
             for h in plan.hosts]
    return replace(plan, hosts=hosts)


def gpus_per_node(options: SlurmOptions, plan: LaunchPlan, template: NodeTemplate) -> int | None:
    """GPUs to ask per node: `slurm.gpus_per_node`, else one per process on GPU nodes."""
    if options.gpus_per_node:
        return options.gpus_per_node
    return plan.hosts[0].nproc if template.node.gpus else None


def allocated_plan(plan: LaunchPlan, names: list[str], addrs: dict[str, str]) -> LaunchPlan:
    """The plan with Slurm's nodes in node-rank order in place of rank0..."""
    hosts = [replace(h, node=name, host=addrs.get(name, name)) for h, name in zip(plan.hosts, names, strict=True)]
    return replace(plan, hosts=hosts, master_node=names[0], master_addr=names[0])


def batch_job(job: JobSpec, asked: Asked, job_dir: JobDir, job_id: str, options: SlurmOptions,
              attempt: int = 1, nnodes: int | None = None, exclude: tuple[str, ...] = ()) -> tuple[BatchJob, bytes]:
    """The batch job and the supervisor bundle its nodes run; a later attempt's on `nnodes` nodes,
    none of `exclude`, with files of its own."""
    template = node_template(job, asked, options)
    plan = slurm_plan(job, asked, template, job_id, attempt, nnodes)
    gpus = gpus_per_node(options, plan, template)
    modules = [*dict.fromkeys([*PROBE_MODULES, *SUPERVISOR_MODULES]), "slurm_node"]
    bundle = remote.bundle("slurm_node", modules, telemetry.shipped_modules(gpus or 0))
    batch = BatchJob(plan=plan, options=options, gpus_per_node=gpus,
                     port=job.rendezvous.port, bundle_size=len(bundle), files=SlurmFiles(job_dir.root, attempt),
                     options_end=torchrun_options_end(job, plan.hosts[0].argv, list(asked.extra_args)),
                     exclude=exclude)
    return batch, bundle


def follow_bytes(path: Path, finished: Callable[[], bool]) -> Iterator[bytes]:
    """Bytes appended to `path` as they come, until `finished()` and nothing more is there."""
    with Follower(path) as follower:
        yield from appended(follower, finished, FOLLOW_POLL, CHUNK)


def follow_lines(path: Path, finished: Callable[[], bool]) -> Iterator[str]:
    """Lines appended to `path` until `finished()`, then what is left (an unfinished last line too)."""
    with Follower(path) as follower:
        for chunk in appended(follower, finished, FOLLOW_POLL, CHUNK):
            whole = follower.cut(chunk)
            yield from (line.decode("utf-8", "replace") for line in whole.split(b"\n")[:-1])
        rest = follower.take_pending()
    if rest:
        yield rest.decode("utf-8", "replace")


# ---------------------------------------------------------------- launching


def write_files(job_dir: JobDir, batch: BatchJob, bundle: bytes, script: str) -> None:
    """The job directory: plan.json (secrets masked) and what the nodes read from slurm/."""
    job_dir.write_plan(batch.plan.to_dict())
    files = batch.files
    make_private_dirs(files.dir)
    write_private(files.bundle, bundle)
    write_private(files.bootstrap, BOOTSTRAP)
    write_private(files.node_json, json.dumps(node_config(batch), indent=2) + "\n")
    if batch.plan.secrets:
        write_private(files.secrets, json.dumps(batch.plan.secrets))
    write_private(files.script, script)


class SlurmBackend(Backend):
    """Slurm places and runs the job; distrun follows each node's stream file in the shared job directory.

    One object serves one launch: it keeps the Slurm job's id and the threads following it.
    """

    NAME = "slurm"
    DESCRIPTION = "sbatch/srun: Slurm allocates, places and accounts; distrun follows the nodes' streams"
    OPTIONS = (
        # Each text becomes an #SBATCH line of the batch script: one line only (see options.py).
        Option("partition", OptionType.TEXT, "the Slurm partition (default: Slurm's default partition)",
               one_line=True),
        Option("time", OptionType.TEXT, "the time limit, e.g. 01:00:00", one_line=True),
        Option("account", OptionType.TEXT, "the account charged", one_line=True),
        Option("gpus_per_node", OptionType.INTEGER, "GPUs per node (default: one per process on GPU nodes)",
               minimum=1),
        Option("extra", OptionType.STRINGS, "more sbatch options, e.g. [--exclusive, --qos=high]", one_line=True),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slurm_options = SlurmOptions(**self.options)  # type: ignore[arg-type]  # checked by OPTIONS
        self.batch: BatchJob | None = None
        self.bundle = b""
        self.script = ""
        self.slurm_id = ""
        self.ctx: LaunchContext | None = None
        self.batch_host = ""
        self.latest: SlurmJob | None = None
        self.ended_at: float | None = None
        self.cancelled = False
        self.done = threading.Event()
        self.followers: list[threading.Thread] = []
        self.excluded: tuple[str, ...] = ()  # nodes quarantined by earlier attempts' failures

    # ---------------------------------------------------------------- before Slurm runs it

    @property
    def launching(self) -> tuple[LaunchContext, BatchJob]:
        """The launch this backend serves and its batch job, once `prepare` made them."""
        if self.ctx is None or self.batch is None:
            raise RuntimeError("SlurmBackend: prepare() comes before the other launch hooks")
        return self.ctx, self.batch

    def prepare(self, ctx: LaunchContext) -> LaunchPlan:
        """The sbatch script and the nodes' files, from the plan of nodes rank0.. (Slurm names them later)."""
        self.ctx = ctx
        self.batch, self.bundle = batch_job(ctx.job, ctx.asked, ctx.files, ctx.job_id, self.slurm_options)
        self.script = render_script(self.batch)
        return self.batch.plan

    def dry_run(self, plan: LaunchPlan) -> str:
        return self.script.removesuffix("\n")

    def submit(self, ctx: LaunchContext, plan: LaunchPlan) -> Submitted:
        """sbatch the script: the job exists, as Slurm's job, with no nodes yet.

        Raises:
            UsageError: Slurm refused the job.
        """
        _, batch = self.launching
        check_node_count(plan.nnodes, self.slurm_options.partition)
        write_files(ctx.files, batch, self.bundle, self.script)
        self.slurm_id = sbatch(str(batch.files.script))
        return Submitted(self.slurm_id, placed=False)

    def place(self, ctx: LaunchContext, plan: LaunchPlan) -> LaunchPlan | Settled:
        """Wait (showing why) until Slurm allocates the job's nodes.

        Returns:
            The plan on the allocated nodes, or how the job ended first (cancelled or interrupted
            while pending, or lost).

        Raises:
            Refused: Slurm can never run the job as asked (it is cancelled).
        """
        self.say(f"job {ctx.job_id} submitted as Slurm job {self.slurm_id}")
        job = self._await_allocation(ctx)
        if ctx.interrupted is not None:
            cancel(self.slurm_id)
            name = signal.Signals(ctx.interrupted).name
            code = ExitCode.INTERRUPTED if ctx.interrupted == signal.SIGINT else ExitCode.TERMINATED
            ended = Settled(JobState.STOPPED, f"job {ctx.job_id} stopped ({name}) while pending; "
                            f"Slurm job {self.slurm_id} cancelled", int(code))
        elif job is None or not job.allocated:
            ended = self._unallocated(job)
        else:
            return self._allocated(job, plan)
        self.say(ended.detail)
        return ended

    def replan(self, ctx: LaunchContext, previous: LaunchPlan, hosts: Sequence[str],
               spares: Sequence[str]) -> LaunchPlan:
        """The next attempt: a batch job of its own on as many nodes as `hosts`, excluding (sbatch
        --exclude) every node an earlier attempt left out; submitted, and waited for until Slurm
        allocates it (Slurm chooses the nodes, `hosts` only counts them).

        Raises:
            InfraError: Slurm ended the job before allocating it, or distrun was interrupted.
            UsageError: Slurm refused the job.
        """
        left_out = [h.node for h in previous.hosts if h.node not in hosts]
        self.excluded = tuple(dict.fromkeys([*self.excluded, *left_out]))
        self.batch, self.bundle = batch_job(ctx.job, ctx.asked, ctx.files, ctx.job_id, self.slurm_options,
                                            previous.attempt + 1, len(hosts), self.excluded)
        self.script = render_script(self.batch)
        self.done, self.followers, self.ended_at, self.latest, self.cancelled = threading.Event(), [], None, None, False
        write_files(ctx.files, self.batch, self.bundle, self.script)
        self.slurm_id = sbatch(str(self.batch.files.script))
        ctx.learn(Learnt(backend_ref=self.slurm_id))
        excluding = f", excluding {','.join(self.excluded)}" if self.excluded else ""
        self.say(f"attempt {previous.attempt + 1} submitted as Slurm job {self.slurm_id}{excluding}")
        job = self._await_allocation(ctx)
        if ctx.interrupted is not None or job is None or not job.allocated:
            cancel(self.slurm_id)
            state = "interrupted" if ctx.interrupted is not None else (job.state if job else "gone")
            raise InfraError(f"Slurm job {self.slurm_id} ended before it started ({state})")
        return self._allocated(job, self.batch.plan)

    def say(self, text: str) -> None:
        """A line for the terminal (stderr when detached) and the job's lines (as a note of `slurm`)."""
        ctx, _ = self.launching
        show(f"[slurm] {text}", stream=ctx.terminal or sys.stderr, flush=True)
        append_note(ctx.files, "slurm", text)

    def _await_allocation(self, ctx: LaunchContext) -> SlurmJob | None:
        """Poll until Slurm allocates nodes, ends the job, or distrun is interrupted; show each new pending reason."""
        shown = ""
        while ctx.interrupted is None:
            job = query_job(self.slurm_id)
            if job is None or job.allocated or job.distrun_state.finished:
                return job
            shown = self._show_pending(job, shown)
            time.sleep(POLL)
        return None

    def _show_pending(self, job: SlurmJob, shown: str) -> str:
        """Say why the job waits when that changed; give up on a reason that never resolves.

        Raises:
            Refused: the job can never run as asked (the job is cancelled).
        """
        if job.reason == shown:
            return shown
        if job.reason in HOPELESS:
            cancel(self.slurm_id)
            raise Refused(Settled(JobState.FAILED, f"Slurm cannot run job {self.slurm_id} as asked ({job.reason}); "
                                  "cancelled", int(ExitCode.USAGE)))
        waiting = "waiting for the scheduler" if job.reason in ("None", "") else job.reason
        self.say(f"job {self.slurm_id} pending ({waiting})")
        self.launching[0].learn(Learnt(pending=f"pending in Slurm: {waiting}"))
        return job.reason

    def _unallocated(self, job: SlurmJob | None) -> Settled:
        """How the job ended before Slurm gave it nodes (cancelled while pending, or lost)."""
        job_id = self.launching[0].job_id
        if job is None:
            return Settled(JobState.LOST, f"job {job_id} lost: Slurm forgot job {self.slurm_id} before it started",
                           int(ExitCode.FAILED))
        state = job.distrun_state
        code = ExitCode.TERMINATED if state is JobState.STOPPED else ExitCode.FAILED
        return Settled(state, f"job {job_id} {state.value}: Slurm job {self.slurm_id} ended {job.state} while "
                       f"pending ({job.reason})", int(code))

    def _allocated(self, job: SlurmJob, plan: LaunchPlan) -> LaunchPlan:
        """The plan on the nodes Slurm allocated (plan.json in the job's directory; the run loop records the nodes)."""
        ctx = self.launching[0]
        names = hostnames(job.nodelist)
        allocated = allocated_plan(plan, names, node_addresses(names))
        if ctx.job.restarts.max:
            # The partition's other nodes stand in for the spares: Slurm picks among them (less --exclude).
            _, partition = partition_nodes(self.slurm_options.partition)
            allocated = replace(allocated, spares=tuple(n for n in partition if n not in names and
                                                        n not in self.excluded))
        ctx.files.write_plan(allocated.to_dict())
        self.say(f"job {self.slurm_id} running on {', '.join(names)}")
        self.batch_host = job.batch_host or names[0]
        return allocated

    # ---------------------------------------------------------------- following it

    def start(self, run: RunView) -> list[Failure]:
        """Follow each node's stream file, the batch script's output, and Slurm's view of the job."""
        targets: list[Callable[[], None]] = [lambda: self._poll_loop(run), lambda: self._follow_output(run)]
        targets += [lambda node=host.node: self._follow_node(run, node) for host in run.plan.hosts]
        for target in targets:
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.followers.append(thread)
        return []

    def _follow_node(self, run: RunView, node: str) -> None:
        path = self.launching[1].files.stream(node)

        def finished() -> bool:
            if not path.exists():
                run.events.alive(node)  # not started yet, which is not silence
            return run.exited(node) or self.done.is_set()

        for chunk in follow_bytes(path, finished):
            run.events.data(node, chunk)
        run.events.end(node)

    def _follow_output(self, run: RunView) -> None:
        """The batch script's own output (the master's address, srun's errors) as the batch host's lines."""
        for line in follow_lines(self.launching[1].files.output(self.slurm_id), self.done.is_set):
            run.sink.line(self.batch_host, f"slurm: {line}")
            match = MASTER_LINE.match(line)
            if match:
                self.launching[0].learn(Learnt(master_addr=match.group(1), master_port=int(match.group(2))))

    def _poll_loop(self, run: RunView) -> None:
        while not self.done.wait(POLL):
            try:
                self._poll()
            except InfraError as exc:
                run.sink.note(self.batch_host, f"slurm: {exc}")

    def _poll(self) -> SlurmJob | None:
        job = query_job(self.slurm_id)
        if job is not None:
            self.latest = job
        if (job is None or job.distrun_state.finished) and self.ended_at is None:
            self.ended_at = time.monotonic()
        return job

    def failures(self, run: RunView) -> list[Failure]:
        """Every host's, and nodes whose supervisor never reported an exit from a job Slurm ended."""
        found = super().failures(run)
        if self.ended_at is not None and time.monotonic() - self.ended_at > DRAIN:
            state = self.latest.state if self.latest is not None else "gone"
            seen = {f.host for f in found}
            found += [run.events.lost(h.node, f"Slurm job {self.slurm_id} ended ({state}) without an exit from "
                                      "this node's supervisor")
                      for h in run.plan.hosts if not run.exited(h.node) and h.node not in seen]
        return found

    def conclude(self, run: RunView, failures: list[Failure]) -> Conclusion:
        """Slurm's final state decides: cancelled outside distrun is a stop; TIMEOUT, NODE_FAIL and the
        like are failures of the job, named after the node that failed first (else the batch host)."""
        job = self._settled()
        if job is not None and job.state == "CANCELLED" and not self.cancelled:
            return Conclusion(stopped=f"job {run.plan.job_id} stopped: Slurm job {self.slurm_id} was cancelled; "
                          "every node's processes ended")
        if job is not None and job.state in ENDED_BY_SLURM:
            node = root_cause(failures).host if failures else self.batch_host
            reason = f"Slurm ended the job: {job.state} ({job.reason})"
            return Conclusion([Failure(node, FailureKind.INFRA, reason=reason)])
        return Conclusion(failures)

    def _settled(self) -> SlurmJob | None:
        """Slurm's view once the job has ended there, waiting at most SETTLE seconds.

        A `scancel` reaches the nodes, whose failures end the monitoring, a moment before
        slurmctld shows CANCELLED: read too early, a stopped job looked failed.
        """
        deadline = time.monotonic() + SETTLE
        job = self._poll() or self.latest
        while job is not None and not job.distrun_state.finished and time.monotonic() < deadline:
            time.sleep(POLL)
            job = self._poll() or job
        return job

    def stop(self, run: RunView, nodes: list[str]) -> None:
        """After a failure Slurm ends the other nodes itself (--kill-on-bad-exit); else scancel."""
        if run.interrupted is None:
            self._await_exits(run, nodes, run.plan.stop_grace)
            nodes = [node for node in nodes if not run.exited(node)]
        if nodes and self.ended_at is None:
            self.cancelled = True
            cancel(self.slurm_id)
            self._await_exits(run, nodes, run.plan.stop_grace + EXIT_WAIT)

    def _await_exits(self, run: RunView, nodes: list[str], timeout: float) -> None:
        """Until each node reported its exit, Slurm ended the job (and DRAIN passed), or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(run.exited(node) for node in nodes):
            if self.ended_at is not None and time.monotonic() - self.ended_at > DRAIN:
                return
            time.sleep(0.05)

    def finish(self, run: RunView) -> list[str]:
        """Wait for Slurm to release the nodes and the last lines to arrive; Slurm's final state."""
        deadline = time.monotonic() + RELEASE_WAIT
        while in_queue(self.slurm_id) and time.monotonic() < deadline:
            time.sleep(POLL)
        self.done.set()
        for thread in self.followers:
            thread.join(timeout=5)
        job = query_job(self.slurm_id)
        return [f"Slurm job {self.slurm_id}: {job.state}"] if job is not None else []

    def release(self) -> None:
        """Stop following; the secrets file goes too, where the batch script never ran to remove it
        (the job was cancelled while pending, or refused)."""
        self.done.set()
        if self.batch is not None:
            self.batch.files.secrets.unlink(missing_ok=True)

    # ---------------------------------------------------------------- recorded jobs

    def stop_job(self, record: JobRecord, current: Callable[[], JobRecord]) -> Stopped:
        """scancel the job; its controller, when alive, records the end, else `distrun stop` does (`settled`)."""
        if record.state.finished:
            return Stopped(int(ExitCode.OK), (f"job {record.id} already ended ({record.state.value})",))
        if record.backend_ref is None:
            raise UsageError(f"job {record.id} has no Slurm job id yet (it is being submitted); try again")
        cancel(record.backend_ref)
        SlurmFiles(self.job_dirs(record.id).root).secrets.unlink(missing_ok=True)
        deadline = time.monotonic() + STOP_WAIT
        alive = controller_alive(record)
        # Complete once the live controller recorded the stop, or (no controller) once Slurm is done.
        while time.monotonic() < deadline and not (current().state.finished if alive
                                                   else not in_queue(record.backend_ref)):
            time.sleep(0.2)
        said = (f"job {record.id} stopped (Slurm job {record.backend_ref} cancelled)",)
        cancelled = Settled(JobState.STOPPED, f"Slurm job {record.backend_ref} cancelled by `distrun stop`")
        return Stopped(int(ExitCode.OK), said, settled=None if alive else cancelled)

    def job_alive(self, record: JobRecord) -> bool:
        """Slurm owns the job: it runs on without its controller until Slurm ends or forgets it.
        When Slurm cannot be asked, the job counts as alive."""
        if controller_alive(record) or not record.backend_ref:
            return True
        try:
            job = query_job(record.backend_ref)
        except InfraError:
            return True
        return job is not None and not job.distrun_state.finished

    def ended_as(self, record: JobRecord) -> Settled:
        """Slurm's own final state for a job whose controller died: COMPLETED is succeeded, CANCELLED
        stopped, FAILED/TIMEOUT/... failed; lost only when Slurm forgot the job or cannot be asked."""
        try:
            job = query_job(record.backend_ref or "")
        except InfraError:
            job = None
        if job is None or not job.distrun_state.finished:
            return Settled(JobState.LOST, f"job {record.id} lost: its controller died and Slurm no longer "
                           f"knows job {record.backend_ref}")
        state = job.distrun_state
        codes = {JobState.SUCCEEDED: ExitCode.OK, JobState.STOPPED: ExitCode.TERMINATED}
        return Settled(state, f"job {record.id} {state.value}: Slurm job {record.backend_ref} ended {job.state} "
                       "after its controller died", int(codes.get(state, ExitCode.FAILED)))

    def recover(self, record: JobRecord) -> dict[str, int]:
        raise UsageError(f"--recover: job {record.id} ran on Slurm, whose nodes wrote into the job directory itself")

    def run_remote_near(self, record: JobRecord, nodes: Sequence[str], main: str, modules: list[str],
                        args: Sequence[str] = (), timeout: float | None = None) -> GroupResult[str]:
        """Run a remote program beside a running job's ranks on each of `nodes` at once: one
        `srun --jobid --overlap` task per node, inside the job's own allocation (no new resources,
        and Slurm's own channel to the node). The program goes as a bundle file into the job
        directory, which every node sees, and starts through the job's bootstrap file there;
        it gets `JOB_ID NODE *args`.

        Raises:
            UsageError: the job has no Slurm job id yet, or has ended.
        """
        if not record.backend_ref:
            raise UsageError(f"job {record.id} has no Slurm job id yet (it is being submitted); try again")
        if record.state.finished:
            raise UsageError(f"job {record.id} is not running in Slurm ({record.state.value}); "
                             "its nodes cannot be reached through its allocation")
        job_dir = self.job_dirs(record.id)
        files = SlurmFiles(job_dir.root)
        payload = remote.bundle(main, modules)
        bundle = files.dir / f"{main}-{os.getpid()}.bundle"
        write_private(bundle, payload)
        python = str(json.loads(job_dir.plan.read_text(encoding="utf-8"))["hosts"][0]["python"])
        program = [python, str(files.bootstrap), str(bundle), str(len(payload)), record.id]
        limit = SLURM_TIMEOUT if timeout is None else timeout
        slurm_id = record.backend_ref
        try:
            return parallel(nodes, lambda node: srun_on(slurm_id, node, [*program, node, *args], limit), key=str)
        finally:
            bundle.unlink(missing_ok=True)
