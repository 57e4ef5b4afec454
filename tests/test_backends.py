"""The backend contract: the registry, each backend's options, the run loop driving a backend's hooks,
and per-job operations. No cluster: a scripted backend stands in for hosts."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import click
import pytest

from orchestrator import backends, registry
from orchestrator.backends.base import Backend, LaunchContext, LaunchRequest, Learnt, Settled, Stopped, Submitted
from orchestrator.backends.options import Option, OptionType, from_command_line
from orchestrator.backends.run import HostEvents, RunView
from orchestrator.backends.slurm import SlurmBackend
from orchestrator.backends.slurm_script import SlurmOptions
from orchestrator.cli.main import cli
from orchestrator.diagnose.failures import Failure
from orchestrator.errors import ExitCode, InfraError, SpecError, UsageError
from orchestrator.logs import LogSink
from orchestrator.plan import LaunchPlan, build_plan
from orchestrator.remote.stream import STDERR, STDOUT, Batch, encode
from orchestrator.remote.workerfail import from_process_failure
from orchestrator.run import launch, recorded
from orchestrator.run.hostrun import HostRun
from orchestrator.run.recorded import for_record, refresh_lost
from orchestrator.spec import job_from_text
from orchestrator.spec.model import NodeSpec
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import distrun

# ---------------------------------------------------------------- the registry


def test_every_registered_name_imports_a_backend_class_of_that_name():
    for name in registry.names():
        cls = backends.get(name)
        assert issubclass(cls, Backend) and name == cls.NAME and cls.DESCRIPTION
        cls(Store.__new__(Store))  # every hook is filled in: the class can be made


def test_the_command_line_and_the_job_file_take_exactly_the_registered_names():
    launch_command = cli.commands["launch"]
    choice = next(p.type for p in launch_command.params if p.name == "backend")
    assert isinstance(choice, click.Choice) and tuple(choice.choices) == registry.names()
    with pytest.raises(SpecError, match=f"must be one of {', '.join(registry.names())},"):
        job_from_text("name: t\nmodule: m\nbackend: pbs\n", "j.yaml")


def test_a_name_that_is_not_registered_is_not_a_backend():
    with pytest.raises(KeyError):
        backends.get("pbs")


# ---------------------------------------------------------------- options


SLURM_JOB = "name: t\nmodule: m\nbackend: slurm\nslurm:\n  partition: gpu\n  extra: [--exclusive]\n"


def test_a_backends_options_come_from_its_section_with_the_command_line_over_it():
    options = SlurmBackend.resolve_options(job_from_text(SLURM_JOB, "j.yaml"), ["partition=debug", "time=01:00:00"])
    assert options == {"partition": "debug", "extra": ("--exclusive",), "time": "01:00:00"}
    assert SlurmOptions(**options).partition == "debug"  # type: ignore[arg-type]


@pytest.mark.parametrize(("section", "expected"), [
    ("slurm: {gpus_per_node: 0}", "jobs/x.yaml:3: slurm.gpus_per_node: must be an integer >= 1, got 0"),
    ("slurm: {extras: [--x]}", "jobs/x.yaml:3: slurm.extras: unknown key (did you mean 'extra'?)"),
    ("slurm:\n  time: ''", "jobs/x.yaml:4: slurm.time: must not be empty (remove the key to use the default)"),
])
def test_a_wrong_value_in_a_backends_section_is_reported_at_its_line(section: str, expected: str):
    job = job_from_text(f"name: t\nmodule: m\n{section}\n", "jobs/x.yaml")
    with pytest.raises(SpecError) as caught:
        SlurmBackend.resolve_options(job)
    assert str(caught.value) == expected


@pytest.mark.parametrize(("pair", "expected"), [
    ("partiton=gpu", "-o partiton=gpu: the slurm backend has no option 'partiton' (did you mean 'partition'?)"),
    ("gpus_per_node=0", "-o gpus_per_node=0: gpus_per_node: must be at least 1"),
    ("gpus_per_node=many", "-o gpus_per_node=many: gpus_per_node: expected an integer"),
    ("partition", "-o partition: expected KEY=VALUE"),
    ("time=", "-o time=: time: must not be empty"),
])
def test_a_wrong_option_on_the_command_line_names_the_pair(pair: str, expected: str):
    with pytest.raises(UsageError) as caught:
        SlurmBackend.resolve_options(job_from_text("name: t\nmodule: m\n", "j.yaml"), [pair])
    assert str(caught.value) == expected


def test_strings_and_booleans_parse_from_the_command_line():
    options = (Option("extra", OptionType.STRINGS, "x"), Option("fast", OptionType.BOOLEAN, "x"),
               Option("ratio", OptionType.NUMBER, "x", minimum=0.5))
    values = from_command_line(["extra=--exclusive '--comment=a b'", "fast=yes", "ratio=0.75"], "b", options)
    assert values == {"extra": ("--exclusive", "--comment=a b"), "fast": True, "ratio": 0.75}


def test_a_backend_without_options_refuses_any(tmp_path: Path):
    job = tmp_path / "j.yaml"
    job.write_text(f"name: j\nscript: {job}\n")
    result = distrun("launch", str(job), "--backend", "local", "-o", "partition=gpu", "--dry-run",
                     home=tmp_path / "home")
    assert result.returncode == 2
    assert result.stderr == "distrun: error: -o partition=gpu: the local backend takes no options\n"


def test_distrun_backends_lists_every_backend_and_its_options(tmp_path: Path):
    result = distrun("backends", home=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("ssh (default): ")
    assert "\nslurm: " in result.stdout and "  partition (text): " in result.stdout
    assert "local: " in result.stdout and "  no options" in result.stdout


# ---------------------------------------------------------------- the run loop, on a scripted backend


# torchrun's records of a real run whose local rank 1 raised (torchrun ended the other): the
# supervisor sends them in its exit event, and the launcher takes the failed rank from them.
TORCHRUN_FAILURES = json.loads((Path(__file__).parent / "data/torchrun/failures-raise.json").read_text())["failures"]
WORKERS = [from_process_failure(row["rank"], row).to_event() for row in TORCHRUN_FAILURES]


def event(fields: dict[str, Any]) -> bytes:
    """An event as the supervisor writes it (remote/stream.py)."""
    return b"\x1e" + json.dumps(fields).encode() + b"\n"


class ScriptedBackend(Backend):
    """Two hosts that print, then exit as the job's `scripted` section says; nothing runs anywhere.

    Each hook call is noted in `calls`, so a test can check the run loop's order.
    """

    NAME = "scripted"
    DESCRIPTION = "test double"
    OPTIONS = (Option("fail", OptionType.TEXT, "the host that exits 1"),
               Option("itself", OptionType.TEXT, "the host whose supervisor ends the job on its own"),
               Option("refuse", OptionType.TEXT, "the host whose supervisor refuses the job's checkpoint_dir"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def prepare(self, ctx: LaunchContext) -> LaunchPlan:
        self.calls.append("prepare")
        nodes = [NodeSpec(name=f"h{i}", host=f"10.9.0.{i}") for i in range(2)]
        return build_plan(ctx.job, nodes, {}, job_id=ctx.job_id, inventory_path="<scripted>", master=nodes[0],
                          master_addr="10.9.0.0", master_port=1, controller_cwd="/", controller_env={},
                          backend=self.NAME)

    def preflight(self, ctx: LaunchContext, plan: LaunchPlan) -> None:
        self.calls.append("preflight")

    def stage(self, ctx: LaunchContext, plan: LaunchPlan) -> None:
        self.calls.append("stage")

    def submit(self, ctx: LaunchContext, plan: LaunchPlan) -> Submitted:
        self.calls.append("submit")
        return Submitted("scripted-7")

    def start(self, run: RunView) -> list[Failure]:
        self.calls.append("start")
        for host in run.plan.hosts:
            threading.Thread(target=self._play, args=(run.events, host.node), daemon=True).start()
        return []

    def _play(self, events: HostEvents, node: str) -> None:
        rank = 0 if node == "h0" else 1
        events.data(node, encode(Batch(rank, STDOUT, 1, b"hello\n")))
        if node == self.options.get("itself"):
            events.data(node, event({"ev": "exit", "rc": 0, "reason": "controller heartbeat silent for more than 4 s",
                                     "stop_cause": "heartbeat"}))
        elif node == self.options.get("refuse"):  # what the supervisor sends for an unsafe checkpoint_dir
            events.data(node, event({"ev": "exit", "rc": 127, "refused": True, "error": REFUSAL}))
        elif node == self.options.get("fail"):
            events.data(node, encode(Batch(rank, STDERR, 1, b"RuntimeError: scripted failure\n")))
            events.data(node, event({"ev": "exit", "rc": 1, "workers": WORKERS}))
        elif not any(self.options.get(key) for key in ("fail", "itself", "refuse")):
            events.data(node, event({"ev": "exit", "rc": 0}))

    def stop(self, run: RunView, nodes: list[str]) -> None:
        self.calls.append(f"stop {','.join(nodes)}")
        for node in nodes:
            run.events.data(node, event({"ev": "exit", "rc": -15, "reason": "stopped by the controller",
                                         "stop_cause": "controller"}))

    def finish(self, run: RunView) -> list[str]:
        self.calls.append("finish")
        return ["scripted: released"]

    def release(self) -> None:
        self.calls.append("release")

    def stop_job(self, record: JobRecord, current: Callable[[], JobRecord]) -> Stopped:
        return Stopped(0)


REFUSAL = "checkpoint_dir /ck: / is writable by others; use a directory only you (or root) can write"


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[ScriptedBackend]:
    made: list[ScriptedBackend] = []

    class Recorded(ScriptedBackend):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setitem(registry.REGISTRY, "scripted", f"{__name__}:Recorded")
    monkeypatch.setattr(sys.modules[__name__], "Recorded", Recorded, raising=False)
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))
    return made


def job_file(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: s\nscript: {path}\ntelemetry: {{enabled: false}}\n{extra}")
    return str(path)


def test_the_run_loop_calls_the_hooks_in_order_and_records_success(scripted, tmp_path: Path, capsys):
    code = launch.launch(LaunchRequest(job_file(tmp_path), backend="scripted", job_id="s-1", live=False))

    assert code == 0
    assert scripted[0].calls == ["prepare", "preflight", "stage", "submit", "start", "finish", "release"]
    record = Store().get("s-1")
    assert (record.state, record.backend, record.backend_ref, record.failures) == (
        JobState.SUCCEEDED, "scripted", "scripted-7", [])
    assert "scripted: released" in record.detail
    assert "[h0 r0] hello" in capsys.readouterr().out


def test_a_checkpoint_dir_a_node_refuses_ends_the_job_as_a_one_line_usage_error_exit_2(scripted, tmp_path: Path):
    """On Slurm only the node's supervisor can check checkpoint_dir: its refusal is the launch's error."""
    request = LaunchRequest(job_file(tmp_path, "scripted: {refuse: h1}\n"), backend="scripted", job_id="s-9",
                            live=False, skip_preflight=True, quiet=True)
    with pytest.raises(UsageError) as refused:
        launch.launch(request)

    assert str(refused.value) == f"h1: {REFUSAL}" and refused.value.exit_code == ExitCode.USAGE
    assert scripted[0].calls == ["prepare", "stage", "submit", "start", "stop h0", "finish", "release"]
    assert (Store().get("s-9").state, Store().get("s-9").exit_code) == (JobState.FAILED, 2)


class QueuedBackend(ScriptedBackend):
    """A scheduler's backend in miniature: the job exists without hosts, waits (its reason learnt),
    then runs on the plan's hosts; with `fail: queue` it ends while pending instead."""

    NAME = "queued"
    seen: ClassVar[list[str]] = []  # the record as `place` saw it

    def submit(self, ctx: LaunchContext, plan: LaunchPlan) -> Submitted:
        self.calls.append("submit")
        return Submitted("q-7", placed=False)

    def place(self, ctx: LaunchContext, plan: LaunchPlan) -> LaunchPlan | Settled:
        self.seen.append(f"hosts {Store().get(ctx.job_id).hosts}")
        ctx.learn(Learnt(pending="pending in the queue: Priority"))
        self.seen.append(Store().get(ctx.job_id).detail)
        if self.options.get("fail") == "queue":
            return Settled(JobState.LOST, f"job {ctx.job_id} lost: the queue forgot it", 1)
        return plan


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(registry.REGISTRY, "queued", f"{__name__}:QueuedBackend")
    monkeypatch.setattr(QueuedBackend, "seen", [])
    monkeypatch.setenv("DISTRUN_HOME", str(tmp_path / "home"))


