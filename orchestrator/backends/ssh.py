"""The default backend: hosts reached over SSH (or this machine through the local transport)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from orchestrator.backends import LaunchRequest
from orchestrator.errors import ExitCode
from orchestrator.group import Group, GroupResult
from orchestrator.launch import Launcher, Prepared, new_record, prepare, run_remote, write_plan
from orchestrator.logs import LogSink
from orchestrator.spec import (
    Inventory,
    default_inventory,
    load_inventory,
    load_job,
    resolve_inventory_path,
    select_nodes,
)
from orchestrator.store import JobDir, JobRecord, JobState, Store, controller_alive, new_job_id
from orchestrator.transport import Transport

STOP_WAIT = 30.0
T = TypeVar("T")


def inventory_for(request: LaunchRequest, backend: str) -> Inventory:
    """`--backend local` always means this machine; otherwise -i, $DISTRUN_INVENTORY, built-in."""
    return default_inventory() if backend == "local" else resolve_inventory_path(request.inventory)


def launch(request: LaunchRequest, backend: str) -> int:
    job = load_job(request.job_file)
    inventory = inventory_for(request, backend)
    nodes = select_nodes(job, inventory, request.nodes, request.nnodes)
    job_id = request.job_id or new_job_id(job.name)
    with Group(nodes) as group:
        prepared = prepare(job, inventory, group, job_id=job_id, extra_args=request.extra_args, backend=backend)
        if request.dry_run:
            print(prepared.plan.render())
            return int(ExitCode.OK)
        if not request.skip_preflight:
            from orchestrator.doctor import launch_preflight

            launch_preflight(prepared)
        if prepared.plan.sync:
            sync(prepared)
        return run_prepared(prepared, request, backend)


def sync(prepared: Prepared) -> None:
    from orchestrator.sync import sync_workdirs

    for node, count in sync_workdirs(prepared, Path.cwd()).items():
        print(f"[{node}] distrun: workdir synced ({count} file(s) sent)")


def run_prepared(prepared: Prepared, request: LaunchRequest, backend: str) -> int:
    store = Store()
    job_dir = store.job_dir(prepared.plan.job_id)
    write_plan(job_dir, prepared)
    store.save(new_record(prepared.plan, backend))
    terminal = None if request.quiet else sys.stdout
    launcher = Launcher(prepared, store, store.get(prepared.plan.job_id), terminal,
                        colour=terminal is not None and sys.stdout.isatty(), live=request.live)
    return launcher.run()


def stop(store: Store, record: JobRecord) -> int:
    """Stop through the live controller; when it is gone, end the job's processes on its hosts."""
    if record.state.finished and record.state is not JobState.LOST:
        print(f"job {record.id} already ended ({record.state.value})")
        return int(ExitCode.OK)
    if controller_alive(record) and record.controller_pid:
        os.kill(record.controller_pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline and not store.get(record.id).state.finished:
            time.sleep(0.2)
        if store.get(record.id).state.finished:
            print(f"job {record.id} stopped")
            return int(ExitCode.OK)
    return stop_on_hosts(store, record)


def _on_record_hosts(record: JobRecord, fn: Callable[[Transport], T]) -> GroupResult[T]:
    """Connect to the hosts a job ran on (from its recorded inventory) and call fn on each;
    a host that cannot be reached has its connection error as its result."""
    inventory = default_inventory() if record.inventory == "<built-in>" else load_inventory(record.inventory)
    with Group([inventory.node(name) for name in record.hosts]) as group:
        return group.run(fn)


def stop_on_hosts(store: Store, record: JobRecord) -> int:
    """End a job's processes on each of its hosts, found by the job id."""
    results = _on_record_hosts(record, lambda t: _cleanup(t, record.id))
    failed = results.failed
    for name, exc in failed.items():
        print(f"{name}: {exc}", file=sys.stderr)
    store.update(record.id, state=JobState.STOPPED, ended=time.time())
    print(f"job {record.id} stopped on {len(results) - len(failed)} of {len(results)} host(s)")
    return int(ExitCode.INFRA) if failed else int(ExitCode.OK)


def recover(store: Store, record: JobRecord) -> dict[str, int]:
    """Rebuild a job's log files and telemetry from the copies its hosts kept.

    What the controller saw is replaced by what each host wrote: the whole story when the
    controller died before the job ended. Lines are regrouped host by host.

    Returns:
        {node: lines recovered}.

    Raises:
        GroupError: a host could not be reached or read (each one named).
    """
    copies = _on_record_hosts(record, lambda t: json.loads(
        run_remote(t, "fetch", ["fetch"], b"", record.id, t.name).strip().splitlines()[-1])
    ).check("cannot read its copies")
    rebuild(store.job_dir(record.id), copies)
    return {node: copy["log"].count("\n") for node, copy in copies.items()}


def rebuild(job_dir: JobDir, copies: dict[str, dict[str, str]]) -> None:
    """Write combined/node/rank logs, metrics and telemetry afresh from the hosts' copies."""
    for path in (job_dir.combined, job_dir.metrics, job_dir.telemetry):
        path.unlink(missing_ok=True)
    for folder in (job_dir.root / "nodes", job_dir.root / "ranks"):
        shutil.rmtree(folder, ignore_errors=True)
    job_dir.create()
    sink = LogSink(job_dir)
    try:
        for node, copy in copies.items():
            for line in copy["log"].splitlines():
                sink.line(node, line)
    finally:
        sink.close()
    with open(job_dir.telemetry, "w", encoding="utf-8") as out:
        for node, copy in copies.items():
            for line in copy["telemetry"].splitlines():
                out.write(json.dumps({**json.loads(line), "node": node}) + "\n")


def _cleanup(transport: Transport, job_id: str) -> str:
    return run_remote(transport, "cleanup", ["supervisor", "cleanup"], {}, job_id, transport.name)
