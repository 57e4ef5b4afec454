"""The launcher's run loop, written once for every backend: prepare, submit, start, watch, stop, finish.

`launch` is what `distrun launch` calls: it picks the backend (the request's, else the job's),
has it prepare and submit the job, and `Launcher` follows the job to its end through the
backend's hooks (orchestrator/backends/base.py lists them in order). The first failure observed
(a host's torchrun exiting non-zero, or a host going silent) stops every other host; the summary
leads with the root cause (failures.root_cause), as torch elastic's does.

With the job's `restarts`, a failure it lists ends only the attempt: `execute` asks the policy
(restarts.py) whether and where the next attempt runs, re-plans it through the backend's
`replan` (a spare in place of a quarantined host, a fresh rendezvous port), preflights and
stages it, and follows it with a new `Launcher` writing into the same job directory, each line
with its attempt. The record keeps every attempt.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator import backends, telemetry
from orchestrator.backends.base import Backend, LaunchContext, LaunchRequest, terminal_for
from orchestrator.display import fold_hosts
from orchestrator.errors import DistrunError, ExitCode, InfraError
from orchestrator.failures import STOPPED_BY_DISTRUN, Failure, FailureKind, failed_summary, oom_reason, root_cause
from orchestrator.group import GroupError
from orchestrator.interrupts import on_signals
from orchestrator.logs import LogSink
from orchestrator.logs.screen import Screen
from orchestrator.logs.sink import job_wide
from orchestrator.plan import HostPlan, LaunchPlan
from orchestrator.remote.redact import Masker, escape_controls
from orchestrator.remote.stream import Batch, FrameReader
from orchestrator.restarts import Course, Verdict, refill
from orchestrator.spec.model import JobSpec
from orchestrator.spec.overrides import is_script, job_to_yaml
from orchestrator.store import JobDir, JobRecord, JobState, Store, new_job_id
from orchestrator.transport import RemoteProcess
from orchestrator.watchdog import Progress, Watchdog, diagnose

HEARTBEAT_EVERY = 1.0
POLL = 0.05
# A pause this long in the controller's own loop means it was stopped (SIGSTOP) or starved:
# hosts' silence is then counted from when it woke, not blamed on them.
FREEZE_GAP = 2.0
# What a supervisor says when it ends the job because the controller asked it to.
STOP_REQUESTED = "stopped by the controller"
SETTLE = 1.5  # after a first failure, how long to wait for its peers' failures before blaming one
EXIT_WAIT = 10.0  # beyond the stop grace, how long stopped hosts get to report their exit
SUMMARY_LINES = 20
ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
# torchrun prints this (at ERROR, unlike its INFO "will restart") once per failed attempt.
FAILED_ATTEMPT = re.compile(r"failed \(exitcode: -?\d+\) local_rank: \d+")
SCREEN_DRAIN = 5.0  # at the end, how long the terminal gets to show the lines still queued for it


# ---------------------------------------------------------------- the command


def launch(request: LaunchRequest) -> int:
    """Launch a job with the requested backend, or the job's own (`backend:` in the job file).

    Returns:
        The exit code: 0 the job succeeded, 1 it failed, 130/143 interrupted.

    Raises:
        DistrunError: bad input (2) or infrastructure (3); nothing of the job was started.
    """
    job = request.load_job()
    cls = backends.get(request.backend or job.backend or backends.DEFAULT)
    options = cls.resolve_options(job, request.options)
    ctx = LaunchContext(request, job, request.job_id or new_job_id(job.name), Store(), terminal_for(request))
    with cls(ctx.store, options) as backend:
        plan = backend.prepare(ctx)
        if request.dry_run:
            print(dry_run_text(job, request, backend.dry_run(plan)))
            return int(ExitCode.OK)
        if not request.skip_preflight:
            backend.preflight(ctx, plan)
        backend.stage(ctx, plan)
        return execute(backend, ctx, plan).code


def dry_run_text(job: JobSpec, request: LaunchRequest, plan_text: str) -> str:
    """What `--dry-run` prints: the backend's plan; for a script launch, first the job as a job file
    (ready to save: the plan follows as YAML comments)."""
    if not is_script(request.job_file):
        return plan_text
    shown = replace(job, args=(*job.args, *request.extra_args), nnodes=request.nnodes or job.nnodes)
    head = ("# distrun launch --dry-run: a job file, ready to save; -i and the host selection stay on the "
            "command line\n")
    return head + job_to_yaml(shown) + "\n".join(f"# {line}".rstrip() for line in plan_text.splitlines())


@dataclass(frozen=True)
class Finished:
    """How a launched job ended: the exit code, and rank 0's final metrics record (None when it wrote none)."""

    code: int
    final_metrics: dict[str, Any] | None = None