def test_the_run_loop_records_what_a_queued_backend_returns_and_learns(queued, tmp_path: Path):
    code = launch.launch(LaunchRequest(job_file(tmp_path), backend="queued", job_id="q-1", live=False, quiet=True,
                                       skip_preflight=True))

    record = Store().get("q-1")
    assert QueuedBackend.seen == ["hosts []", "pending in the queue: Priority"]
    assert code == 0 and (record.state, record.backend_ref, record.hosts) == (JobState.SUCCEEDED, "q-7", ["h0", "h1"])
    assert "--nodes" not in record.command  # recorded while Slurm-like placement was pending, as before


def test_a_job_that_ends_while_queued_is_recorded_with_the_end_its_backend_returns(queued, tmp_path: Path):
    request = LaunchRequest(job_file(tmp_path, "queued: {fail: queue}\n"), backend="queued", job_id="q-2",
                            live=False, quiet=True, skip_preflight=True)
    assert launch.launch(request) == 1

    record = Store().get("q-2")
    assert (record.state, record.exit_code, record.detail) == (JobState.LOST, 1, "job q-2 lost: the queue forgot it")
    assert (record.backend_ref, record.hosts) == ("q-7", [])


def test_a_failed_host_is_the_root_cause_and_the_host_distrun_stopped_says_so(scripted, tmp_path: Path):
    request = LaunchRequest(job_file(tmp_path, "scripted: {fail: h1}\n"), backend="scripted", job_id="s-2",
                            live=False, skip_preflight=True, quiet=True)
    code = launch.launch(request)

    assert code == 1
    assert scripted[0].calls == ["prepare", "stage", "submit", "start", "stop h0", "finish", "release"]
    record = Store().get("s-2")
    root = Failure.from_dict(record.failures[0])
    assert (root.host, root.rank, root.describe(), root.address) == ("h1", 1, "exit code 1", "10.9.0.1")
    assert root.message == "ValueError: rank 1 says boom" and root.traceback[-1] == root.message
    assert "  error: ValueError: rank 1 says boom" in record.detail
    assert root.last_lines[-1] == "RuntimeError: scripted failure"
    assert "Other hosts: h0: stopped by distrun" in record.detail and "exit code -15" not in record.detail
    assert Store().job_dir("s-2").summary.read_text() == record.detail + "\n"


