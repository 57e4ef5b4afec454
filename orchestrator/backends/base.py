"""The contract of a backend: the public hooks the run loop calls, and per-job operations.
A running job is seen through backends/run.py's RunView only; backends/README.md is the guide to
writing one (tests/toy_backend.py is a whole one in one file).

invoke's `Runner` is the model: the run loop (`orchestrator.run.attempt`) is written once; a backend
fills in hooks. A backend object serves one command: one launch, or operations on recorded jobs.

A launch calls, in this order (`run.launch.launch` and `run.attempt.Attempt`):

    prepare(ctx) -> plan                  reach hosts / render the scheduler's request; nothing starts
    replan(ctx, plan, hosts, spares)      the controller's next attempt (`restarts:`), then preflight,
                                          stage and start again; the run loop records its hosts
    dry_run(plan) -> text                 with --dry-run: what would run; then release()
    preflight(ctx, plan)                  unless --skip-preflight: refuse hosts that would hang a job
    stage(ctx, plan)                      put what the job needs on its hosts (`sync: true`)
    submit(ctx, plan) -> Submitted        make the job exist (hand it to a scheduler); the run loop
                                          records it as pending
    place(ctx, plan) -> plan | Settled    wait for the job's hosts (a scheduler's queue): the plan on
                                          them, recorded then; or how it ended before it started
    start(run) -> [Failure]               start every host's supervisor, or follow what a scheduler
                                          started; each host's events go to run.events (by node name)
    failures(run) -> [Failure]            polled: every host's failure as seen now
    conclude(run, failures) -> Conclusion     the backend's last word: a scheduler may have ended the job
    stop(run, nodes)                      end what still runs on those hosts (after a failure or Ctrl-C)
    finish(run) -> [lines]                release what the job held; extra lines for its summary
    release()                             always, when the backend is left (it is a context manager)

A backend never writes the job's record: its hooks return what happened (`Submitted`, a plan,
`Settled`, `Conclusion`), what it learns while a hook waits or the job runs goes to `ctx.learn`
(`Learnt`), a refusal after the job exists is `Refused`, and the layers above record each. It
writes files only into its own job's directory (`ctx.files`).

Per-job operations, for jobs recorded earlier (their controller may be gone):

    stop_job(record, current) -> Stopped  `distrun stop`: its exit code, what to say, and the end to
                                          record when no controller will (`Stopped.settled`)
    job_alive(record) -> bool             whether the job still runs (its controller, or its scheduler)
    ended_as(record) -> Settled           how a job that no longer runs ended; `ps` records it (default: lost)
    recover(record) -> {node: lines}      `distrun logs --recover`
    remove_copies(records) -> {id: error} `distrun prune`: what the hosts keep of finished jobs
    run_near(record, node, argv)          a command next to the job's ranks
    run_remote_near(record, nodes, ...)   a remote program next to the job's ranks on several hosts at once
                                          (remote/stack.py for `distrun stack` and the hang watchdog)

Options: a backend declares OPTIONS; `resolve_options` reads them from the job file's section
named after the backend and from `-o KEY=VALUE` (see backends/options.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import ClassVar, TextIO

from orchestrator.backends import options as backend_options
from orchestrator.backends.options import Option
from orchestrator.backends.run import RunView
from orchestrator.diagnose.failures import Failure
from orchestrator.errors import UsageError
from orchestrator.fanout.group import GroupResult
from orchestrator.liveness import controller_alive
from orchestrator.plan import LaunchPlan
from orchestrator.spec.model import JobSpec
from orchestrator.spec.select import HostSelection, SelectionGuard
from orchestrator.store import JobDir, JobRecord, JobState
from orchestrator.transport.base import CommandResult


@dataclass(frozen=True)
class Asked:
    """What a launch asks of its backend (from the CLI's request, run/request.py): where the job may run, and the
    job's arguments after `--`; the rest of the request is the run loop's.

    Attributes:
        inventory: -i, as given (None: $DISTRUN_INVENTORY, else the built-in one).
        selection: --nodes, --exclude, --label, --all.
        nnodes: --nnodes, when one number was given.
        guard: The rule for an implicit selection of many hosts; None: none.
        extra_args: The job's arguments after `--`.
        dry_run: --dry-run: plan only.
        probe: With dry_run, reach the hosts to fill in what only a probe knows.
    """

    inventory: str | None = None
    selection: HostSelection = field(default_factory=HostSelection)
    nnodes: int | None = None
    guard: SelectionGuard | None = None
    extra_args: tuple[str, ...] = ()
    dry_run: bool = False
    probe: bool = False


@dataclass(frozen=True)
class Learnt:
    """What a backend learnt of its job while a hook waits or the job runs (`LaunchContext.learn`),
    for the run loop to record; None leaves a field as it is.

    Attributes:
        backend_ref: The backend's own id for the job (a later attempt's Slurm job id).
        pending: Why the job waits (the record's detail, shown by `ps`).
        master_addr: The rendezvous address, once the hosts found it.
        master_port: The rendezvous port, once the hosts found it.
    """

    backend_ref: str | None = None
    pending: str | None = None
    master_addr: str | None = None
    master_port: int | None = None


@dataclass
class LaunchContext:
    """One launch as its hooks see it: the job, what was asked of the backend, its directory.

    `interrupted` is the signal (SIGINT, SIGTERM) that asked distrun to stop while the job was
    submitted or running; hooks that wait (a scheduler's queue) return when it is set.

    Attributes:
        job: The job.
        job_id: Its id.
        asked: What the launch asks of the backend.
        files: The job's directory, where the backend may write files of its own (plan.json).
        learn: Where the backend says what it learnt of the job (the run loop records it).
        terminal: Where lines are shown; None: detached or quiet (lines go to the job's files only).
        interrupted: The signal that asked distrun to stop, or None.
    """

    job: JobSpec
    job_id: str
    asked: Asked
    files: JobDir
    learn: Callable[[Learnt], None]
    terminal: TextIO | None = None
    interrupted: int | None = None

    def interrupt(self, signum: int) -> None:
        self.interrupted = signum


@dataclass(frozen=True)
class Submitted:
    """What `submit` made: the job exists, and the run loop records it as pending.

    Attributes:
        backend_ref: The backend's own id for the job (Slurm's job id); None: it has none.
        placed: Whether the plan's hosts are the job's. False: a scheduler chooses them, the job
            is recorded without hosts, and `place` returns the plan on the hosts it chose.
    """

    backend_ref: str | None = None
    placed: bool = True


class Refused(UsageError):
    """The job, already recorded, can never run as asked (the scheduler refuses it; it is cancelled):
    the run loop records `settled` as its end, and the launch ends with this one-line error."""

    def __init__(self, settled: Settled) -> None:
        super().__init__(settled.detail)
        self.settled = settled


@dataclass(frozen=True)
class Conclusion:
    """How a job that distrun did not interrupt ended, as its backend concludes.

    Attributes:
        failures: What failed ([] = the job succeeded, unless `stopped`).
        stopped: Set when something outside distrun stopped the job (e.g. `scancel`): the
            summary's first line; the job is recorded as stopped.
    """

    failures: list[Failure] = field(default_factory=list)
    stopped: str | None = None


@dataclass(frozen=True)
class Stopped:
    """What `stop_job` did, for `distrun stop` to record, print or render as JSON.

    Attributes:
        code: The exit code of `distrun stop` for this job.
        messages: What happened, a line each.
        errors: The hosts that could not be reached, rendered (`GroupError.render`).
        gpus_freed: `node: line` for each GPU's memory the stop freed (remote/gpu.py).
        settled: The end to record when no controller records one (the record is still pending,
            running or lost); None: nothing to record.
    """

    code: int
    messages: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    gpus_freed: tuple[str, ...] = ()
    settled: Settled | None = None


@dataclass(frozen=True)
class Settled:
    """How a recorded job that no longer runs ended, as far as its backend can tell (`ended_as`).

    Attributes:
        state: The final state; `lost` when nothing tells how the job ended.
        detail: A summary line for the record ("" keeps the record's own).
        exit_code: The exit code to record, when known.
    """

    state: JobState
    detail: str = ""
    exit_code: int | None = None


class Backend(ABC):
    """Where jobs run. Subclasses set NAME (their registry key) and fill in the hooks.

    Args:
        job_dirs: A recorded job's directory by its id (for the per-job operations; a launch's
            hooks get theirs as `ctx.files`).
        options: This backend's options, resolved (`resolve_options`).
    """

    NAME: ClassVar[str]
    OPTIONS: ClassVar[tuple[Option, ...]] = ()
    DESCRIPTION: ClassVar[str] = ""

    def __init__(self, job_dirs: Callable[[str], JobDir], options: Mapping[str, object] | None = None) -> None:
        self.job_dirs = job_dirs
        self.options: dict[str, object] = dict(options or {})

    @classmethod
    def resolve_options(cls, job: JobSpec, pairs: Sequence[str] = ()) -> dict[str, object]:
        """This backend's options: the job file's section named NAME, `-o KEY=VALUE` pairs over it.

        Raises:
            SpecError: the job file's section is wrong (at its line).
            UsageError: a `-o` pair is wrong.
        """
        return backend_options.resolve(job, pairs, cls.NAME, cls.OPTIONS)

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def release(self) -> None:  # noqa: B027 - a hook: a backend that holds nothing has nothing to release
        """Let go of what the backend holds (connections); called once, whatever happened."""

    # ---------------------------------------------------------------- a launch, in order

    @abstractmethod
    def prepare(self, ctx: LaunchContext) -> LaunchPlan:
        """Build the plan: every host's argv and environment. Nothing of the job starts.

        Raises:
            UsageError: the request cannot be planned (bad selection, bad options).
            InfraError: a host or the scheduler could not be reached.
        """

    def replan(self, ctx: LaunchContext, previous: LaunchPlan, hosts: Sequence[str],
               spares: Sequence[str]) -> LaunchPlan:
        """Plan the controller's next attempt of a job (`restarts:`) on `hosts`, its attempt number
        one past `previous`'s and on a fresh rendezvous port; preflight and stage follow.

        Raises:
            UsageError: this backend does not restart jobs.
            DistrunError: the hosts could not be reached or probed.
        """
        raise UsageError(f"the {self.NAME} backend does not restart jobs")

    def dry_run(self, plan: LaunchPlan) -> str:
        """What `--dry-run` prints: by default every host's environment and argv."""
        return plan.render()

    def preflight(self, ctx: LaunchContext, plan: LaunchPlan) -> None:  # noqa: B027 - optional hook
        """Refuse to start on hosts that would make the job hang (skipped by --skip-preflight).

        Raises:
            DistrunError: a check failed; nothing was started.
        """

    def stage(self, ctx: LaunchContext, plan: LaunchPlan) -> None:  # noqa: B027 - optional hook
        """Put what the job needs on its hosts (the workdir, with `sync: true`). Nothing is recorded
        yet: Ctrl-C here ends the command as anywhere before the job exists.

        Raises:
            DistrunError: the hosts could not be staged; nothing was started.
        """

    @abstractmethod
    def submit(self, ctx: LaunchContext, plan: LaunchPlan) -> Submitted:
        """Make the job exist (hand it to a scheduler, or nothing more); the run loop records it
        as pending. From here on SIGINT and SIGTERM are caught: they set `ctx.interrupted`, and
        the job is stopped on every host.

        Returns:
            The backend's id for the job, and whether the plan's hosts are the job's.
        """

    def place(self, ctx: LaunchContext, plan: LaunchPlan) -> LaunchPlan | Settled:
        """Wait until the job has its hosts (a scheduler's queue; why it waits goes to `ctx.learn`).

        Returns:
            The plan on the job's hosts (recorded by the run loop; by default `plan`), or how the
            job ended before it started (cancelled or lost while pending, or interrupted): the run
            loop records that end and exits with its code.

        Raises:
            Refused: the job can never run as asked (its end is recorded).
        """
        return plan

    @abstractmethod
    def start(self, run: RunView) -> list[Failure]:
        """Start (or begin following) every host of `run.plan`; each host's output and events go
        to `run.events` under its node name.

        Returns:
            The failures of hosts that could not be started ([] when all started).
        """

    def failures(self, run: RunView) -> list[Failure]:
        """Every host's failure as seen now (exit, closed channel, silence), in host order."""
        return run.failures()

    def conclude(self, run: RunView, failures: list[Failure]) -> Conclusion:
        """The backend's verdict once every host ended or one failed; by default the failures seen."""
        return Conclusion(failures)

    @abstractmethod
    def stop(self, run: RunView, nodes: list[str]) -> None:
        """End the job on the hosts of `nodes` (those not yet ended) and wait, within the job's stop
        grace, for each to report its exit."""

    def finish(self, run: RunView) -> list[str]:
        """Release what the job held once it ended.

        Returns:
            Extra lines for the job's summary.
        """
        return []

    # ---------------------------------------------------------------- recorded jobs

    @abstractmethod
    def stop_job(self, record: JobRecord, current: Callable[[], JobRecord]) -> Stopped:
        """Stop a recorded job: through its controller when alive, else directly; what it did.

        Args:
            record: The job, as recorded when `distrun stop` began.
            current: Its record as it is now (a live controller records the end it makes).
        """

    def job_alive(self, record: JobRecord) -> bool:
        """Whether an unfinished job still runs. By default a job lives with its controller
        (the recorded pid, started at the recorded time: `liveness.controller_alive`)."""
        return controller_alive(record)

    def ended_as(self, record: JobRecord) -> Settled:
        """How an unfinished job that no longer runs (`job_alive` is False) ended. By default
        nothing else knows: the job is lost (its hosts end it themselves when the heartbeat stops)."""
        return Settled(JobState.LOST)

    def recover(self, record: JobRecord) -> dict[str, int]:
        """Rebuild a job's log files from the copies its hosts kept.

        Returns:
            {node: lines recovered}.

        Raises:
            UsageError: this backend keeps no copies to recover from.
        """
        raise UsageError(f"--recover: job {record.id} ran on the {self.NAME} backend, which keeps no host copies")

    def remove_copies(self, records: Sequence[JobRecord]) -> dict[str, str]:
        """Remove what the hosts keep of these finished jobs (one connection per host).

        Returns:
            {job id: why its hosts' copies could not all be removed}; {} when all were. By
            default nothing is kept on hosts, so nothing is left.
        """
        return {}

    def run_near(self, record: JobRecord, node: str, argv: Sequence[str],
                 timeout: float | None = None) -> CommandResult:
        """Run a command on the host of a job's node, beside its ranks (e.g. py-spy dump).

        Raises:
            UsageError: this backend cannot run commands beside a job's ranks, or `node` is not the job's.
            InfraError: the host could not be reached.
        """
        raise UsageError(f"job {record.id} ran on the {self.NAME} backend, which cannot run commands beside "
                         "its ranks")

    def run_remote_near(self, record: JobRecord, nodes: Sequence[str], main: str, modules: list[str],
                        args: Sequence[str] = (), timeout: float | None = None) -> GroupResult[str]:
        """Run a remote program (orchestrator/remote) beside a job's ranks on each of `nodes` at once.

        The program gets `JOB_ID NODE *args` (as remote/cleanup.py and remote/stack.py expect).

        Args:
            record: The job.
            nodes: Its nodes to run on.
            main: The remote module whose `main(argv)` runs.
            modules: The remote modules to ship, dependencies first, `main` last.
            args: Arguments after the job id and the node.
            timeout: Seconds each host may take.

        Returns:
            Each node's stdout, or the exception that node raised (unreachable, the program failed).

        Raises:
            UsageError: this backend cannot run programs beside a job's ranks.
        """
        raise UsageError(f"job {record.id} ran on the {self.NAME} backend, which cannot run commands beside "
                         "its ranks")