def execute(backend: Backend, ctx: LaunchContext, plan: LaunchPlan) -> Finished:
    """Submit a prepared job and follow it to its end, attempt after attempt when the job's
    `restarts` allow; SIGINT/SIGTERM stop it on every host.

    Returns:
        The exit code and the job's final metrics.
    """
    with on_signals(ctx.interrupt):
        started = backend.submit(ctx, plan)
        if started is None:
            return Finished(ctx.store.get(ctx.job_id).exit_code or 0)
        course = Course(ctx.job.restarts, ctx.job.min_nnodes or len(started.hosts), started.spares)
        while True:
            launcher = _launcher(backend, ctx, started, course)
            code = launcher.run()
            if launcher.verdict is None or launcher.verdict.hosts is None:
                return Finished(code, launcher.final_metrics)
            following = _next_attempt(backend, ctx, started, course, launcher.verdict)
            if isinstance(following, int):
                return Finished(following)
            started = following


def _next_attempt(backend: Backend, ctx: LaunchContext, plan: LaunchPlan, course: Course,
                  verdict: Verdict) -> LaunchPlan | int:
    """After the backoff, plan the next attempt on the verdict's hosts, preflight and stage it.

    Returns:
        The next attempt's plan, or the exit code when the job ended here instead (interrupted,
        or the next attempt could not be planned: recorded as the job's end).
    """
    deadline = time.monotonic() + course.policy.backoff
    while ctx.interrupted is None and time.monotonic() < deadline:
        time.sleep(POLL)
    following: LaunchPlan | None = None
    failed: DistrunError | None = None
    if ctx.interrupted is None:
        try:
            following = _plan_next(backend, ctx, plan, course, verdict.hosts or (), verdict.spares)
        except DistrunError as exc:
            failed = exc
    if ctx.interrupted is not None:
        name = signal.Signals(ctx.interrupted).name
        code = ExitCode.INTERRUPTED if ctx.interrupted == signal.SIGINT else ExitCode.TERMINATED
        return _end_between(ctx, course, plan, JobState.STOPPED, int(code),
                            f"job {ctx.job_id} stopped ({name}) before attempt {course.number + 1}")
    if failed is not None or following is None:
        return _end_between(ctx, course, plan, JobState.FAILED, int(failed.exit_code if failed else ExitCode.FAILED),
                            f"job {ctx.job_id} FAILED: attempt {course.number + 1} could not start: {failed}")
    ctx.store.job_dir(ctx.job_id).write_plan(following.to_dict())
    ctx.store.update(ctx.job_id, hosts=[h.node for h in following.hosts], master_addr=following.master_addr,
                     master_port=following.master_port)
    return following