def test_a_host_whose_supervisor_ended_the_job_itself_failed_and_says_why(scripted, tmp_path: Path):
    request = LaunchRequest(job_file(tmp_path, "scripted: {itself: h1}\n"), backend="scripted", job_id="s-4",
                            live=False, skip_preflight=True, quiet=True)
    assert launch.launch(request) == 1
    root = Failure.from_dict(Store().get("s-4").failures[0])
    assert (root.host, root.kind.value, root.describe()) == (
        "h1", "infra", "its supervisor ended the job: controller heartbeat silent for more than 4 s")


def test_the_end_is_shown_even_when_the_database_cannot_take_it(scripted, tmp_path: Path, capsys, monkeypatch):
    def locked(*_args: Any, **_kwargs: Any) -> bool:
        raise InfraError("job database x.db: database is locked")

    monkeypatch.setattr(Store, "end", locked)
    code = launch.launch(LaunchRequest(job_file(tmp_path), backend="scripted", job_id="s-5", live=False))
    out = capsys.readouterr().out
    assert code == 0 and "job s-5 succeeded" in out
    assert "distrun: warning: the job's end is not recorded: job database x.db: database is locked" in out


def test_whatever_fails_in_the_controller_every_host_is_stopped_first(scripted, tmp_path: Path, monkeypatch):
    def broken(self: Backend, run: RunView) -> list[Failure]:
        raise RuntimeError("the run loop broke")

    monkeypatch.setattr(ScriptedBackend, "failures", broken)
    request = LaunchRequest(job_file(tmp_path, "scripted: {fail: nobody}\n"), backend="scripted", job_id="s-6",
                            live=False, quiet=True)
    with pytest.raises(RuntimeError, match="the run loop broke"):
        launch.launch(request)
    assert scripted[0].calls == ["prepare", "preflight", "stage", "submit", "start", "stop h0,h1", "release"]


