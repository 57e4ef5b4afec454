"""`distrun launch` of a job with `fault_tolerance`: the parent controller of its replica groups.

The parent selects the job's hosts and spares, splits them into replica groups (groups.py), starts
the torchft lighthouse on a host of the job, a job of its own (`<job>-lh`, lighthouse.py), and
launches each group as a child distrun controller (`distrun launch` of the group's own job,
`--job-id <job>-g<K>`). A child runs its group as any job: its own torchrun on its hosts,
stopped on every host of the group when one fails, relaunched after the job's `restarts` (a
spare in place of a lost host). The other groups never notice: torchft drops the lost group from
the quorum and heals it from a peer when it is back.

The job fails when fewer than `min_replicas` groups can still run (a child ended failed: its
restarts were spent or could not help); the groups left are then stopped. The parent's record
holds the job as a whole; each group has its own record and files (`<job>-g<K>`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rich.console import Group

from orchestrator.console.terminal import show
from orchestrator.errors import DistrunError, ExitCode, UsageError
from orchestrator.liveness import process_start
from orchestrator.run.ft import lighthouse
from orchestrator.run.ft.groups import ReplicaGroup, group_job, split
from orchestrator.run.ft.preflight import check_torchft
from orchestrator.run.ft.state import GROUPS_FILE
from orchestrator.run.ft.story import story
from orchestrator.run.ft.timeline import QuorumTail, Timeline
from orchestrator.run.ft.view import STOPPED, GroupRow, LiveGroups, group_row, render
from orchestrator.run.request import LaunchRequest
from orchestrator.run.restarts import AttemptRecord
from orchestrator.run.spare_pool import POOL_ENV
from orchestrator.spec import resolve_inventory_path, select_with_spares
from orchestrator.spec.model import JobSpec, NodeSpec
from orchestrator.spec.overrides import job_to_yaml
from orchestrator.store import JobDir, JobRecord, JobState, Store, new_job_id

POLL = 0.2
LIGHTHOUSE_SUFFIX = "-lh"  # the lighthouse's job id: its parent's, then -lh
ON_HOSTS = ("ssh", "local")  # the backends a fault-tolerant job runs on (the groups' hosts are the inventory's)
STATE_EVERY = 2.0  # seconds between two writes of groups.json while the job runs
STOP_WAIT = 60.0  # beyond the job's stop grace, how long a group's controller gets to stop its hosts
VIEW_EVERY = 1.0  # seconds between two reads of the groups' records for the live view
SPARES_FILE = "spares.json"  # the spares' claims, shared by the groups' controllers (run/spare_pool.py)


@dataclass
class GroupRun:
    """A replica group's child controller as the parent follows it."""

    group: ReplicaGroup
    job_id: str
    proc: subprocess.Popen[str]
    rc: int | None = None
    ended: float | None = None
    pump: threading.Thread | None = field(default=None, repr=False)
    hosts: tuple[str, ...] = ()  # its hosts now, from its record (a relaunch on a spare changes them)
    attempts: list[AttemptRecord] = field(default_factory=list)  # its record's attempts (each one once ended)

    stopped: bool = False  # the parent stopped it (Ctrl-C, `distrun stop`, or the job's end)

    def state(self) -> str:
        if self.rc is None:
            return "running"
        if self.rc == 0:
            return "succeeded"
        return "stopped by distrun" if self.stopped and self.rc in STOPPED else f"failed (exit {self.rc})"