def _plan_next(backend: Backend, ctx: LaunchContext, plan: LaunchPlan, course: Course, hosts: Sequence[str],
               spares: Sequence[str]) -> LaunchPlan:
    """Plan, preflight and stage the next attempt on `hosts`; a host that cannot be reached or
    probed is set aside, and the next spare (else fewer hosts, as `nnodes: MIN:MAX` allows)
    tried in its place.

    Raises:
        DistrunError: the attempt cannot start (no host left to try, or another error).
    """
    while True:
        course.spares = tuple(spares)
        try:
            following = backend.replan(ctx, plan, hosts, spares)
            if not ctx.request.skip_preflight:
                backend.preflight(ctx, following)
            backend.stage(ctx, following)
            return following
        except GroupError as exc:
            bad = set(exc.failed) & set(hosts)
            refilled = refill(hosts, bad, spares, course.min_hosts) if bad else None
            if refilled is None or ctx.interrupted is not None:
                raise
            course.unreachable += sorted(bad)
            hosts, spares = refilled
            _tell(ctx, f"[distrun] {fold_hosts(bad)} set aside ({exc}); attempt {course.number + 1} on "
                       f"{fold_hosts(hosts)}")


def _tell(ctx: LaunchContext, text: str) -> None:
    out = ctx.terminal or sys.stderr
    out.write(escape_controls(text) + "\n")
    out.flush()


def _end_between(ctx: LaunchContext, course: Course, plan: LaunchPlan, state: JobState, code: int,
                 detail: str) -> int:
    """Record and say the end of a job that ended between two attempts (secrets masked); its exit code."""
    mask = Masker(plan.secrets.values())
    text = mask.text("\n".join([detail, *course.lines()]))
    try:
        ctx.store.end(ctx.job_id, state, code, text, attempts=_masked_attempts(course, mask),
                      quarantined=course.quarantined)
    except DistrunError as exc:
        text += f"\ndistrun: warning: the job's end is not recorded: {exc}"
    _tell(ctx, text)
    return code


def _launcher(backend: Backend, ctx: LaunchContext, plan: LaunchPlan, course: Course | None = None) -> Launcher:
    """The launcher of a recorded job, its files open; nothing has started on the hosts yet.

    Raises:
        InfraError: the job's files could not be opened (a full disk); the record says so.
    """
    try:
        return Launcher(backend, ctx, plan, course)
    except OSError as exc:
        error = InfraError(f"cannot write the job's files into {ctx.store.job_dir(plan.job_id).root}: "
                           f"{exc.strerror or exc} (free space under DISTRUN_HOME, or point DISTRUN_HOME elsewhere)")
        with contextlib.suppress(DistrunError):
            ctx.store.end(plan.job_id, JobState.FAILED, int(error.exit_code), f"job {plan.job_id} not started: {error}")
        raise error from exc


# ---------------------------------------------------------------- one host