def test_silence_while_the_controller_itself_was_frozen_is_not_a_lost_host(tmp_path: Path):
    job = job_from_text(f"name: s\nscript: {__file__}\n", "j.yaml")
    nodes = [NodeSpec(name="h0", host="10.9.0.0")]
    plan = build_plan(job, nodes, {}, job_id="s-7", inventory_path="i", master=nodes[0], master_addr="10.9.0.0",
                      master_port=1, controller_cwd="/", controller_env={})
    host = HostRun(plan.hosts[0], LogSink(Store(tmp_path).job_dir("s-7")))
    host.last_seen = time.monotonic() - 30
    assert host.failure(4, awake_since=time.monotonic()) is None
    lost = host.failure(4)
    assert lost is not None and lost.describe() == "host lost: nothing heard for 4 s (network cut or host down)"


def test_a_lost_hosts_last_lines_are_its_own_never_distruns_notes_about_it(tmp_path: Path):
    job = job_from_text(f"name: s\nscript: {__file__}\n", "j.yaml")
    nodes = [NodeSpec(name="h0", host="10.9.0.0")]
    plan = build_plan(job, nodes, {}, job_id="s-8", inventory_path="i", master=nodes[0], master_addr="10.9.0.0",
                      master_port=1, controller_cwd="/", controller_env={})
    sink = LogSink(Store(tmp_path).job_dir("s-8"))
    host = HostRun(plan.hosts[0], sink)
    host.last_seen = time.monotonic() - 30
    assert host.failure(4).last_lines == ()  # nothing arrived: the summary says so
    sink.batch("h0", Batch(1, STDOUT, 1, b"step 7\n"))
    sink.batch("h0", Batch(None, STDERR, 1, b"torchrun: W worker 1 slow\n"))
    sink.note("h0", "stopping (h0 failed)")
    lost = host.failure(4)
    assert lost.last_lines == ("step 7", "torchrun: W worker 1 slow")
    assert "distrun: stopping (h0 failed)" in sink.last_lines("h0", None, 5)  # the notes stay in the host's lines


