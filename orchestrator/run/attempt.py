"""One attempt of a job, followed to its end: the run loop written once for every backend.

`Attempt` starts every host through its backend (orchestrator/backends/base.py lists the hooks
in order), heartbeats them, watches for the first failure (a host's torchrun exiting non-zero, a
host going silent, a hang), stops every other host and records the summary, which leads with the
root cause (failures.root_cause), as torch elastic's does. The backend sees the attempt through
`AttemptView` only (backends/run.py's RunView and HostEvents), never the Attempt or its HostRuns.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from orchestrator import telemetry
from orchestrator.backends.base import Backend
from orchestrator.backends.run import Channel
from orchestrator.console.terminal import show
from orchestrator.diagnose.at_exit import neighbours_finished, when_failed
from orchestrator.diagnose.failures import Failure, FailureKind, failed_summary, root_cause
from orchestrator.diagnose.progress import progress_lines
from orchestrator.diagnose.watchdog import Looked, Progress, Stall, Stalls, Watchdog, diagnose, look_at_stall
from orchestrator.errors import DistrunError, ExitCode, UsageError
from orchestrator.logs import LogSink
from orchestrator.logs.screen import Screen
from orchestrator.logs.sink import job_wide
from orchestrator.plan import LaunchPlan
from orchestrator.remote.redact import Masker
from orchestrator.run.hostrun import HostRun
from orchestrator.run.recording import Launching
from orchestrator.run.restarts import AttemptHistory, Verdict
from orchestrator.run.summary import masked, masked_attempts, succeeded_summary
from orchestrator.store import JobDir, JobRecord, JobState
from orchestrator.telemetry.rendezvous import RendezvousWatch

HEARTBEAT_EVERY = 1.0
POLL = 0.05
# A pause this long in the controller's own loop means it was stopped (SIGSTOP) or starved:
# hosts' silence is then counted from when it woke, not blamed on them.
FREEZE_GAP = 2.0
SETTLE = 1.5  # after a first failure, how long to wait for its peers' failures before blaming one
PROGRESS_EVERY = 5.0  # seconds between two records of the ranks' progress (`ps`, `top`)
SCREEN_DRAIN = 5.0  # at the end, how long the terminal gets to show the lines still queued for it


class Attempt:
    """Follows a submitted job to its end through its backend's hooks, and records how it ended."""

    def __init__(self, backend: Backend, launching: Launching, plan: LaunchPlan,
                 history: AttemptHistory | None = None) -> None:
        self.backend = backend
        self.ctx = ctx = launching.ctx
        self.plan = plan
        self.store = launching.store
        self.record: JobRecord = self.store.get(plan.job_id)
        self.dir: JobDir = ctx.files
        self.dir.create()
        self.monitor = telemetry.Monitor([h.node for h in plan.hosts], plan.telemetry_interval,
                                         self._on_alerts, self._running, title=plan.job_id,
                                         world_size=plan.world_size, waiting=self._waiting)
        terminal = self.monitor.terminal(ctx.terminal, launching.request.live)
        screen = None if terminal is None else Screen(terminal, launching.colour(), launching.request.collapse,
                                                      plan.job_id, job_dir=self.dir.root,
                                                      data_lines=launching.request.metrics_lines)
        # The controller's attempts (DISTRUN_ATTEMPT 1, 2, ...) share the job's files; each line keeps its attempt.
        self.sink = LogSink(self.dir, screen, on_metrics=self._on_metrics, secrets=plan.secrets.values(),
                            attempt=plan.attempt)
        self.history = history or AttemptHistory(ctx.job.restarts, len(plan.hosts), plan.spares)
        self.history.begin([h.node for h in plan.hosts], plan.master_port)
        self.verdict: Verdict | None = None  # set when this attempt failed: whether and where the next runs
        self.telemetry_lock = threading.Lock()
        self.telemetry_file = self.dir.open(self.dir.telemetry, "a", encoding="utf-8")  # closed in run()
        self.collectives_file = self.dir.open(self.dir.collectives, "a", encoding="utf-8")  # closed in run()
        self.wake = threading.Event()
        self.hosts = [HostRun(h, self.sink, self._on_telemetry, wake=self.wake) for h in plan.hosts]
        self.by_node = {h.node: h for h in self.hosts}  # a lookup per host per second is O(n²) as a scan
        self.awake_since = 0.0  # when the controller last woke from a freeze (monotonic; 0: never froze)
        self.ended = threading.Event()
        self.heartbeat = threading.Thread(target=self._heartbeats, daemon=True)
        self.stopped_hosts = False
        self.last_metrics: dict[str, Any] | None = None
        self.progress_saved = 0.0  # when the ranks' progress was last recorded (monotonic)
        self.final_metrics: dict[str, Any] | None = None
        self.stalls = Stalls(plan.stall_after)
        self.watchdog = Watchdog(plan.hang_timeout, self._last_progress, self.stalls)
        self.progress = Progress.MOVING
        self.state = JobState.PENDING  # as the record says while the attempt runs (running, stalled)
        self.diagnosis: Future[Failure] | None = None
        self.stall_look: Future[Looked] | None = None
        self.view = AttemptView(self)
        self.rdzv: RendezvousWatch | None = None  # while no host is past the rendezvous (with telemetry)
        self.rdzv_checked = 0.0

    @property
    def interrupted(self) -> int | None:
        return self.ctx.interrupted

    def host(self, node: str) -> HostRun:
        return self.by_node[node]

    def _on_metrics(self, node: str, _rank: int | None, record: dict[str, Any]) -> None:
        self.monitor.metrics(node, record)
        if not job_wide(record):
            return
        self.last_metrics = record
        if record.get("final"):
            self.final_metrics = record

    def _on_telemetry(self, node: str, event: dict[str, Any]) -> None:
        """A host's telemetry sample, or its ranks' Flight Recorders (`fr`: progress and stragglers)."""
        if event.get("ev") == "fr":
            kept = {"t": round(time.time(), 3), "node": node, **{k: v for k, v in event.items() if k != "ev"}}
            with self.telemetry_lock:
                self.collectives_file.write(json.dumps(kept) + "\n")
                self.collectives_file.flush()
            progress = self.monitor.flight(node, event)
            self.stalls.completed(progress.get("collectives") or 0)
            if time.monotonic() - self.progress_saved >= PROGRESS_EVERY:
                self.progress_saved = time.monotonic()
                with contextlib.suppress(DistrunError):  # recorded with the next event, or at the end
                    self.store.update(self.plan.job_id, progress=progress)
            return
        sample = {k: v for k, v in event.items() if k != "ev"}
        sample.setdefault("node", node)
        if self.rdzv is not None:
            self.rdzv.sample(node, sample)
        with self.telemetry_lock:
            self.telemetry_file.write(json.dumps(sample) + "\n")
            self.telemetry_file.flush()
        self.monitor.sample(node, sample)

    def _on_alerts(self, fired: list[telemetry.Alert]) -> None:
        """An alert is a log line of its host and part of the job's record, alerts that fired
        together in one write (a database that cannot be written now is said, and the alerts are
        recorded with the next ones or at the end)."""
        for alert in fired:
            self.sink.note(alert.node, alert.line())
        with self.telemetry_lock:
            self.record.alerts += [alert.record() for alert in fired]
            alerts = list(self.record.alerts)
        try:
            self.store.update(self.plan.job_id, alerts=alerts)
        except DistrunError as exc:
            self.sink.note(fired[0].node, f"warning: alert(s) not recorded: {exc}")

    def _running(self, node: str) -> bool:
        host = self.by_node.get(node)
        return host is not None and not host.exited.is_set()

    def _waiting(self, node: str) -> bool:
        host = self.by_node.get(node)
        return host is not None and host.output_waiting()

    def run(self) -> int:
        """Start every host, follow the job to its end, stop what is left; the exit code.

        Whatever fails in the controller on the way, every host still running is stopped before
        the error goes on, and the job is recorded as failed for that reason (not lost).
        """
        try:
            self.monitor.start()
            return self._run()
        except BaseException as exc:
            why = f"distrun failed: {type(exc).__name__}: {exc}"
            if not self.stopped_hosts:
                self._stop_all(why)
            if isinstance(exc, Exception):
                self._record_own_error(why)
            raise
        finally:
            self.ended.set()
            self.monitor.stop()
            self.sink.close()
            self.telemetry_file.close()
            self.collectives_file.close()

    def _record_own_error(self, why: str) -> None:
        """The job's end when the controller itself failed and stopped it: failed, for that reason."""
        detail = Masker(self.plan.secrets.values()).text(
            f"job {self.plan.job_id} FAILED: {why}; distrun stopped every host's processes")
        with contextlib.suppress(DistrunError, OSError):
            self.store.end(self.plan.job_id, JobState.FAILED, int(ExitCode.FAILED), detail)

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
        plan = self.plan
        if plan.telemetry_interval:
            self.rdzv = RendezvousWatch([h.node for h in plan.hosts], plan.master_node, plan.master_addr,
                                        plan.master_port, plan.rdzv_report_after, time.monotonic())
        failed = self.backend.start(self.view)
        self.heartbeat.start()
        self.state = JobState.RUNNING
        try:
            self.store.update(self.plan.job_id, state=JobState.RUNNING)
        except DistrunError as exc:
            self.sink.note(self.hosts[0].node, f"warning: the job's record still says pending: {exc}")
        if not failed:
            failed = self._watch()
        if self.interrupted is not None:
            return self._finish_interrupted()
        self._raise_refusal()
        ending = self.backend.conclude(self.view, failed)
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
            failed = self.backend.failures(self.view)
            if failed:
                return self._settle(failed)
            if all(h.exited.is_set() for h in self.hosts):
                return []
            self._follow_rendezvous()
            hang = self._check_progress()
            if hang is not None:
                return [hang]
            self.wake.wait(POLL)
            self.wake.clear()
        return []

    def _follow_rendezvous(self) -> None:
        """Once a second while no host is past the rendezvous: say what the launch waits for, and
        after `rendezvous.report_after` name the hosts that never joined (telemetry/rendezvous.py)."""
        watch, now = self.rdzv, time.monotonic()
        if watch is None or watch.done or now - self.rdzv_checked < 1.0:
            return
        self.rdzv_checked = now
        for host in self.hosts:
            if host.started:
                watch.started(host.node)
            if host.rank_lines or host.exited.is_set():
                watch.past()
        said = watch.check(now)
        for line in said.lines:
            self.sink.note(self.plan.master_node, line)
        if said.alerts:
            self._on_alerts(said.alerts)
        for line in said.advice:
            self.sink.note(self.plan.master_node, line)

    def _last_progress(self) -> float | None:
        """When any rank last progressed: its last line, or a collective its Flight Recorder showed."""
        lines = max((h.last_progress for h in self.hosts if h.last_progress is not None), default=None)
        return None if lines is None else max(lines, self.stalls.flight_progress or lines)

    def _check_progress(self) -> Failure | None:
        """Follow the watchdog: mark the job stalled or moving again; once hung, have its ranks'
        stacks dumped (in a thread: the loop goes on heartbeating) and return the hang when known."""
        if self.diagnosis is not None:
            return self.diagnosis.result() if self.diagnosis.done() else None
        self._follow_stalls()
        progress = self.watchdog.check()
        if progress is Progress.HUNG:
            self._say_progress(progress)
            pool = ThreadPoolExecutor(1, thread_name_prefix="hang-diagnosis")
            self.diagnosis = pool.submit(diagnose, self.backend, self.store.get(self.plan.job_id), self.dir,
                                         self.plan.hang_timeout or 0, {h.node: h.host for h in self.plan.hosts},
                                         Masker(self.plan.secrets.values()))
            pool.shutdown(wait=False)
        elif progress is not self.progress:
            self._say_progress(progress)
        return None

    def _follow_stalls(self) -> None:
        """stall_after: once no rank progressed for it, look at every rank (in a thread, never
        stopping anything); say a stall the look confirms, and its end when the job moves again."""
        last = self._last_progress()
        self.stalls.progressed(last)  # the watchdog then finds the job moving again, and says so
        if self.stall_look is not None:
            if self.stall_look.done():
                stall = self.stalls.found(self.stall_look.result())
                self.stall_look = None
                if stall is not None:
                    self._say_stall(stall)
            return
        if last is not None and self.stalls.due(last):
            self.stalls.looking(last)
            lines = {rank: when for h in self.hosts for rank, when in h.rank_lines.items()}
            pool = ThreadPoolExecutor(1, thread_name_prefix="stall-look")
            self.stall_look = pool.submit(look_at_stall, self.backend, self.store.get(self.plan.job_id), self.dir,
                                          self.plan.stall_after or 0, {h.node: h.host for h in self.plan.hosts},
                                          Masker(self.plan.secrets.values()), lines)
            pool.shutdown(wait=False)

    def _say_stall(self, stall: Stall) -> None:
        """A stall the look confirmed: live (its lines in the log, an alert) and kept in the record."""
        node = stall.failure.host or self.plan.hosts[0].node
        self._say_progress(Progress.STALLED)
        for line in stall.lines()[1:]:
            self.sink.note(node, line.strip())
        self._on_alerts([telemetry.Alert(node, "stall", f"stall: {stall.verdict()}")])

    def _say_progress(self, progress: Progress) -> None:
        """A change of the watchdog's verdict: in the record (`ps`), the live view and the log."""
        self.progress = progress
        silent = self.watchdog.silent_for()
        if progress is Progress.MOVING:
            self.monitor.status = ""
            self.state = JobState.RUNNING
            self.store.update(self.plan.job_id, state=JobState.RUNNING)
            self.sink.note(self.plan.hosts[0].node, "job progressing again")
            return
        since = time.strftime("%H:%M:%S", time.localtime(time.time() - silent))
        self.monitor.status = f"{progress.value}: no progress since {since}"
        self.state = JobState.STALLED
        if self.stalls.current is not None and progress is Progress.STALLED:
            self.monitor.status += f"; {self.stalls.current.verdict().split('; ', 1)[-1]}"
        self.store.update(self.plan.job_id, state=JobState.STALLED)
        what = "stalled" if progress is Progress.STALLED else "hung: dumping every rank's stack"
        limit = f", hang_timeout {self.plan.hang_timeout:g} s" if self.plan.hang_timeout is not None else ""
        self.sink.note(self.plan.hosts[0].node, f"job {what} (no progress from any rank for {silent:.0f} s{limit})")

    def _settle(self, first: list[Failure]) -> list[Failure]:
        """Stop every other host at once, then wait briefly for the failures it had already
        seen on them, so that the root cause is chosen among all of them (a lost host has no
        echoes to wait for: they came before it). Whether a host failed before the stop reached it
        is in its own records (diagnose/ending.py), not in when its report arrived."""
        # A host whose torchrun has recorded its failed workers is exiting by itself: it is stopped
        # below only if it is still running once the others have been.
        exiting = {h.node for h in self.hosts if h.failing_time is not None}
        self._stop_all(f"{first[0].host} failed" if first[0].host else "the job failed", spare=exiting)
        seen = {f.host: f for f in first}
        deadline = time.monotonic() + SETTLE
        while (time.monotonic() < deadline and first[0].kind is not FailureKind.LOST
               and not all(h.exited.is_set() for h in self.hosts)):
            for failure in self.backend.failures(self.view):
                seen.setdefault(failure.host, failure)
            time.sleep(POLL)
        for failure in self.backend.failures(self.view):
            seen.setdefault(failure.host, failure)
        return [seen[h.node] for h in self.hosts if h.node in seen]

    def _stop_all(self, reason: str, spare: set[str] | frozenset[str] = frozenset()) -> None:
        """Have the backend end every host still running but those in `spare` and those already
        told to stop (each host is stopped once), each told why in its log."""
        self.stopped_hosts = True
        live = [h for h in self.hosts if not h.exited.is_set() and not h.stop_sent and h.node not in spare]
        self.sink.notes([host.node for host in live], f"stopping ({reason})")
        for host in live:
            self.sink.stopping(host.node)
            host.stop_sent = True
        if live:
            self.backend.stop(self.view, [h.node for h in live])

    def _finish(self, state: JobState, code: int, detail: str, failures: list[Failure] | None = None,
                said: str | None = None) -> int:
        """Record the job's end with `detail` and say it (`said` in its place on the screen, when given)."""
        gpus_freed = [f"{h.node}: {line}" for h in self.hosts for line in h.gpus_freed]
        extra = [*self.backend.finish(self.view), *gpus_freed]
        self.sink.flush()
        # The lines still queued for the terminal go before the summary (or count as missed).
        self.sink.close_screen(SCREEN_DRAIN)
        self.monitor.stop()
        # The summary quotes the job's last lines: a secret the job printed is masked here too.
        mask = Masker(self.plan.secrets.values())
        self.history.end(None, state=state.value)
        progress = self.monitor.progress_now(ended=True)
        tail = [*extra, *self.stalls.lines(), *progress_lines(progress, self.last_metrics),
                *telemetry.summary_lines(self.record.alerts), *self.sink.shortfalls(), *self.history.lines()]
        said = mask.text("\n".join([said or detail, *tail]))
        detail = mask.text("\n".join([detail, *tail]))
        restarts = max((h.restarts for h in self.hosts), default=0)
        try:
            self.store.end(self.plan.job_id, state, code, detail, restarts=restarts,
                           failures=[masked(f, mask).to_dict() for f in failures or []],
                           attempts=masked_attempts(self.history, mask), quarantined=self.history.quarantined,
                           gpus_freed=gpus_freed, progress=progress)
        except DistrunError as exc:
            # The hosts are stopped and the summary is known: say it, and why it is not recorded.
            said += f"\ndistrun: warning: the job's end is not recorded: {exc}"
        self._say(said)
        return code

    def _say(self, text: str) -> None:
        """The summary on the terminal (stderr when detached); its host lines escaped."""
        show(text, stream=self.ctx.terminal or sys.stderr, flush=True)

    def _raise_refusal(self) -> None:
        """A host's supervisor refused the job's settings before starting it (an unsafe checkpoint_dir,
        which on Slurm only the node can check): stop the others, record a usage error, say it in one line.

        Raises:
            UsageError: `node: why; the fix`.
        """
        refused = next((h for h in self.hosts if h.refused), None)
        if refused is None:
            return
        message = f"{refused.node}: {refused.exit_error}"
        self._stop_all(f"{refused.node} refused the job")
        self.backend.finish(self.view)
        self.store.end(self.plan.job_id, JobState.FAILED, int(ExitCode.USAGE), message)
        raise UsageError(message)

    def _finish_interrupted(self) -> int:
        name = signal.Signals(self.interrupted or signal.SIGINT).name
        self._stop_all(f"distrun got {name}")
        code = ExitCode.INTERRUPTED if self.interrupted == signal.SIGINT else ExitCode.TERMINATED
        return self._finish(JobState.STOPPED, int(code), f"job {self.plan.job_id} stopped ({name}); "
                            f"every host's processes ended")

    def _finish_failed(self, failures: list[Failure]) -> int:
        """Stop every host, then record and show the root cause and how each other host ended."""
        root = root_cause(failures)
        self.sink.failed_rank(root.host, root.rank)
        self._stop_all(f"{root.host} failed" if root.host else "the job failed")  # what is still running
        root = self._as_exited(root)
        if root.host in {h.node for h in self.hosts} and root.kind is not FailureKind.LOST:
            # Lines that arrived while the others were stopped belong to the root cause's story too.
            root = self.host(root.host).retold(root)
        root = replace(root, after_final=self._final_before(root.time), barrier_hosts=tuple(
            h.node for h in self.hosts if h.node != root.host and h.in_exit_barrier))
        root = replace(root, when=when_failed(root, self._others_finished(root)))
        own = {f.host: f for f in failures}
        others = {h.node: h.end(own.get(h.node)) for h in self.hosts if h.node != root.host}
        ordered = [root, *(f for f in failures if f.host != root.host)]
        self.verdict = self.history.verdict(root)
        self.history.end(root, self.verdict.quarantined if self.verdict else None)
        # The screen need not repeat the root cause's last lines when they are the last it showed of that rank.
        above = self.sink.showed(root.host, root.rank, root.last_lines)
        if self.verdict is not None and self.verdict.hosts is not None:
            title = f"{self.plan.job_id} attempt {self.plan.attempt}"
            return self._end_attempt(failed_summary(title, root, others, above), self.verdict)
        why = f"\n{self.verdict.why}" if self.verdict is not None else ""
        summary = failed_summary(self.plan.job_id, root, others) + why
        said = failed_summary(self.plan.job_id, root, others, above) + why
        return self._finish(JobState.FAILED, int(ExitCode.FAILED), summary, ordered, said=said)

    def _as_exited(self, failure: Failure) -> Failure:
        """A failure seen from torchrun's records before its host exited, completed by the host's exit
        (the OOM killer's count, its supervisor's error); its time stays when it was first seen."""
        host = self.by_node.get(failure.host)
        if host is None or host.failing_time is None or not host.exited.is_set():
            return failure
        final = host.failure(self.plan.heartbeat_timeout, self.awake_since)
        return failure if final is None else replace(final, time=failure.time)

    def _end_attempt(self, summary: str, verdict: Verdict) -> int:
        """This attempt failed and another follows: record the attempt, say why and what comes
        next; the job goes on (its record stays running)."""
        backoff = self.history.policy.backoff
        restarting = f"restarting: {verdict.why}" + (f" in {backoff:g} s" if backoff else "")
        self.sink.note(self.plan.hosts[0].node, restarting)
        summary = "\n".join([summary, *self.backend.finish(self.view)])
        self.sink.flush()
        self.sink.close_screen(SCREEN_DRAIN)
        self.monitor.stop()
        mask = Masker(self.plan.secrets.values())
        try:
            self.store.update(self.plan.job_id, attempts=masked_attempts(self.history, mask),
                              quarantined=self.history.quarantined)
        except DistrunError as exc:
            summary += f"\ndistrun: warning: the attempt is not recorded: {exc}"
        self._say(mask.text(f"{summary}\n{restarting}"))
        return int(ExitCode.FAILED)


    def _others_finished(self, root: Failure) -> bool:
        """Whether every rank but the root cause's had exited 0: every other host exited 0 or waited in
        torchrun's exit barrier, and torchrun on the root's host recorded no other rank failed or stopped.
        A job of one rank has no other rank to tell: only its final metrics line, before the crash, does."""
        if root.host not in {h.node for h in self.hosts}:
            return False
        if self.plan.world_size == 1:
            return root.after_final
        done = all(h.node in root.barrier_hosts or (h.exited.is_set() and h.exit_rc == 0 and not h.ended_itself)
                   for h in self.hosts if h.node != root.host)
        own = self.host(root.host)
        return done and neighbours_finished(own.plan.nproc, root.rank, own.workers)

    def _final_before(self, when: float) -> bool:
        """Whether the job's final metrics line had arrived by `when` (seconds since the epoch)."""
        final = self.final_metrics
        return final is not None and float(final.get("t", when)) <= when

    def _finish_succeeded(self) -> int:
        restarts = max((h.restarts for h in self.hosts), default=0)
        summary = succeeded_summary(self.plan, self.final_metrics or self.last_metrics, restarts)
        return self._finish(JobState.SUCCEEDED, int(ExitCode.OK), summary)