@dataclass
class HostRun:
    """One host's supervisor as the controller sees it, whichever backend started it.

    Its output (batches of lines and events, remote/stream.py) arrives through `on_data`, from a
    channel (`attach`) or from whatever the backend follows. Whatever goes wrong while handling
    it (a full disk, a locked database, a malformed event) is reported once and survived: the
    host's reader never dies of it, and the host is never taken for lost because of it.
    """

    plan: HostPlan
    sink: LogSink
    on_telemetry: Any = None
    proc: RemoteProcess | None = None  # the channel to the supervisor, where the backend has one
    last_seen: float = field(default_factory=time.monotonic)
    last_progress: float | None = None  # when a rank's line (not torchrun's own) last arrived; None: none yet
    exit_rc: int | None = None
    exit_error: str | None = None
    exit_reason: str | None = None  # why the supervisor ended the job itself, if it did
    oom_kills: int | None = None  # the kernel's OOM kills on the host during the job, as its supervisor counted
    exit_time: float | None = None  # when the exit event arrived (time.time())
    link_up: Callable[[], bool] | None = None  # whether the connection to the host still works (backend's)
    stop_sent: bool = False  # the controller asked this host to stop (before or after its exit)
    workers_at_stop: int | None = None  # the job's processes besides torchrun when the stop came (see supervisor)
    gpus_freed: list[str] = field(default_factory=list)  # GPU memory the end of the job freed (remote/gpu.py)
    failed_attempts: int = 0
    exited: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event | None = None  # set on exit, so the launcher need not wait for its next poll
    root_rank: int | None = None
    root_exit: int | None = None
    handling_errors: int = 0
    _in_root_cause: bool = False
    _reported: set[str] = field(default_factory=set)
    _reader: FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self._reader = FrameReader(self._guard(self.on_batch), self._guard(self.on_event_data),
                                   self._guard(self.on_line))

    @property
    def node(self) -> str:
        return self.plan.node

    def attach(self, proc: RemoteProcess) -> None:
        """Take the supervisor's channel: its output comes here; `send` writes to it."""
        self.proc = proc
        proc.stream_bytes(self.on_data, self.on_stderr, self.on_end)
        self.last_seen = time.monotonic()

    def send(self, message: dict[str, Any]) -> None:
        """A control message to the supervisor (`hb`, `stop`); nothing where there is no channel."""
        self.send_raw(json.dumps(message).encode() + b"\n")

    def send_raw(self, data: bytes) -> None:
        """Bytes to the supervisor's stdin (its bundle and configuration first)."""
        if self.proc is not None:
            self.proc.write(data)

    def on_data(self, data: bytes) -> None:
        """The next bytes of the supervisor's output, in chunks of any size. Hearing anything at
        all is the host's sign of life, before and whatever its handling does."""
        self.last_seen = time.monotonic()
        self._reader.feed(data)

    def on_end(self) -> None:
        """The supervisor's output ended: what is left of it is delivered."""
        self._reader.close()

    def on_batch(self, batch: Batch) -> None:
        if batch.rank is None:
            self._watch(batch.data.decode("utf-8", "replace"))
        else:
            self.last_progress = time.monotonic()  # a rank's lines, DISTRUN_METRICS lines included: the job moves
        self.sink.batch(self.node, batch)

    def on_line(self, line: bytes) -> None:
        """A line the supervisor wrote unframed (kept as a host line)."""
        self.sink.line(self.node, line.decode("utf-8", "replace"))

    def on_event_data(self, data: bytes) -> None:
        self.on_event(json.loads(data))

    def on_stderr(self, line: str) -> None:
        self._guard(self.sink.note)(self.node, f"supervisor: {line}")

    def _guard(self, handler: Any) -> Any:
        """`handler`, with any exception it raises reported (once per kind) and survived."""
        def guarded(*args: Any) -> None:
            try:
                handler(*args)
            except Exception as exc:
                self._failed_handling(exc)
        return guarded

    def _failed_handling(self, exc: Exception) -> None:
        self.handling_errors += 1
        kind = type(exc).__name__
        if kind in self._reported:
            return
        self._reported.add(kind)
        message = (f"error while handling this host's output ({kind}: {exc}); the job goes on, "
                   "and the next errors of this kind are only counted")
        try:
            self.sink.note(self.node, message)
        except Exception:
            sys.stderr.write(f"[{self.node}] distrun: {message}\n")

    def _watch(self, text: str) -> None:
        """Pick torchrun's own root-cause block and restarts out of its lines (the host's own)."""
        for line in text.splitlines():
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
            self.exit_reason = event.get("reason")
            self.oom_kills = event.get("oom_kills")
            self.workers_at_stop = event.get("workers_at_stop")
            self.gpus_freed = list(event.get("gpus_freed") or [])
            if self.exit_error:
                self._guard(self.sink.note)(self.node, self.exit_error)
            self._guard(self.sink.ended)(self.node)
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

    def silent_for(self, awake_since: float = 0.0) -> float:
        """Seconds since anything came from the host, counted only while the controller was awake."""
        return time.monotonic() - max(self.last_seen, awake_since)

    def reporting(self, lost_after: float, awake_since: float = 0.0) -> bool:
        """Whether the host may still report its exit: not ended, its channel open, not silent."""
        return not self.exited.is_set() and not self.channel_closed() and self.silent_for(awake_since) <= lost_after

    def last_lines(self, rank: int | None) -> tuple[str, ...]:
        """The last SUMMARY_LINES lines of a rank of this host (its stdout and stderr in the order
        they were read), else of the host itself."""
        lines = self.sink.last_lines(self.node, rank, SUMMARY_LINES) if rank is not None else ()
        return lines or self.sink.last_lines(self.node, None, SUMMARY_LINES)

    def failure(self, lost_after: float, awake_since: float = 0.0) -> Failure | None:
        """This host's failure as seen now: a non-zero exit, a stop its supervisor decided alone,
        a closed channel, or silence (counted from `awake_since`); else None."""
        if self.exited.is_set():
            return self._exit_failure()
        if self.channel_closed():
            return self.lost(self._closed_reason())
        if self.silent_for(awake_since) > lost_after:
            return self.lost(f"host lost: nothing heard for {lost_after:g} s (network cut or host down)")
        return None

    def _exit_failure(self) -> Failure | None:
        if self.ended_itself:
            return Failure(self.node, FailureKind.INFRA, reason=f"its supervisor ended the job: {self.exit_reason}",
                           address=self.plan.host, last_lines=self.last_lines(None),
                           time=self.exit_time or time.time())
        if not self.exit_rc:
            return None
        rc = self.root_exit or self.exit_rc
        reason = self.exit_error or (oom_reason(self.oom_kills) if rc == -signal.SIGKILL else "")
        return Failure.from_returncode(self.node, rc, rank=self.root_rank, reason=reason, address=self.plan.host,
                                       last_lines=self.last_lines(self.root_rank), time=self.exit_time or time.time())

    @property
    def ended_itself(self) -> bool:
        """The supervisor ended the job without being asked (the controller's heartbeat stopped, a signal)."""
        return bool(self.exit_reason) and not self.stop_sent and self.exit_reason != STOP_REQUESTED

    def _closed_reason(self) -> str:
        if self.link_up is not None and self.link_up():
            return "its supervisor ended without reporting an exit (killed?); the connection to the host is up"
        return "connection to the host closed"

    def lost(self, reason: str, kind: FailureKind = FailureKind.LOST) -> Failure:
        """A failure of this host that it did not report itself."""
        return Failure(self.node, kind, reason=reason, address=self.plan.host, last_lines=self.last_lines(None))

    def end(self) -> str:
        """How the host ended, for the summary's `Other hosts` line."""
        if self.stop_sent and self.exited.is_set():
            return STOPPED_BY_DISTRUN
        if self.exited.is_set() and self.ended_itself:
            return f"its supervisor ended the job: {self.exit_reason}"
        if self.exit_rc is None:
            return "no exit status"
        if self.exit_rc < 0:
            return Failure.from_returncode(self.node, self.exit_rc).describe()
        return f"exit code {self.exit_rc}"