def test_a_dry_run_only_prepares_and_releases(scripted, tmp_path: Path, capsys):
    code = launch.launch(LaunchRequest(job_file(tmp_path), backend="scripted", job_id="s-3", dry_run=True))

    assert code == 0 and scripted[0].calls == ["prepare", "release"]
    assert "job s-3: 2 node(s)" in capsys.readouterr().out
    assert Store().list() == []


def test_a_wrong_option_stops_the_launch_before_the_backend_is_made(scripted, tmp_path: Path):
    with pytest.raises(UsageError, match="no option 'fial'"):
        launch.launch(LaunchRequest(job_file(tmp_path), backend="scripted", options=["fial=h1"]))
    assert scripted == []


# ---------------------------------------------------------------- recorded jobs


def record(store: Store, job_id: str, backend: str, pid: int | None, **fields: Any) -> JobRecord:
    rec = JobRecord(id=job_id, name="x", spec_path="x.yaml", inventory="<built-in>", hosts=["localhost"],
                    backend=backend, state=JobState.RUNNING, controller_pid=pid, **fields)
    store.save(rec)
    return rec


def test_ps_marks_an_ssh_job_whose_controller_died_lost_and_leaves_a_live_one(tmp_path: Path):
    store = Store(tmp_path)
    dead = record(store, "dead-1", "ssh", 2 ** 22 + 1)
    live = record(store, "live-1", "ssh", os.getpid())  # pytest's command line names no distrun
    alive_controller = record(store, "live-2", "local", None)
    refresh_lost(store, [dead, live, alive_controller])
    assert store.get("dead-1").state is JobState.LOST
    assert store.get("live-2").state is JobState.LOST


def test_a_record_of_an_unknown_backend_is_left_alone_and_refused_politely(tmp_path: Path):
    store = Store(tmp_path)
    rec = record(store, "k8s-1", "kubernetes", None)
    refresh_lost(store, [rec])
    assert store.get("k8s-1").state is JobState.RUNNING
    with pytest.raises(UsageError, match="backend 'kubernetes', which this distrun does not have"):
        for_record(store, rec)


