"""`distrun launch`: pick the backend, have it prepare and submit the job, and follow the job
attempt after attempt (the restart loop).

`launch` picks the backend (the request's, else the job's), has it prepare, preflight and stage
the job, and `run_attempts` follows it: each attempt is one `attempt.Attempt`. With the job's
`restarts`, a failure it lists ends only the attempt: `run_attempts` asks the policy (restarts.py)
whether and where the next attempt runs, re-plans it through the backend's `replan` (a spare in
place of a quarantined host, a fresh rendezvous port), preflights and stages it, and follows it
with a new `Attempt` writing into the same job directory, each line with its attempt. The record
keeps every attempt.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator import backends, metrics, registry
from orchestrator.backends.base import Backend, LaunchContext, LaunchRequest, Refused, Settled, terminal_for
from orchestrator.console.display import fold_hosts
from orchestrator.console.interrupts import on_signals
from orchestrator.console.terminal import show
from orchestrator.errors import DistrunError, ExitCode, InfraError, UsageError
from orchestrator.fanout.group import GroupError
from orchestrator.plan import LaunchPlan
from orchestrator.remote.redact import Masker
from orchestrator.run.attempt import POLL, Attempt
from orchestrator.run.ft import replicas
from orchestrator.run.recording import Launching
from orchestrator.run.restarts import AttemptHistory, Verdict
from orchestrator.run.spare_pool import SparePool
from orchestrator.run.summary import masked_attempts
from orchestrator.spec.model import JobSpec
from orchestrator.spec.overrides import is_script, job_for_launch, job_to_yaml
from orchestrator.store import JobState, Store, new_job_id

# ---------------------------------------------------------------- the command


def launch(request: LaunchRequest) -> int:
    """Launch a job with the requested backend, or the job's own (`backend:` in the job file).

    Returns:
        The exit code: 0 the job succeeded, 1 it failed, 130/143 interrupted.

    Raises:
        DistrunError: bad input (2) or infrastructure (3); nothing of the job was started.
    """
    job = job_for_launch(request.job_file, request.name, request.nproc_per_node, request.env,
                         request.nnodes_range, request.workdir, request.sync)
    port = request.metrics_port or job.metrics_port
    if job.fault_tolerance is not None:
        if port is not None:
            raise UsageError("--metrics-port: not served for a fault-tolerant job (fault_tolerance:) yet; "
                             "leave it out (its groups' figures are in `distrun top`)")
        return replicas.launch(request, job)
    cls = backends.get(request.backend or job.backend or registry.DEFAULT)
    options = cls.resolve_options(job, request.options)
    store = Store()
    job_id = request.job_id or new_job_id(job.name)
    figures = LiveFigures(job_id)
    # Bound before anything starts: a port in use ends the launch here, in one line.
    endpoint = None if port is None or request.dry_run else metrics.bind(request.metrics_addr, port, figures)
    figures.url = endpoint.url if endpoint else None
    launching = Launching.of(request, job, job_id, store, terminal_for(request))
    ctx = launching.ctx
    try:
        with cls(store.job_dir, options) as backend:
            plan = backend.prepare(ctx)
            if request.dry_run:
                show(dry_run_text(job, request, backend.dry_run(plan)))
                return int(ExitCode.OK)
            if not request.skip_preflight:
                backend.preflight(ctx, plan)
            backend.stage(ctx, plan)
            return run_attempts(backend, launching, plan, figures).code
    finally:
        if endpoint is not None:
            endpoint.close()


class LiveFigures:
    """The figures of the job this controller runs, for its /metrics endpoint: taken at each scrape,
    in the endpoint's thread, from what the attempt running keeps (the telemetry aggregator's
    snapshot, its history and alerts); the run loop never waits for a scrape."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.attempt: Attempt | None = None
        self.url: str | None = None

    def __call__(self) -> list[metrics.JobFigures]:
        attempt = self.attempt
        if attempt is None:
            return [metrics.JobFigures(self.job_id, JobState.PENDING.value, 1, ())]
        aggregator = attempt.monitor.aggregator
        hosts, throughput = aggregator.snapshot()
        history = attempt.history
        lost = metrics.hosts_lost([a.to_dict() for a in list(history.attempts)])
        return [metrics.JobFigures(self.job_id, attempt.state.value, history.number, hosts, lost,
                                   tuple(history.quarantined), tuple(attempt.record.alerts),
                                   aggregator.rank_records(), throughput, attempt.monitor.progress_now())]


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