def _masked(failure: Failure, mask: Masker) -> Failure:
    """The failure with its reason and last lines masked."""
    return replace(failure, reason=mask.text(failure.reason),
                   last_lines=tuple(mask.text(line) for line in failure.last_lines))


def _masked_attempts(course: Course, mask: Masker) -> list[dict[str, Any]]:
    """The record's attempts, each failure's reason and lines masked."""
    records = course.records()
    for record, attempt in zip(records, course.attempts, strict=True):
        if attempt.failure is not None:
            record["failure"] = _masked(attempt.failure, mask).to_dict()
    return records


class Launcher:
    """Follows a submitted job to its end through its backend's hooks, and records how it ended."""

    def __init__(self, backend: Backend, ctx: LaunchContext, plan: LaunchPlan, course: Course | None = None) -> None:
        self.backend = backend
        self.ctx = ctx
        self.plan = plan
        self.store = ctx.store
        self.record: JobRecord = ctx.store.get(plan.job_id)
        self.dir: JobDir = ctx.store.job_dir(plan.job_id)
        self.dir.create()
        self.monitor = telemetry.Monitor([h.node for h in plan.hosts], plan.telemetry_interval,
                                         self._on_alert, self._running, title=plan.job_id,
                                         world_size=plan.world_size)
        terminal = self.monitor.terminal(ctx.terminal, ctx.request.live)
        screen = None if terminal is None else Screen(terminal, ctx.colour(), ctx.request.collapse, plan.job_id)
        # The controller's attempts (DISTRUN_ATTEMPT 1, 2, ...) share the job's files; each line keeps its attempt.
        self.sink = LogSink(self.dir, screen, on_metrics=self._on_metrics, secrets=plan.secrets.values(),
                            attempt=plan.attempt)
        self.course = course or Course(ctx.job.restarts, len(plan.hosts), plan.spares)
        self.course.begin([h.node for h in plan.hosts], plan.master_port)
        self.verdict: Verdict | None = None  # set when this attempt failed: whether and where the next runs
        self.telemetry_lock = threading.Lock()
        self.telemetry_file = self.dir.open(self.dir.telemetry, "a", encoding="utf-8")  # closed in run()
        self.wake = threading.Event()
        self.hosts = [HostRun(h, self.sink, self._on_telemetry, wake=self.wake) for h in plan.hosts]
        self.awake_since = 0.0  # when the controller last woke from a freeze (monotonic; 0: never froze)
        self.ended = threading.Event()
        self.heartbeat = threading.Thread(target=self._heartbeats, daemon=True)
        self.stopped_hosts = False
        self.last_metrics: dict[str, Any] | None = None
        self.final_metrics: dict[str, Any] | None = None
        self.watchdog = Watchdog(plan.hang_timeout, self._last_progress)
        self.progress = Progress.MOVING
        self.diagnosis: Future[Failure] | None = None

    @property
    def interrupted(self) -> int | None:
        return self.ctx.interrupted

    def host(self, node: str) -> HostRun:
        return next(h for h in self.hosts if h.node == node)

    def _on_metrics(self, node: str, _rank: int | None, record: dict[str, Any]) -> None:
        self.monitor.metrics(node, record)
        if not job_wide(record):
            return
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
        """An alert is a log line of its host and part of the job's record (a database that
        cannot be written now is said, and the alert is recorded with the next one or at the end)."""
        self.sink.note(alert.node, alert.line())
        with self.telemetry_lock:
            self.record.alerts.append(alert.record())
            alerts = list(self.record.alerts)
        try:
            self.store.update(self.plan.job_id, alerts=alerts)
        except DistrunError as exc:
            self.sink.note(alert.node, f"warning: alert not recorded: {exc}")

    def _running(self, node: str) -> bool:
        return any(h.node == node and not h.exited.is_set() for h in self.hosts)

    def run(self) -> int:
        """Start every host, follow the job to its end, stop what is left; the exit code.

        Whatever fails in the controller on the way, every host still running is stopped before
        the error goes on.
        """
        try:
            self.monitor.start()
            return self._run()
        except BaseException as exc:
            if not self.stopped_hosts:
                self._stop_all(f"distrun failed: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.ended.set()
            self.monitor.stop()
            self.sink.close()
            self.telemetry_file.close()

    def _heartbeats(self) -> None:
        """Heartbeat every host each HEARTBEAT_EVERY seconds, apart from the run loop, so that a
        slow database or terminal never silences the controller; a longer pause means this
        process was frozen (see `_woke`)."""
        last = time.monotonic()
        while not self.ended.wait(HEARTBEAT_EVERY):
            last = self._woke(last)
            for host in self.hosts:
                host.send({"op": "hb"})

    def _woke(self, last: float) -> float:
        """Note a pause since `last` longer than FREEZE_GAP (the controller was stopped or starved):
        the hosts' silence is counted from now. Returns now."""
        now = time.monotonic()
        if now - last > FREEZE_GAP:
            self.awake_since = now
        return now

    def _run(self) -> int:
        failed = self.backend.start(self)
        self.heartbeat.start()
        try:
            self.store.update(self.plan.job_id, state=JobState.RUNNING)
        except DistrunError as exc:
            self.sink.note(self.hosts[0].node, f"warning: the job's record still says pending: {exc}")
        if not failed:
            failed = self._watch()
        if self.interrupted is not None:
            return self._finish_interrupted()
        ending = self.backend.conclude(self, failed)
        if ending.stopped is not None:
            self._stop_all("stopped outside distrun")
            return self._finish(JobState.STOPPED, int(ExitCode.TERMINATED), ending.stopped)
        if ending.failures:
            return self._finish_failed(ending.failures)
        return self._finish_succeeded()

    def _watch(self) -> list[Failure]:
        """Heartbeat every host and watch for the first failure, or the end of all.

        Returns:
            The failures seen (the first and those that followed it within SETTLE seconds),
            in host order; [] when every host ended well or distrun was interrupted.
        """
        last = time.monotonic()
        while self.interrupted is None:
            last = self._woke(last)
            failed = self.backend.failures(self)
            if failed:
                return self._settle(failed)
            if all(h.exited.is_set() for h in self.hosts):
                return []
            hang = self._check_progress()
            if hang is not None:
                return [hang]
            self.wake.wait(POLL)
            self.wake.clear()
        return []

    def _last_progress(self) -> float | None:
        return max((h.last_progress for h in self.hosts if h.last_progress is not None), default=None)

    def _check_progress(self) -> Failure | None:
        """Follow the watchdog: mark the job stalled or moving again; once hung, have its ranks'
        stacks dumped (in a thread: the loop goes on heartbeating) and return the hang when known."""
        if self.diagnosis is not None:
            return self.diagnosis.result() if self.diagnosis.done() else None
        progress = self.watchdog.check()
        if progress is Progress.HUNG:
            self._say_progress(progress)
            pool = ThreadPoolExecutor(1, thread_name_prefix="hang-diagnosis")
            self.diagnosis = pool.submit(diagnose, self.backend, self.store.get(self.plan.job_id), self.dir,
                                         self.plan.hang_timeout or 0, {h.node: h.host for h in self.plan.hosts})
            pool.shutdown(wait=False)
        elif progress is not self.progress:
            self._say_progress(progress)
        return None

    def _say_progress(self, progress: Progress) -> None:
        """A change of the watchdog's verdict: in the record (`ps`), the live view and the log."""
        self.progress = progress
        silent = self.watchdog.silent_for()
        if progress is Progress.MOVING:
            self.monitor.status = ""
            self.store.update(self.plan.job_id, state=JobState.RUNNING)
            self.sink.note(self.plan.hosts[0].node, "job progressing again")
            return
        since = time.strftime("%H:%M:%S", time.localtime(time.time() - silent))
        self.monitor.status = f"{progress.value}: no progress since {since}"
        self.store.update(self.plan.job_id, state=JobState.STALLED)
        what = "stalled" if progress is Progress.STALLED else "hung: dumping every rank's stack"
        self.sink.note(self.plan.hosts[0].node, f"job {what} (no progress from any rank for {silent:.0f} s, "
                                                f"hang_timeout {self.plan.hang_timeout:g} s)")

    def _settle(self, first: list[Failure]) -> list[Failure]:
        """Wait briefly for a failure's echoes on other hosts, so that the root cause is chosen
        among all of them (a lost host has no echoes to wait for: they came before it)."""
        seen = {f.host: f for f in first}
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline and first[0].kind is not FailureKind.LOST:
            for failure in self.backend.failures(self):
                seen.setdefault(failure.host, failure)
            time.sleep(POLL)
        return [seen[h.node] for h in self.hosts if h.node in seen]

    def _stop_all(self, reason: str) -> None:
        """Have the backend end every host still running, each told why in its log."""
        self.stopped_hosts = True
        live = [h for h in self.hosts if not h.exited.is_set()]
        for host in live:
            self.sink.note(host.node, f"stopping ({reason})")
            self.sink.stopping(host.node)
            host.stop_sent = True
        if live:
            self.backend.stop(self, live)

    def _finish(self, state: JobState, code: int, detail: str, failures: list[Failure] | None = None) -> int:
        extra = [*self.backend.finish(self), *(f"{h.node}: {line}" for h in self.hosts for line in h.gpus_freed)]
        self.sink.flush()
        # The lines still queued for the terminal go before the summary (or count as missed).
        self.sink.close_screen(SCREEN_DRAIN)
        self.monitor.stop()
        # The summary quotes the job's last lines: a secret the job printed is masked here too.
        mask = Masker(self.plan.secrets.values())
        self.course.end(None)
        detail = mask.text("\n".join([detail, *extra, *telemetry.summary_lines(self.record.alerts),
                                      *self.sink.shortfalls(), *self.course.lines()]))
        restarts = max((h.restarts for h in self.hosts), default=0)
        try:
            self.store.end(self.plan.job_id, state, code, detail, restarts=restarts,
                           failures=[_masked(f, mask).to_dict() for f in failures or []],
                           attempts=_masked_attempts(self.course, mask), quarantined=self.course.quarantined)
        except DistrunError as exc:
            # The hosts are stopped and the summary is known: say it, and why it is not recorded.
            detail += f"\ndistrun: warning: the job's end is not recorded: {exc}"
        self._say(detail)
        return code

    def _say(self, text: str) -> None:
        """The summary on the terminal (stderr when detached); its host lines escaped."""
        out = self.ctx.terminal or sys.stderr
        out.write(escape_controls(text) + "\n")
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
        if root.host in {h.node for h in self.hosts}:
            # Lines that arrived while the others were stopped belong to the root cause's story too.
            root = replace(root, last_lines=self.host(root.host).last_lines(root.rank) or root.last_lines)
        root = replace(root, after_final=self._final_before(root.time), barrier_hosts=tuple(
            h.node for h in self.hosts if h.node != root.host and h.stop_sent and h.workers_at_stop == 0))
        own = {f.host: f for f in failures}
        others = {h.node: own[h.node].describe() if h.node in own else h.end()
                  for h in self.hosts if h.node != root.host}
        ordered = [root, *(f for f in failures if f.host != root.host)]
        self.verdict = self.course.verdict(root)
        self.course.end(root, self.verdict.quarantined if self.verdict else None)
        if self.verdict is not None and self.verdict.hosts is not None:
            title = f"{self.plan.job_id} attempt {self.plan.attempt}"
            return self._end_attempt(failed_summary(title, root, others), self.verdict)
        summary = failed_summary(self.plan.job_id, root, others)
        if self.verdict is not None:
            summary += f"\n{self.verdict.why}"
        return self._finish(JobState.FAILED, int(ExitCode.FAILED), summary, ordered)

    def _end_attempt(self, summary: str, verdict: Verdict) -> int:
        """This attempt failed and another follows: record the attempt, say why and what comes
        next; the job goes on (its record stays running)."""
        backoff = self.course.policy.backoff
        restarting = f"restarting: {verdict.why}" + (f" in {backoff:g} s" if backoff else "")
        self.sink.note(self.plan.hosts[0].node, restarting)
        summary = "\n".join([summary, *self.backend.finish(self)])
        self.sink.flush()
        self.sink.close_screen(SCREEN_DRAIN)
        self.monitor.stop()
        mask = Masker(self.plan.secrets.values())
        try:
            self.store.update(self.plan.job_id, attempts=_masked_attempts(self.course, mask),
                              quarantined=self.course.quarantined)
        except DistrunError as exc:
            summary += f"\ndistrun: warning: the attempt is not recorded: {exc}"
        self._say(mask.text(f"{summary}\n{restarting}"))
        return int(ExitCode.FAILED)


    def _final_before(self, when: float) -> bool:
        """Whether the job's final metrics line had arrived by `when` (seconds since the epoch)."""
        final = self.final_metrics
        return final is not None and float(final.get("t", when)) <= when

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