class AttemptView:
    """What a backend sees of one attempt: its plan, its line sink, and the hosts' events by node
    name (backends/run.py's RunView, and its HostEvents as `events`)."""

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt
        self._hosts = {host.node: host for host in attempt.hosts}
        self.plan = attempt.plan
        self.sink = attempt.sink
        self.events = self

    @property
    def interrupted(self) -> int | None:
        return self._attempt.interrupted

    # ---------------------------------------------------------------- HostEvents

    def attach(self, node: str, channel: Channel) -> None:
        self._hosts[node].attach(channel)

    def data(self, node: str, chunk: bytes) -> None:
        self._hosts[node].on_data(chunk)

    def alive(self, node: str) -> None:
        self._hosts[node].heard()

    def stderr(self, node: str, line: str) -> None:
        self._hosts[node].on_stderr(line)

    def end(self, node: str) -> None:
        self._hosts[node].on_end()

    def lost(self, node: str, reason: str, kind: FailureKind = FailureKind.LOST) -> Failure:
        return self._hosts[node].lost(reason, kind)

    # ---------------------------------------------------------------- RunView

    def failures(self) -> list[Failure]:
        run = self._attempt
        found = (host.failure(run.plan.heartbeat_timeout, run.awake_since) for host in run.hosts)
        return [failure for failure in found if failure is not None]

    def exited(self, node: str) -> bool:
        return self._hosts[node].exited.is_set()

    def await_exits(self, nodes: Sequence[str], timeout: float) -> None:
        run = self._attempt
        hosts = [self._hosts[node] for node in nodes]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
                h.reporting(run.plan.heartbeat_timeout, run.awake_since) for h in hosts):
            run.wake.wait(POLL)
            run.wake.clear()

    def orphaned(self, nodes: Sequence[str]) -> list[str]:
        return [node for node in nodes if self._hosts[node].channel_closed()]