def run_attempts(backend: Backend, launching: Launching, plan: LaunchPlan,
                 figures: LiveFigures | None = None) -> Finished:
    """Submit a prepared job and follow it to its end, attempt after attempt when the job's
    `restarts` allow; SIGINT/SIGTERM stop it on every host.

    Args:
        figures: The job's /metrics endpoint's source, told each attempt as it opens (None: no endpoint).

    Returns:
        The exit code and the job's final metrics.
    """
    ctx = launching.ctx
    with on_signals(ctx.interrupt):
        _announce(launching, figures.url if figures else None)
        submitted = backend.submit(ctx, plan)
        launching.submitted(plan, submitted)
        try:
            started = backend.place(ctx, plan)
        except Refused as exc:
            launching.ended(exc.settled)
            raise
        if isinstance(started, Settled):
            return Finished(launching.ended(started))
        if not submitted.placed:
            launching.placed(started)
        history = AttemptHistory(ctx.job.restarts, ctx.job.min_nnodes or len(started.hosts), started.spares,
                                pool=SparePool.from_env(ctx.job_id))
        while True:
            attempt = _open_attempt(backend, launching, started, history)
            if figures is not None:
                figures.attempt = attempt
            code = attempt.run()
            if attempt.verdict is None or attempt.verdict.hosts is None:
                return Finished(code, attempt.final_metrics)
            following = _next_attempt(backend, launching, started, history, attempt.verdict)
            if isinstance(following, int):
                return Finished(following)
            started = following


def _announce(launching: Launching, metrics_url: str | None = None) -> None:
    """The first line a launch shows: the job's id and where its files are, as a scheduler's
    `Submitted job ID` (a pipe or a log file otherwise heard of the id only at the end); then
    where its /metrics endpoint is, if it has one."""
    ctx = launching.ctx
    if ctx.terminal is not None:
        show(f"Submitted job {ctx.job_id} (its files: {ctx.files.root})", stream=ctx.terminal, flush=True)
        if metrics_url:
            show(f"Metrics of job {ctx.job_id} at {metrics_url} while it runs", stream=ctx.terminal, flush=True)


def _next_attempt(backend: Backend, launching: Launching, plan: LaunchPlan, history: AttemptHistory,
                  verdict: Verdict) -> LaunchPlan | int:
    """After the backoff, plan the next attempt on the verdict's hosts, preflight and stage it.

    Returns:
        The next attempt's plan, or the exit code when the job ended here instead (interrupted,
        or the next attempt could not be planned: recorded as the job's end).
    """
    ctx = launching.ctx
    deadline = time.monotonic() + history.policy.backoff
    while ctx.interrupted is None and time.monotonic() < deadline:
        time.sleep(POLL)
    following: LaunchPlan | None = None
    failed: DistrunError | None = None
    if ctx.interrupted is None:
        try:
            following = _plan_next(backend, launching, plan, history, verdict.hosts or (), verdict.spares)
        except DistrunError as exc:
            failed = exc
    if ctx.interrupted is not None:
        name = signal.Signals(ctx.interrupted).name
        code = ExitCode.INTERRUPTED if ctx.interrupted == signal.SIGINT else ExitCode.TERMINATED
        return _end_between(launching, history, plan, JobState.STOPPED, int(code),
                            f"job {ctx.job_id} stopped ({name}) before attempt {history.number + 1}")
    if failed is not None or following is None:
        code = int(failed.exit_code if failed else ExitCode.FAILED)
        return _end_between(launching, history, plan, JobState.FAILED, code,
                            f"job {ctx.job_id} FAILED: attempt {history.number + 1} could not start: {failed}")
    ctx.files.write_plan(following.to_dict())
    hosts = [h.node for h in following.hosts]
    # The detail goes: a scheduler's pending reason of this attempt (`Learnt.pending`) is over.
    launching.store.update(ctx.job_id, hosts=hosts, master_addr=following.master_addr,
                           master_port=following.master_port, detail="", **launching.command(following, hosts))
    return following