def launch(request: LaunchRequest, job: JobSpec) -> int:
    """Launch a fault-tolerant job: the lighthouse, then one child controller per replica group.

    Returns:
        The exit code: 0 when at least `min_replicas` groups succeeded, 1 when fewer could run,
        130/143 when interrupted.

    Raises:
        UsageError: the selection does not make whole groups, or torchft is not installed here.
    """
    ft = job.fault_tolerance
    assert ft is not None
    _check_request(request, job)
    inventory = resolve_inventory_path(request.inventory)
    nodes, spare_nodes = select_with_spares(job, inventory, request.selection, request.nnodes, request.guard)
    spares = [n.name for n in spare_nodes] if job.restarts.max else []
    groups = split([n.name for n in nodes], spares, ft)
    job_id = request.job_id or new_job_id(job.name)
    places = lighthouse.places(nodes, spare_nodes)
    beacon = lighthouse.upstreams(places, ft.lighthouse_port)
    inv_args = [] if inventory.path.startswith("<") else ["-i", inventory.path]
    if request.dry_run:
        with tempfile.TemporaryDirectory(prefix="distrun-ft-") as scratch:
            argvs = _group_argvs(request, job, job_id, groups, beacon, Path(scratch), inv_args)
            return _dry_run(job_id, job, places, groups, argvs)
    scripts = {} if request.skip_preflight else check_torchft([*nodes, *spare_nodes])
    store = Store()
    jobs_dir = store.job_dir(job_id)
    jobs_dir.create()
    argvs = _group_argvs(request, job, job_id, groups, beacon, jobs_dir.root, inv_args)
    light_file = jobs_dir.root / f"{job.name}-lh.yaml"
    light_job = lighthouse.lighthouse_job(job, places, light_file, scripts.get(places[0].name))
    light_file.write_text(job_to_yaml(light_job), encoding="utf-8")
    light_inv = jobs_dir.root / "lighthouse-inventory.yaml"
    light_inv.write_text(lighthouse.inventory_text(places), encoding="utf-8")
    light_argv = lighthouse_argv(light_file, places, job_id + LIGHTHOUSE_SUFFIX, ["-i", str(light_inv)],
                                 request.backend)
    return _Parent(request, job, job_id, store, jobs_dir, groups, argvs, (places, light_argv), inventory.path).run()


def _check_request(request: LaunchRequest, job: JobSpec) -> None:
    """What a fault-tolerant launch cannot take: a scheduler's backend, or `--nnodes MIN:MAX`."""
    backend = request.backend or job.backend
    if backend not in (None, *ON_HOSTS):
        raise UsageError(f"fault_tolerance runs on an inventory's hosts (--backend {' or '.join(ON_HOSTS)}), not "
                         f"--backend {backend} (drop fault_tolerance to run this job there)")
    if request.nnodes_range is not None:
        raise UsageError("fault_tolerance does not combine with --nnodes MIN:MAX (give --nnodes a number: a lost "
                         "replica group leaves the quorum instead)")


def _group_argvs(request: LaunchRequest, job: JobSpec, job_id: str, groups: Sequence[ReplicaGroup], beacon: str,
                 where: Path, inv_args: Sequence[str]) -> dict[int, list[str]]:
    """Each group's job file written into `where`, and its child controller's command line."""
    files = {g.index: _write_group_job(where, group_job(job, g, len(groups), beacon)) for g in groups}
    return {g.index: group_argv(request, files[g.index], g, job_id, inv_args) for g in groups}


def group_argv(request: LaunchRequest, job_file: Path, group: ReplicaGroup, job_id: str,
               inv_args: Sequence[str]) -> list[str]:
    """The `distrun launch` of one group's child controller: its hosts, then the spares it may take."""
    argv = [sys.executable, "-m", "orchestrator", "launch", str(job_file), *inv_args]
    for host in (*group.hosts, *group.spares):
        argv += ["--nodes", host]
    argv += ["--nnodes", str(len(group.hosts)), "--job-id", job_id + group.job_id_suffix, "--no-live"]
    argv += ["--skip-preflight"] if request.skip_preflight else []
    argv += ["--metrics-lines"] if request.metrics_lines else []
    argv += ["--backend", request.backend] if request.backend else []
    for option in request.options:
        argv += ["-o", option]
    return argv + (["--", *request.extra_args] if request.extra_args else [])


def lighthouse_argv(job_file: Path, places: Sequence[NodeSpec], job_id: str, inv_args: Sequence[str],
                    backend: str | None) -> list[str]:
    """The `distrun launch` of the lighthouse's controller: its first host, then the others it may move to."""
    argv = [sys.executable, "-m", "orchestrator", "launch", str(job_file), *inv_args]
    for node in places:
        argv += ["--nodes", node.name]
    argv += ["--nnodes", "1", "--job-id", job_id, "--no-live", "--skip-preflight"]
    return argv + (["--backend", backend] if backend else [])


