"""A fourth backend in one file, written against the contract alone (backends/base.py and
backends/run.py; backends/README.md is the guide): each host of the plan is a local subprocess
that runs the plan's torchrun directly, without distrun's supervisor (it writes the programs the
plan's argv names, torchrun's and the ranks' entries, where the argv says, as the supervisor does).

What it shows: a backend plans (`prepare`), makes the job exist (`submit`: its plan.json, into
the job's own directory `ctx.files`), starts its hosts and reports their lines, heartbeats and
exits to `run.events` by node name (`start`), and ends them when the run loop says so (`stop`).
The run loop does the rest: the first failure, the root cause, the summary and the record (a
backend never writes the record: its hooks return what happened). It is a test double only:
torchrun's own ranks' output goes to its stdout (no per-rank labels), and `distrun stop` of a
recorded job has nothing to end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator.backends.base import Backend, LaunchContext, Stopped, Submitted
from orchestrator.backends.run import EXIT_WAIT, RunView
from orchestrator.diagnose.failures import Failure
from orchestrator.plan import HostPlan, LaunchPlan, build_plan
from orchestrator.remote import host_job_dir, program_sources
from orchestrator.remote.programs import expand_job_words, write_programs
from orchestrator.remote.stream import EVENT, STDOUT, Batch, encode
from orchestrator.spec.model import NodeSpec
from orchestrator.store import JobRecord

HEARTBEAT_EVERY = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def direct_argv(argv: list[str]) -> list[str]:
    """torchrun's argv with its ranks' output on its own stdout (the plan sends it to files that
    the supervisor reads)."""
    if "--redirects" not in argv:
        return argv
    at = argv.index("--redirects")
    return argv[:at] + argv[at + 2:]


class ToyBackend(Backend):
    """Hosts `toy0`, `toy1`, ... (as many as --nnodes, default 2), each a local torchrun."""

    NAME = "toy"
    DESCRIPTION = "test only: every host a local torchrun subprocess"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.done = threading.Event()

    def prepare(self, ctx: LaunchContext) -> LaunchPlan:
        nodes = [NodeSpec(name=f"toy{i}", host="127.0.0.1", python=sys.executable, iface="lo")
                 for i in range(ctx.asked.nnodes or 2)]
        return build_plan(ctx.job, nodes, {}, job_id=ctx.job_id, inventory_path="<toy>", master=nodes[0],
                          master_addr="127.0.0.1", master_port=free_port(), controller_cwd=os.getcwd(),
                          controller_env=dict(os.environ), extra_args=list(ctx.asked.extra_args),
                          backend=self.NAME)

    def submit(self, ctx: LaunchContext, plan: LaunchPlan) -> Submitted:
        ctx.files.write_plan(plan.to_dict())
        return Submitted()

    def start(self, run: RunView) -> list[Failure]:
        failed = []
        for host in run.plan.hosts:
            try:
                self.procs[host.node] = self._spawn(run.plan, host)
            except OSError as exc:
                failed.append(run.events.lost(host.node, f"cannot start torchrun: {exc}"))
                continue
            threading.Thread(target=self._follow, args=(run, host.node), daemon=True).start()
        threading.Thread(target=self._heartbeats, args=(run,), daemon=True).start()
        return failed

    def _spawn(self, plan: LaunchPlan, host: HostPlan) -> subprocess.Popen[bytes]:
        job_dir = host_job_dir(plan.job_id)
        write_programs(os.path.expanduser(f"{job_dir}/bin"), program_sources())
        argv = expand_job_words(direct_argv(host.argv), job_dir)
        return subprocess.Popen(argv, env={**os.environ, **plan.host_env(host)}, cwd=host.workdir,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def _follow(self, run: RunView, node: str) -> None:
        """Each line as a batch of the host's own, then its exit, framed as a supervisor frames them
        (remote/stream.py)."""
        proc = self.procs[node]
        assert proc.stdout is not None
        for line in proc.stdout:
            run.events.data(node, encode(Batch(None, STDOUT, 1, line)))
        run.events.data(node, EVENT + json.dumps({"ev": "exit", "rc": proc.wait()}).encode() + b"\n")
        run.events.end(node)

    def _heartbeats(self, run: RunView) -> None:
        """A running host is alive even while it prints nothing."""
        while not self.done.wait(HEARTBEAT_EVERY):
            for node, proc in self.procs.items():
                if proc.poll() is None:
                    run.events.alive(node)

    def stop(self, run: RunView, nodes: list[str]) -> None:
        """SIGTERM each host's torchrun group, SIGKILL after the stop grace; their exits are reported by `_follow`."""
        for node in nodes:
            self._signal(node, signal.SIGTERM)
        deadline = time.monotonic() + run.plan.stop_grace
        while time.monotonic() < deadline and not all(run.exited(node) for node in nodes):
            time.sleep(0.05)
        for node in nodes:
            if not run.exited(node):
                self._signal(node, signal.SIGKILL)
        deadline = time.monotonic() + EXIT_WAIT
        while time.monotonic() < deadline and not all(run.exited(node) for node in nodes):
            time.sleep(0.05)

    def _signal(self, node: str, signum: int) -> None:
        proc = self.procs.get(node)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signum)

    def finish(self, run: RunView) -> list[str]:
        self.done.set()
        return []

    def release(self) -> None:
        self.done.set()
        for node in self.procs:
            self._signal(node, signal.SIGKILL)

    def stop_job(self, record: JobRecord, current: Callable[[], JobRecord]) -> Stopped:
        return Stopped(0)  # its hosts lived and died with the controller