def test_a_slurm_job_that_slurm_cannot_be_asked_about_counts_as_alive(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: Slurm cannot be asked
    store = Store(tmp_path)
    rec = record(store, "sl-1", "slurm", None, backend_ref="42")
    refresh_lost(store, [rec])
    assert store.get("sl-1").state is JobState.RUNNING


@pytest.mark.parametrize(("slurm_state", "state", "code"), [("COMPLETED", JobState.SUCCEEDED, 0),
                                                             ("CANCELLED by 0", JobState.STOPPED, 143),
                                                             ("TIMEOUT", JobState.FAILED, 1)])
def test_a_slurm_job_whose_controller_died_takes_slurms_final_state(tmp_path: Path, monkeypatch, slurm_state: str,
                                                                     state: JobState, code: int):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho 'JobId=42 JobState={slurm_state} Reason=None NodeList=n0 BatchHost=n0'\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    store = Store(tmp_path)
    rec = record(store, "sl-3", "slurm", 2 ** 22 + 1, backend_ref="42")
    refresh_lost(store, [rec])
    assert (rec.state, rec.exit_code) == (state, code)
    assert f"Slurm job 42 ended {slurm_state.split()[0]} after its controller died" in rec.detail


def test_recover_is_refused_by_a_backend_without_host_copies(tmp_path: Path):
    store = Store(tmp_path)
    rec = record(store, "sl-2", "slurm", None, backend_ref="43")
    with pytest.raises(UsageError, match="ran on Slurm, whose nodes wrote into the job directory itself"):
        for_record(store, rec).recover(rec)


def test_run_near_runs_a_command_on_the_host_of_a_local_jobs_node(tmp_path: Path):
    store = Store(tmp_path)
    rec = record(store, "loc-1", "local", None)
    result = for_record(store, rec).run_near(rec, "localhost", ["echo", "beside the ranks"], timeout=30)
    assert (result.returncode, result.stdout) == (0, "beside the ranks")
    with pytest.raises(UsageError, match="ran on localhost"):
        for_record(store, rec).run_near(rec, "node9", ["true"])


def test_the_base_backend_refuses_operations_it_does_not_have(tmp_path: Path):
    store = Store(tmp_path)
    rec = record(store, "s-9", "slurm", None, backend_ref="9")
    with pytest.raises(UsageError, match="cannot run commands beside its ranks"):
        SlurmBackend(store.job_dir).run_near(rec, "node0", ["py-spy", "dump"])


def test_slurm_reaches_a_jobs_nodes_through_its_allocation_only_while_it_runs(tmp_path: Path):
    store = Store(tmp_path)
    rec = record(store, "s-8", "slurm", None)
    with pytest.raises(UsageError, match="has no Slurm job id yet"):
        SlurmBackend(store.job_dir).run_remote_near(rec, ["node0"], "stack", ["stack"])
    store.end("s-8", JobState.FAILED, 1, "failed")
    ended = replace(store.get("s-8"), backend_ref="8")
    with pytest.raises(UsageError, match=r"is not running in Slurm \(failed\)"):
        SlurmBackend(store.job_dir).run_remote_near(ended, ["node0"], "stack", ["stack"])


def test_stop_job_waits_for_nothing_on_a_finished_job(tmp_path: Path, capsys):
    store = Store(tmp_path)
    record(store, "done-1", "ssh", None)
    store.end("done-1", JobState.SUCCEEDED, 0, "ok")
    began = time.monotonic()
    stopped = recorded.stop(store, store.get("done-1"))
    assert time.monotonic() - began < 2
    assert stopped == Stopped(0, ("job done-1 already ended (succeeded)",)) and capsys.readouterr().out == ""


def test_a_dry_run_with_a_spare_names_it_and_its_hosts_beyond_nnodes_stay_out(tmp_path: Path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n" + "".join(f"  - {{name: {n}, host: 10.0.0.{i}}}\n" for i, n in enumerate("abc", 1)))
    job = tmp_path / "j.yaml"
    job.write_text(f"name: j\nscript: {job}\nnnodes: 2\nrestarts: {{max: 1}}\ncheckpoint_dir: /ck\n")
    result = distrun("launch", str(job), "-i", str(inv), "--dry-run", home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert "spares: c (take a failed host's place when the job restarts)" in result.stdout
    assert "[c]" not in result.stdout and result.stdout.count("DISTRUN_CHECKPOINT_DIR=/ck") == 2


def test_stop_on_hosts_returns_the_unreachable_host_as_data_and_prints_nothing(tmp_path: Path, capsys):
    inventory = tmp_path / "lab.yaml"
    inventory.write_text("nodes:\n  - {name: n0, host: 127.0.0.1, port: 1}\n")  # nothing listens on port 1
    store = Store(tmp_path)
    rec = JobRecord(id="gone-1", name="x", spec_path="x.yaml", inventory=str(inventory), hosts=["n0"],
                    backend="ssh", state=JobState.LOST)
    store.save(rec)

    stopped = recorded.stop(store, rec)

    assert (stopped.code, stopped.messages) == (3, ("job gone-1 stopped on 0 of 1 host(s)",))
    assert len(stopped.errors) == 1 and "n0" in stopped.errors[0] and stopped.gpus_freed == ()
    assert capsys.readouterr() == ("", "") and store.get("gone-1").state is JobState.STOPPED