def _write_group_job(root: Path, job: JobSpec) -> Path:
    path = root / f"{job.name}.yaml"
    path.write_text(job_to_yaml(job), encoding="utf-8")
    return path


def _dry_run(job_id: str, job: JobSpec, places: Sequence[NodeSpec], groups: Sequence[ReplicaGroup],
             argvs: dict[int, list[str]]) -> int:
    """Each group's own dry run (its torchrun's argv and env), after the lighthouse's line."""
    assert job.fault_tolerance is not None
    ft = job.fault_tolerance
    training = {host for group in groups for host in group.hosts}
    first = places[0]
    role = "a training host: no spare" if first.name in training else "a spare, not training"
    then = f", then {', '.join(n.name for n in places[1:])} if it is lost" if len(places) > 1 else ""
    show(f"job {job_id}: {len(groups)} replica group(s), min_replicas {ft.min_replicas}; lighthouse on "
         f"{first.name} ({role}{then}), port {ft.lighthouse_port}, job {job_id}{LIGHTHOUSE_SUFFIX}: "
         f"{lighthouse.program(first)} {' '.join(lighthouse.args(ft.min_replicas, ft.lighthouse_port))}")
    for group in groups:
        done = subprocess.run([*argvs[group.index], "--dry-run"], capture_output=True, text=True, check=False)
        show(f"\n== replica group {group.index}: {', '.join(group.hosts)} ==")
        show((done.stdout + done.stderr).rstrip())
        if done.returncode:
            return done.returncode
    return int(ExitCode.OK)