def _plan_next(backend: Backend, launching: Launching, plan: LaunchPlan, history: AttemptHistory,
               hosts: Sequence[str], spares: Sequence[str]) -> LaunchPlan:
    """Plan, preflight and stage the next attempt on `hosts`; a host that cannot be reached or
    probed is set aside, and the next spare (else fewer hosts, as `nnodes: MIN:MAX` allows)
    tried in its place.

    Raises:
        DistrunError: the attempt cannot start (no host left to try, or another error).
    """
    ctx = launching.ctx
    while True:
        history.spares = tuple(spares)
        try:
            following = _replan(backend, launching, plan, hosts, spares)
            if not launching.request.skip_preflight:
                backend.preflight(ctx, following)
            backend.stage(ctx, following)
            return following
        except GroupError as exc:
            bad = set(exc.failed) & set(hosts)
            refilled = history.refill(hosts, bad, spares) if bad else None
            if refilled is None or ctx.interrupted is not None:
                raise
            history.unreachable += sorted(bad)
            hosts, spares = refilled
            _tell(ctx, f"[distrun] {fold_hosts(bad)} set aside ({exc}); attempt {history.number + 1} on "
                       f"{fold_hosts(hosts)}")


def _replan(backend: Backend, launching: Launching, plan: LaunchPlan, hosts: Sequence[str],
            spares: Sequence[str]) -> LaunchPlan:
    """The backend's plan of the next attempt; a refusal's end is recorded before it goes on."""
    try:
        return backend.replan(launching.ctx, plan, hosts, spares)
    except Refused as exc:
        launching.ended(exc.settled)
        raise


def _tell(ctx: LaunchContext, text: str) -> None:
    show(text, stream=ctx.terminal or sys.stderr, flush=True)


def _end_between(launching: Launching, history: AttemptHistory, plan: LaunchPlan, state: JobState, code: int,
                 detail: str) -> int:
    """Record and say the end of a job that ended between two attempts (secrets masked); its exit code."""
    mask = Masker(plan.secrets.values())
    text = mask.text("\n".join([detail, *history.lines()]))
    try:
        launching.store.end(launching.job_id, state, code, text, attempts=masked_attempts(history, mask),
                            quarantined=history.quarantined)
    except DistrunError as exc:
        text += f"\ndistrun: warning: the job's end is not recorded: {exc}"
    _tell(launching.ctx, text)
    return code


def _open_attempt(backend: Backend, launching: Launching, plan: LaunchPlan,
                  history: AttemptHistory | None = None) -> Attempt:
    """The attempt of a recorded job, its files open; nothing has started on the hosts yet.

    Raises:
        InfraError: the job's files could not be opened (a full disk); the record says so.
    """
    try:
        return Attempt(backend, launching, plan, history)
    except OSError as exc:
        error = InfraError(f"cannot write the job's files into {launching.ctx.files.root}: "
                           f"{exc.strerror or exc} (free space under DISTRUN_HOME, or point DISTRUN_HOME elsewhere)")
        with contextlib.suppress(DistrunError):
            launching.store.end(plan.job_id, JobState.FAILED, int(error.exit_code),
                                f"job {plan.job_id} not started: {error}")
        raise error from exc
