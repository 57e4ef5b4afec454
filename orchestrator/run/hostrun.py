"""One host of a running job as the run loop sees it, whichever backend started it: its output
decoded, its exit, its silence, and its failure.

A host's failure is data its supervisor sent in its `exit` event: torchrun's record of each
failed worker (remote/workerfail.py; the first by time is the host's failed rank) and who had
the supervisor stop the job (`StopCause`). Nothing torchrun or distrun print is parsed for it;
only a worker's exception, where its record has none (no `@record`), is the one its own last
lines end with (failures.py's `own_error`).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.backends.run import Channel
from orchestrator.console.terminal import show
from orchestrator.diagnose.ending import Ending, HostEnd, describe, ending
from orchestrator.diagnose.failures import STOPPED_BY_DISTRUN, Failure, FailureKind, oom_reason, own_error
from orchestrator.logs import LogSink
from orchestrator.logs.fold import only_harmless
from orchestrator.logs.format import note
from orchestrator.plan import HostPlan
from orchestrator.remote.stream import Batch, FrameReader
from orchestrator.remote.supervisor import StopCause
from orchestrator.remote.workerfail import WorkerRecord, first_failure

SUMMARY_LINES = 20
ERROR_LINES = 50  # a rank's last lines read for the exception they end with (as many as the sink keeps)


@dataclass
class HostRun:
    """One host's supervisor as the controller sees it, whichever backend started it.

    Its output (batches of lines and events, remote/stream.py) arrives through `on_data`, from
    the supervisor's channel (`attach`) or from whatever the backend follows. Whatever goes wrong while handling
    it (a full disk, a locked database, a malformed event) is reported once and survived: the
    host's reader never dies of it, and the host is never taken for lost because of it.
    """

    plan: HostPlan
    sink: LogSink
    on_telemetry: Any = None
    channel: Channel | None = None  # the channel to the supervisor, where the backend has one
    last_seen: float = field(default_factory=time.monotonic)
    behind_at: float = 0.0  # when its output last waited unread in this controller (monotonic; 0: never)
    last_progress: float | None = None  # when a rank's line (not torchrun's own) last arrived; None: none yet
    rank_lines: dict[int, float] = field(default_factory=dict)  # each rank's last line's arrival (time.time())
    started: bool = False  # its supervisor said it started torchrun
    exit_rc: int | None = None
    exit_error: str | None = None
    refused: bool = False  # its supervisor refused the job's settings (an unsafe checkpoint_dir) before it started
    exit_reason: str | None = None  # why the supervisor ended the job, in words, if it did
    stop_cause: StopCause | None = None  # who had the supervisor end the job, if anyone did
    workers: list[WorkerRecord] = field(default_factory=list)  # torchrun's records of its failed workers
    oom_kills: int | None = None  # the kernel's OOM kills on the host during the job, as its supervisor counted
    exit_time: float | None = None  # when the exit event arrived (time.time())
    failing_time: float | None = None  # when torchrun's records of failed workers arrived, before its exit
    stop_sent: bool = False  # the controller asked this host to stop (before or after its exit)
    workers_at_stop: int | None = None  # the job's processes besides torchrun when the stop came (see supervisor)
    alive_at_stop: list[int] | None = None  # their pids when the stop signalled torchrun (None: it did not)
    raised_at_stop: list[int] = field(default_factory=list)  # the ranks that had raised by the stop
    gpus_freed: list[str] = field(default_factory=list)  # GPU memory the end of the job freed (remote/gpu.py)
    restarts: int = 0  # torchrun's restarts of its workers, as its supervisor counted them
    exited: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event | None = None  # set on exit, so the attempt need not wait for its next poll
    handling_errors: int = 0
    _reported: set[str] = field(default_factory=set)
    _reader: FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self._reader = FrameReader(self._guard(self.on_batch), self._guard(self.on_event_data),
                                   self._guard(self.on_line))

    @property
    def node(self) -> str:
        return self.plan.node

    def attach(self, channel: Channel) -> None:
        """Take the supervisor's channel: `send` writes to it; its output comes to `on_data`."""
        self.channel = channel
        self.last_seen = time.monotonic()

    def send(self, message: dict[str, Any]) -> None:
        """A control message to the supervisor (`hb`); nothing where there is no channel."""
        if self.channel is not None:
            self.channel.write(json.dumps(message).encode() + b"\n")

    def heard(self) -> None:
        """A sign of life that came otherwise than as output (the host has not started yet)."""
        self.last_seen = time.monotonic()

    def on_data(self, data: bytes) -> None:
        """The next bytes of the supervisor's output, in chunks of any size. Hearing anything at
        all is the host's sign of life, before and whatever its handling does."""
        self.last_seen = time.monotonic()
        self._reader.feed(data)

    def on_end(self) -> None:
        """The supervisor's output ended: what is left of it is delivered."""
        self._reader.close()

    def on_batch(self, batch: Batch) -> None:
        if batch.rank is not None and not only_harmless(batch.data):
            self.last_progress = time.monotonic()  # a rank's lines, DISTRUN_METRICS lines included: the job moves
            self.rank_lines[batch.rank] = time.time()
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
            show(note(self.node, message), err=True)

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "exit":
            self.exit_time = time.time()
            self.exit_rc = int(event.get("rc", 1))
            self.exit_error = event.get("error")
            self.refused = bool(event.get("refused"))
            self.exit_reason = event.get("reason")
            self._read_ending(event)
            self.oom_kills = event.get("oom_kills")
            self.workers_at_stop = event.get("workers_at_stop")
            alive = event.get("alive_at_stop")
            self.alive_at_stop = None if alive is None else [int(pid) for pid in alive]
            self.raised_at_stop = [int(rank) for rank in event.get("raised_at_stop") or ()]
            self.gpus_freed = list(event.get("gpus_freed") or [])
            if self.exit_error:
                self._guard(self.sink.note)(self.node, self.exit_error)
            self._guard(self.sink.ended)(self.node)
            self.exited.set()
            if self.wake is not None:
                self.wake.set()
        elif kind == "started":
            self.started = True
        elif kind == "failing":
            self._read_workers(event)
            self.failing_time = time.time()
            if self.wake is not None:
                self.wake.set()
        elif kind == "note":
            self.sink.note(self.node, str(event.get("msg")))
        elif kind in ("tel", "fr") and self.on_telemetry is not None:
            self.on_telemetry(self.node, event)

    def _read_ending(self, event: dict[str, Any]) -> None:
        """The exit event's stop cause, worker records and torchrun's restarts; malformed ones are
        reported and taken as absent, so that the exit itself still counts."""
        try:
            self.stop_cause = StopCause(event["stop_cause"]) if event.get("stop_cause") else None
            self.restarts = int(event.get("restarts") or 0)
        except (ValueError, TypeError) as exc:
            self._failed_handling(exc)
        self._read_workers(event)

    def _read_workers(self, event: dict[str, Any]) -> None:
        """torchrun's records of its failed workers, from a `failing` or `exit` event; malformed ones
        are reported and taken as absent."""
        try:
            self.workers = [WorkerRecord.from_event(worker) for worker in event.get("workers") or ()]
        except (ValueError, TypeError) as exc:
            self._failed_handling(exc)

    def channel_closed(self) -> bool:
        return self.channel is not None and self.channel.closed() and not self.exited.is_set()

    def silent_for(self, awake_since: float = 0.0) -> float:
        """Seconds since anything came from the host, counted only while the controller was awake
        and had read what the host sent."""
        return time.monotonic() - max(self.last_seen, awake_since, self.behind_at)

    def silent(self, lost_after: float, awake_since: float = 0.0) -> bool:
        """Whether the host said nothing for more than `lost_after` seconds. Output of the host that
        waits unread in this controller is a word from it: its silence counts from now on."""
        if self.silent_for(awake_since) <= lost_after:
            return False
        if not self.output_waiting():
            return True
        self.behind_at = time.monotonic()
        return False

    def output_waiting(self) -> bool:
        """Whether output of the host reached this controller and waits unread (the controller is behind)."""
        return self.channel is not None and self.channel.behind()

    def reporting(self, lost_after: float, awake_since: float = 0.0) -> bool:
        """Whether the host may still report its exit: not ended, its channel open, not silent."""
        return not self.exited.is_set() and not self.channel_closed() and not self.silent(lost_after, awake_since)

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
        if self.failing_time is not None:  # torchrun recorded its failed workers and is exiting
            return self._worker_failure(first_failure(self.workers), 1, "", self.failing_time)
        if self.channel_closed():
            return self.lost(self._closed_reason())
        if self.silent(lost_after, awake_since):
            return self.lost(f"host lost: nothing heard for {lost_after:g} s (network cut or host down)")
        return None

    def _exit_failure(self) -> Failure | None:
        if self.ended_itself:
            return Failure(self.node, FailureKind.INFRA, reason=f"its supervisor ended the job: {self.exit_reason}",
                           address=self.plan.host, last_lines=self.last_lines(None),
                           time=self.exit_time or time.time(), stopped=self.stop_cause is StopCause.SIGNAL)
        if not self.exit_rc:
            return None
        return self._worker_failure(first_failure(self.workers), self.exit_rc, self.exit_error or "",
                                    self.exit_time or time.time())

    def _worker_failure(self, first: WorkerRecord | None, exit_rc: int, error: str, when: float) -> Failure:
        """The host's failure: its first failed worker as torchrun recorded it, else torchrun's own
        exit code `exit_rc`."""
        rc = first.exitcode if first is not None else exit_rc
        reason = error or (oom_reason(self.oom_kills) if rc == -signal.SIGKILL else "")
        seen = {"reason": reason, "address": self.plan.host, "time": when,
                "stopped": self.stop_sent or self.stop_cause is not None}
        if first is None:  # no worker record: torchrun itself failed or was killed, or none was written
            return Failure.from_returncode(self.node, rc, last_lines=self.last_lines(None), **seen)
        # Only a worker that still ran, and had not raised, when distrun's stop signalled its torchrun
        # was stopped by distrun; one that had ended before (torchrun's own teardown included) failed
        # on its own, stop or not.
        seen["stopped"] = first.pid in (self.alive_at_stop or ()) and first.rank not in self.raised_at_stop
        return Failure.from_worker(self.node, self._told(first), last_lines=self.last_lines(first.rank), **seen)

    def _told(self, worker: WorkerRecord) -> WorkerRecord:
        """torchrun's record of a worker, with the exception the worker's own last lines end with when
        the record has none (a program without `@record`)."""
        if worker.traceback:
            return worker
        said = own_error(self.sink.last_lines(self.node, worker.rank, ERROR_LINES), worker.signal)
        return replace(worker, message=said["message"], traceback="\n".join(said["traceback"])) if said else worker

    def retold(self, failure: Failure) -> Failure:
        """This host's `failure` with its rank's last lines as they are now (lines that arrived while the
        others were stopped belong to its story too), and the exception they end with if it had none."""
        lines = self.last_lines(failure.rank) or failure.last_lines
        said: dict[str, Any] = {}
        if failure.kind in (FailureKind.EXIT, FailureKind.SIGNAL) and failure.rank is not None and not failure.message:
            said = own_error(self.sink.last_lines(self.node, failure.rank, ERROR_LINES), failure.signal)
        return replace(failure, last_lines=lines, **said)

    @property
    def ended_itself(self) -> bool:
        """The supervisor ended the job without being asked (the controller's heartbeat stopped, a signal)."""
        return self.stop_cause not in (None, StopCause.CONTROLLER) and not self.stop_sent

    def _closed_reason(self) -> str:
        if self.channel is not None and self.channel.link_up():
            return "its supervisor ended without reporting an exit (killed?); the connection to the host is up"
        return "connection to the host closed"

    def lost(self, reason: str, kind: FailureKind = FailureKind.LOST) -> Failure:
        """A failure of this host that it did not report itself. A lost host's last lines are its
        own (its ranks' and torchrun's), never distrun's notes about it."""
        lines = self.sink.own_lines(self.node, SUMMARY_LINES) if kind is FailureKind.LOST else self.last_lines(None)
        return Failure(self.node, kind, reason=reason, address=self.plan.host, last_lines=lines)

    @property
    def ending(self) -> HostEnd:
        """What its supervisor reported of its end: torchrun's records and the pids alive at the stop."""
        return HostEnd(tuple(self._told(worker) for worker in self.workers), self.alive_at_stop,
                       tuple(self.raised_at_stop))

    @property
    def in_exit_barrier(self) -> bool:
        """Every rank of the host had returned from its main when distrun's stop reached its torchrun."""
        return self.exited.is_set() and not self.ended_itself and ending(self.ending) is Ending.BARRIER

    def end(self, failure: Failure | None = None) -> str:
        """How the host ended, for the summary's `Other hosts` line: decided from torchrun's records
        against the moment distrun's stop reached it (diagnose/ending.py); else its own `failure`,
        when it reported one that distrun's stop did not cause."""
        reported = self.exited.is_set() and not self.ended_itself
        own = failure.describe() if failure is not None and not failure.stopped else None
        if reported and (self.workers or self.alive_at_stop is not None):  # what torchrun and the stop saw
            return describe(self.ending, own or self._own_exit())
        if own is not None:
            return own
        if self.stop_sent and self.exited.is_set():
            return STOPPED_BY_DISTRUN
        return self._own_exit()

    def _own_exit(self) -> str:
        """How the host exited by itself, in words."""
        if self.exited.is_set() and self.ended_itself:
            return f"its supervisor ended the job: {self.exit_reason}"
        if self.exit_rc is None:
            return "no exit status"
        if self.exit_rc < 0:
            return Failure.from_returncode(self.node, self.exit_rc).describe()
        return f"exit code {self.exit_rc}"