class _Parent:
    """The parent controller while the job runs."""

    def __init__(self, request: LaunchRequest, job: JobSpec, job_id: str, store: Store, jobs_dir: JobDir,
                 groups: list[ReplicaGroup], argvs: dict[int, list[str]],
                 light: tuple[Sequence[NodeSpec], list[str]], inventory: str) -> None:
        assert job.fault_tolerance is not None
        self.request, self.job, self.job_id, self.store, self.dir = request, job, job_id, store, jobs_dir
        self.ft = job.fault_tolerance
        self.groups, self.argvs, self.inventory = groups, argvs, inventory
        self.out_lock = threading.Lock()
        self.log: IO[str] = jobs_dir.open(jobs_dir.root / "groups.log", "a", encoding="utf-8")
        self.places = light[0]
        self.light = lighthouse.Lighthouse(light[1], job_id + LIGHTHOUSE_SUFFIX, jobs_dir.root / "lighthouse.log",
                                           lambda text: self.say(text, prefix="[lighthouse] "), self._light_crashed)
        self.runs: list[GroupRun] = []
        self.interrupted: int | None = None
        self.next_state = 0.0  # when groups.json is written next (monotonic)
        self.next_view = 0.0  # when the groups' records are read next for the live view (monotonic)
        self.timeline = Timeline()
        self.quorums = QuorumTail(jobs_dir.root / "lighthouse.log", self.timeline)
        self.rows: list[GroupRow] = []
        self.light_now: tuple[list[str], int] = ([], 0)  # the lighthouse's host and starts, as last read
        self.screen = LiveGroups(self._frame)
        self.out: IO[str] = sys.stdout

    def say(self, text: str, prefix: str = "[distrun] ") -> None:
        with self.out_lock:
            show(prefix + text, stream=self.out, flush=True)
            self.log.write(prefix + text + "\n")
            self.log.flush()

    def run(self) -> int:
        self._record()
        show(f"Submitted job {self.job_id} (its files: {self.dir.root})", flush=True)
        self.out = self.screen.terminal(sys.stdout, self.request.live)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.light.start(self.places, self.ft.lighthouse_port)
            self.runs = [self._start(group) for group in self.groups]
            code, summary = self._follow()
        except DistrunError as exc:
            code, summary = int(exc.exit_code), f"job {self.job_id} FAILED: {exc}"
        finally:
            self._stop_groups()
            self.light.stop(self.job.stop_grace)
            self._refresh()
            self.screen.stop()
            self.out = sys.stdout
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self._end(code, summary)
        self.quorums.close()
        return code

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.interrupted = signum

    def _record(self) -> None:
        hosts = [host for group in self.groups for host in group.hosts]
        self.store.save(JobRecord(
            id=self.job_id, name=self.job.name, spec_path=self.job.path, inventory=self.inventory, hosts=hosts,
            backend=self.request.backend or self.job.backend or "ssh", state=JobState.RUNNING,
            controller_pid=os.getpid(), controller_start=process_start(os.getpid())))

    def _start(self, group: ReplicaGroup) -> GroupRun:
        proc = subprocess.Popen(self.argvs[group.index], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, preexec_fn=lighthouse.die_with_parent,
                                start_new_session=True, env={**os.environ, POOL_ENV: str(self.dir.root / SPARES_FILE)})
        run = GroupRun(group, self.job_id + group.job_id_suffix, proc, hosts=group.hosts)
        run.pump = threading.Thread(target=self._pump, args=(run,), daemon=True)
        run.pump.start()
        self.say(f"replica group {group.index} on {', '.join(group.hosts)}: job {run.job_id}")
        return run

    def _pump(self, run: GroupRun) -> None:
        assert run.proc.stdout is not None
        for line in run.proc.stdout:
            self.say(line.rstrip("\n"), prefix=f"[g{run.group.index}] ")

    def _follow(self) -> tuple[int, str]:
        """Follow the groups until each ended, or fewer than min_replicas can still run."""
        while self.interrupted is None:
            for run in self.runs:
                if run.rc is None and run.proc.poll() is not None:
                    self._ended(run)
            alive_or_done = [r for r in self.runs if r.rc in (None, 0)]
            if len(alive_or_done) < self.ft.min_replicas:
                failed = next(r for r in sorted(self.runs, key=lambda r: r.ended or 0) if r.rc not in (None, 0))
                return int(ExitCode.FAILED), (
                    f"job {self.job_id} FAILED: replica group {failed.group.index} failed (job {failed.job_id}); "
                    f"{len(alive_or_done)} group(s) left, fewer than min_replicas {self.ft.min_replicas}")
            if all(r.rc is not None for r in self.runs):
                done = sum(r.rc == 0 for r in self.runs)
                return int(ExitCode.OK), (f"job {self.job_id} succeeded: {done} of {len(self.runs)} replica "
                                          f"group(s) finished")
            if self.light.ended() is not None:
                return int(ExitCode.FAILED), (f"job {self.job_id} FAILED: the lighthouse could not be kept running "
                                              f"(its job {self.light.job_id} ended, see lighthouse.log)")
            self.quorums.poll()
            if time.monotonic() >= self.next_view:
                self._refresh()
                self.next_view = time.monotonic() + VIEW_EVERY
            if time.monotonic() >= self.next_state:
                self._write_state()
                self.next_state = time.monotonic() + STATE_EVERY
            time.sleep(POLL)
        name = signal.Signals(self.interrupted).name
        code = ExitCode.INTERRUPTED if self.interrupted == signal.SIGINT else ExitCode.TERMINATED
        return int(code), f"job {self.job_id} stopped ({name}); every group and the lighthouse ended"

    def _ended(self, run: GroupRun) -> None:
        run.rc = run.proc.wait()
        run.ended = time.time()
        if run.pump is not None:
            run.pump.join(5)
        self.say(f"replica group {run.group.index} {run.state()}")

    def _stop_groups(self) -> None:
        """SIGTERM every group's controller still running (each stops its hosts), then wait for it."""
        live = [r for r in self.runs if r.rc is None]
        for run in live:
            if run.proc.poll() is not None:
                continue
            self.say(f"stopping replica group {run.group.index}")
            run.stopped = True
            run.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.job.stop_grace + STOP_WAIT
        for run in live:
            try:
                run.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.proc.kill()
            self._ended(run)

    def _refresh(self) -> None:
        """Each group's hosts and attempts from its record, the quorums since, and the view's rows."""
        self.quorums.poll()
        for run in self.runs:
            try:
                record = self.store.get(run.job_id)
            except DistrunError:
                continue
            run.hosts = tuple(record.hosts) or run.hosts
            run.attempts = [AttemptRecord.from_dict(a) for a in record.attempts]
        self.rows = [group_row(r.group.index, r.rc, r.hosts, r.attempts, self.timeline) for r in self.runs]
        self.light_now = self._light_record()

    def _frame(self) -> Group:
        hosts, starts = self.light_now
        return render(self.rows, f"{self.job_id} · {len(self.runs)} replica group(s)",
                      f"lighthouse on {', '.join(hosts) or '-'} · started {starts} time(s)", self.timeline)

    def _story(self, run: GroupRun) -> list[str]:
        """The group's story (relaunches, the steps of its loss and of its heal), then its attempts,
        when it was relaunched or failed."""
        told = story(run.attempts, self.timeline.of(run.group.index))
        attempts = [attempt.line() for attempt in run.attempts] if len(run.attempts) > 1 else []
        return [*([told] if told else []), *attempts]

    def _failures(self) -> list[dict]:
        """The failed groups' recorded failures, the first group to fail first: the job's root cause."""
        found: list[dict] = []
        for run in sorted((r for r in self.runs if r.rc not in (None, 0)), key=lambda r: r.ended or 0):
            try:
                found += self.store.get(run.job_id).failures
            except DistrunError:
                continue
        return found

    def _light_job(self) -> JobRecord | None:
        """The lighthouse job's record; None before its controller saved one."""
        try:
            return self.store.get(self.light.job_id)
        except DistrunError:
            return None

    def _light_crashed(self) -> str | None:
        """How the lighthouse's first start failed, from its record (lighthouse.crashed_first)."""
        record = self._light_job()
        return None if record is None else lighthouse.crashed_first(record.attempts)

    def _light_record(self) -> tuple[list[str], int]:
        """The lighthouse's host now (as its record has it) and how often it was started."""
        record = self._light_job()
        return ([], 0) if record is None else (list(record.hosts or []), max(len(record.attempts), 1))

    def groups_state(self) -> dict[str, object]:
        """What `groups.json` in the job directory holds: each group, the lighthouse, and the latest quorum."""
        quorum = self.timeline.last
        hosts, starts = self._light_record()
        return {"lighthouse": {"job": self.light.job_id, "hosts": hosts, "starts": starts},
                "quorum": None if quorum is None else {"id": quorum.id, "participants": list(quorum.participants),
                                                      "step": quorum.step},
                "groups": [{"index": r.group.index, "job": r.job_id, "hosts": list(r.hosts), "state": r.state(),
                            "step": self.timeline.last_step(r.group.index),
                            "in_quorum": r.group.index in self.timeline.latest} for r in self.runs]}

    def _write_state(self) -> None:
        path = self.dir.root / GROUPS_FILE
        path.with_suffix(".tmp").write_text(json.dumps(self.groups_state(), indent=1), encoding="utf-8")
        path.with_suffix(".tmp").replace(path)

    def _end(self, code: int, summary: str) -> None:
        self._write_state()
        quorum = self.timeline.last
        hosts, starts = self._light_record()
        lines = [summary, f"  lighthouse ({self.light.job_id}): started {starts} time(s), last on {', '.join(hosts)}"]
        if quorum is not None:
            lines.append(f"  last quorum: {len(quorum.participants)} group(s) ({', '.join(quorum.participants)}) "
                         f"at step {quorum.step}")
        for run in self.runs:
            lines += [f"  group {run.group.index} ({run.job_id}) on {', '.join(run.hosts)}: {run.state()}",
                      *(f"    {line}" for line in self._story(run))]
        detail = "\n".join(lines)
        stopped = code in (ExitCode.INTERRUPTED, ExitCode.TERMINATED)
        state = JobState.SUCCEEDED if code == 0 else (JobState.STOPPED if stopped else JobState.FAILED)
        self.store.end(self.job_id, state, code, detail, failures=self._failures() if state is JobState.FAILED else [])
        self.say(detail, prefix="")
        self.log.close()

