"""The controller at thousands of hosts: one job on N simulated hosts, measured.

    python bench/scale_sim.py --hosts 4096 --seconds 20 --json

Each simulated host speaks the supervisor's wire protocol (remote/stream.py): a heartbeat event
every second, a telemetry event every 2 s, two ranks printing 10 lines a second each in batches
(as the supervisor's tail sends them, every 0.25 s; one line in 20 a DISTRUN_METRICS record, for
the straggler detector), and an exit event when told to stop. The hosts live in HELPERS helper
processes (this script with --helper), so that their work is not the controller's; the controller
is this process, running the real launch (`launch.launch`), run loop, sink, watchdog, stragglers,
live view (drawn to a file that says it is a terminal), store and stop, against `SimBackend`, a
bench-only backend written against the contract (backends/run.py) like tests/toy_backend.py.

After `--seconds`, one host is lost (its channel closes, its link is down); the run loop stops
every other host and the launch returns. One JSON line:

    hosts            simulated hosts
    controller_cpu_s this process's CPU (user + sys) from the launch to its return
    wall_s           wall time of the same
    peak_rss_mb      this process's peak resident memory
    launch_s         from the launch until every host's first output arrived
    stop_s           from the host loss until the launch returned (every other host told to stop
                     and its exit heard, the summary recorded)
    lines            lines the hosts printed
    lines_lost       of those, lines not in the job's files (lines.idx)
    root_cause       the host the job's root cause names: the host the bench lost, unless the
                     controller took another one for lost first
    root_reason      the root cause's reason, in the summary's words

Between the helpers and the controller: the controller writes `<host index> <bytes>` lines (a
host's channel: heartbeats, stop; and the bench's own `start` and `lose`); a helper writes frames
`!IIB` (host index, length, kind: DATA a chunk of the host's stream, CLOSED its channel closed)
then the bytes, and at the end one TOTAL frame with the lines it printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import resource
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any, ClassVar

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from orchestrator import registry  # noqa: E402
from orchestrator.backends.base import Backend, LaunchContext, Submitted  # noqa: E402
from orchestrator.backends.run import EXIT_WAIT, RunView  # noqa: E402
from orchestrator.diagnose.failures import Failure  # noqa: E402
from orchestrator.plan import LaunchPlan, build_plan  # noqa: E402
from orchestrator.remote.linestore import read_index  # noqa: E402
from orchestrator.remote.stream import EVENT, STDOUT, Batch, encode  # noqa: E402
from orchestrator.remote.supervisor import StopCause  # noqa: E402
from orchestrator.run import launch  # noqa: E402
from orchestrator.run.request import LaunchRequest  # noqa: E402
from orchestrator.spec.model import NodeSpec  # noqa: E402
from orchestrator.store import JobRecord, Store  # noqa: E402
from orchestrator.transport.base import unread_bytes  # noqa: E402

HELPERS = 2
FRAME = struct.Struct("!IIB")
DATA, CLOSED, TOTAL = 0, 1, 2
TICK = 0.25  # the supervisor's tail sends a rank's new lines about this often (remote/tail.py RESCAN)
RANKS = 2
LINE_RATE = 10.0  # lines a second per rank
TELEMETRY_EVERY = 2.0
HEARTBEAT_EVERY = 1.0
METRICS_EVERY = 20  # one line in this many is a DISTRUN_METRICS record
STOP_MESSAGE = b'{"op": "stop"}\n'
TICKS = os.sysconf("SC_CLK_TCK")

# ---------------------------------------------------------------- the simulated hosts (helper side)


class SimHost:
    """One simulated host's supervisor: what it has printed, and when it next speaks."""

    def __init__(self, index: int, started: float) -> None:
        self.index = index
        self.node = f"sim{index}"
        self.started = started
        self.printed = [0] * RANKS
        self.next_hb = started
        self.next_tel = started
        self.done = False

    def output(self, now: float) -> bytes:
        """Everything the host says at `now`: due heartbeat and telemetry, each rank's new lines."""
        parts = []
        if now >= self.next_hb:
            parts.append(event("hb"))
            self.next_hb += HEARTBEAT_EVERY
        if now >= self.next_tel:
            parts.append(event("tel", kind="host", t=time.time(), host=self.node, interval=TELEMETRY_EVERY,
                               cpus=64, cpu_pct=50.0, load1=8.0, mem_used_mb=200000.0, mem_total_mb=1000000.0,
                               job_procs=RANKS + 1, job_cpu_pct=190.0, job_rss_mb=8000.0))
            self.next_tel += TELEMETRY_EVERY
        due = int((now - self.started) * LINE_RATE)
        for local in range(RANKS):
            rank = self.index * RANKS + local
            lines = [self.line(rank, n) for n in range(self.printed[local], due)]
            if lines:
                parts.append(encode(Batch(rank, STDOUT, len(lines), "".join(lines).encode())))
                self.printed[local] = due
        return b"".join(parts)

    def line(self, rank: int, n: int) -> str:
        if n % METRICS_EVERY == METRICS_EVERY - 1:
            step = n // METRICS_EVERY
            return f'DISTRUN_METRICS {{"step": {step}, "rank": {rank}, "step_time_s": 0.5, "loss": 1.25}}\n'
        return f"[rank {rank}] step {n // METRICS_EVERY} iter {n} loss 1.2345 lr 3.0e-4 tokens/s 123456.7\n"

    def stopped(self) -> bytes:
        """What the supervisor says when the controller stops it: a note, then its exit."""
        self.done = True
        return (event("note", msg="job processes ended (stopped by the controller); 0 needed SIGKILL")
                + event("exit", rc=-15, reason="stopped by the controller", stop_cause=StopCause.CONTROLLER.value,
                        oom_kills=0, workers_at_stop=RANKS, gpus_freed=[]))


def event(kind: str, /, **fields: Any) -> bytes:
    return EVENT + json.dumps({"ev": kind, **fields}).encode() + b"\n"


def helper_main() -> int:
    """A helper process: the hosts the controller starts on it, until its stdin closes."""
    out = sys.stdout.buffer
    hosts: dict[int, SimHost] = {}
    commands: list[bytes] = []
    lock = threading.Lock()
    closed = threading.Event()

    def read() -> None:
        for raw in sys.stdin.buffer:
            with lock:
                commands.append(raw)
        closed.set()

    threading.Thread(target=read, daemon=True).start()
    while not closed.is_set():
        began = time.monotonic()
        with lock:
            taken, commands[:] = list(commands), []
        frames = []
        for raw in taken:
            index, _, message = raw.partition(b" ")
            op = json.loads(message).get("op")
            host = hosts.get(int(index))
            if op == "start":
                hosts[int(index)] = SimHost(int(index), began)
            elif host is None or host.done:
                continue
            elif op == "stop":
                frames.append(frame(host.index, DATA, host.output(began) + host.stopped()))
                frames.append(frame(host.index, CLOSED, b""))
            elif op == "lose":
                frames.append(frame(host.index, DATA, host.output(began)))
                host.done = True
                frames.append(frame(host.index, CLOSED, b""))
        for host in hosts.values():
            if not host.done and (data := host.output(began)):
                frames.append(frame(host.index, DATA, data))
        if frames:
            out.write(b"".join(frames))
            out.flush()
        time.sleep(max(0.0, TICK - (time.monotonic() - began)))
    total = sum(sum(h.printed) for h in hosts.values())
    out.write(frame(0, TOTAL, str(total).encode()))
    out.flush()
    return 0


def frame(index: int, kind: int, data: bytes) -> bytes:
    return FRAME.pack(index, len(data), kind) + data


def next_frame(buffer: bytearray) -> tuple[int, int, bytes] | None:
    """The first whole frame in `buffer` as (host index, kind, bytes), taken out of it; None if there is none yet."""
    if len(buffer) < FRAME.size:
        return None
    index, size, kind = FRAME.unpack_from(buffer)
    if len(buffer) < FRAME.size + size:
        return None
    data = bytes(buffer[FRAME.size:FRAME.size + size])
    del buffer[:FRAME.size + size]
    return index, kind, data


# ---------------------------------------------------------------- the bench-only backend (controller side)


class Helper:
    """A helper process as the controller sees it: commands to its stdin, frames from its stdout."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--helper"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0, env={**os.environ, "PYTHONPATH": str(REPO)})
        self.lock = threading.Lock()
        self.pending: list[bytes] = []
        self.total: int | None = None
        self.busy = False  # frames of it read and not handled yet

    def behind(self) -> bool:
        """Whether its frames wait to be read or handled (every host of it may be in them)."""
        return self.busy or (self.proc.stdout is not None and unread_bytes(self.proc.stdout.fileno()) > 0)

    def send(self, index: int, data: bytes) -> None:
        """Queue a host's message (written by `flush`, as an SSH transport's window would)."""
        with self.lock:
            self.pending.append(b"%d %s" % (index, data))

    def flush(self) -> None:
        with self.lock:
            data, self.pending = b"".join(self.pending), []
        if data and self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError):
                self.proc.stdin.write(data)
                self.proc.stdin.flush()


class SimChannel:
    """A simulated host's supervisor channel (backends/run.py's Channel)."""

    def __init__(self, helper: Helper, index: int) -> None:
        self.helper = helper
        self.index = index
        self.ended = False
        self.lost = False

    def write(self, data: bytes) -> None:
        if not self.ended:
            self.helper.send(self.index, data)

    def closed(self) -> bool:
        return self.ended

    def link_up(self) -> bool:
        return not self.lost

    def behind(self) -> bool:
        return self.helper.behind()


class SimBackend(Backend):
    """Hosts sim0 .. simN-1 (N: --nnodes), simulated by HELPERS helper processes."""

    NAME = "sim"
    DESCRIPTION = "bench only: simulated hosts speaking the supervisor's wire protocol"
    made: ClassVar[list[SimBackend]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.made.append(self)
        self.helpers: list[Helper] = []
        self.channels: dict[str, SimChannel] = {}
        self.first_output: dict[str, float] = {}
        self.all_running = threading.Event()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.nodes: list[str] = []

    def prepare(self, ctx: LaunchContext) -> LaunchPlan:
        nodes = [NodeSpec(name=f"sim{i}", host="127.0.0.1", python=sys.executable, iface="lo")
                 for i in range(ctx.asked.nnodes or 8)]
        return build_plan(ctx.job, nodes, {}, job_id=ctx.job_id, inventory_path="<sim>", master=nodes[0],
                          master_addr="127.0.0.1", master_port=29500, controller_cwd=os.getcwd(),
                          controller_env={}, backend=self.NAME)

    def submit(self, ctx: LaunchContext, plan: LaunchPlan) -> Submitted:
        ctx.files.write_plan(plan.to_dict())
        return Submitted()

    def start(self, run: RunView) -> list[Failure]:
        self.helpers = [Helper() for _ in range(HELPERS)]
        self.nodes = [host.node for host in run.plan.hosts]
        for index, node in enumerate(self.nodes):
            channel = self.channels[node] = SimChannel(self.helpers[index % HELPERS], index)
            run.events.attach(node, channel)
            channel.write(b'{"op": "start"}\n')
        for helper in self.helpers:
            helper.flush()
            self._thread(self._read, run, helper)
        self._thread(self._flush)
        return []

    def _thread(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _flush(self) -> None:
        """The hosts' channels written out every 20 ms."""
        while not self.stopping.wait(0.02):
            for helper in self.helpers:
                helper.flush()

    def _read(self, run: RunView, helper: Helper) -> None:
        """A helper's frames to each host's events, by node name. It waits for them without taking
        them (select), then says it is busy, then reads: frames that reached this process are
        always either in the pipe or in hand (`Helper.behind` has no moment of doubt)."""
        assert helper.proc.stdout is not None
        fd, buffer = helper.proc.stdout.fileno(), bytearray()
        while True:
            helper.busy = bool(buffer)
            select.select([fd], [], [])
            helper.busy = True
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return
            buffer += chunk
            while (taken := next_frame(buffer)) is not None:
                index, kind, data = taken
                if kind == TOTAL:
                    helper.total = int(data)
                    return
                self._frame(run, self.nodes[index], kind, data)

    def _frame(self, run: RunView, node: str, kind: int, data: bytes) -> None:
        """One frame of a host: a chunk of its stream, or its channel closed."""
        if kind == DATA:
            if node not in self.first_output:
                self.first_output[node] = time.monotonic()
                if len(self.first_output) == len(self.nodes):
                    self.all_running.set()
            run.events.data(node, data)
        else:
            self.channels[node].ended = True
            run.events.end(node)

    def lose(self, node: str) -> None:
        """The host goes away: its channel closes, its link is down."""
        channel = self.channels[node]
        channel.lost = True
        channel.helper.send(channel.index, b'{"op": "lose"}\n')

    def stop(self, run: RunView, nodes: list[str]) -> None:
        for node in nodes:
            self.channels[node].write(STOP_MESSAGE)
        run.await_exits(nodes, run.plan.stop_grace + EXIT_WAIT)

    def release(self) -> None:
        """Close the helpers' stdin; wait for their count of lines printed."""
        self.stopping.set()
        for helper in self.helpers:
            helper.flush()
            with contextlib.suppress(BrokenPipeError):
                if helper.proc.stdin is not None:
                    helper.proc.stdin.close()
        for thread in self.threads:
            thread.join(30)
        for helper in self.helpers:
            helper.proc.wait(30)

    def stop_job(self, record: JobRecord, current: Any) -> int:
        return 0


# ---------------------------------------------------------------- the measurement


class ViewFile(io.StringIO):
    """The live view's terminal: a file that says it is a TTY (rich draws to it as to one)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.file: IO[str] = path.open("w", encoding="utf-8")

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return self.file.write(text)

    def flush(self) -> None:
        self.file.flush()


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads, by name (those of one name added up)."""
    used: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = re.sub(r"-\d+", "", thread.name)
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return used


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(hosts: int, seconds: float, home: Path, threads: bool = False) -> dict[str, Any]:
    """Run one job on `hosts` simulated hosts for `seconds`, lose one, and measure it (`threads`:
    also say on stderr the cores used while every host ran, and by which threads)."""
    os.environ["DISTRUN_HOME"] = str(home)
    os.environ.setdefault("COLUMNS", "160")
    os.environ.setdefault("LINES", "50")
    registry.REGISTRY["sim"] = f"{__name__}:SimBackend"
    job = home / "job.yaml"
    job.write_text(f"name: sim\nscript: {REPO / 'bench' / 'allreduce_job.py'}\nnproc_per_node: {RANKS}\n"
                   f"hang_timeout: 600\ntelemetry: {{interval: {TELEMETRY_EVERY}}}\n")
    SimBackend.made.clear()
    made = SimBackend.made  # the launch makes the backend: the bench reaches it here
    lost_at: list[float] = []

    running: dict[str, Any] = {}

    def lose_one() -> None:
        while not made or not made[0].all_running.is_set():
            time.sleep(0.05)
        running.update(at=time.monotonic(), cpu=cpu_seconds(), threads=thread_cpu())
        time.sleep(seconds)
        running.update(cores=(cpu_seconds() - running["cpu"]) / (time.monotonic() - running["at"]),
                       threads={k: v - running["threads"].get(k, 0.0) for k, v in thread_cpu().items()})
        lost_at.append(time.monotonic())
        made[0].lose(f"sim{hosts // 2}")

    threading.Thread(target=lose_one, daemon=True).start()
    view = ViewFile(home / "live-view.txt")
    cpu0, began = cpu_seconds(), time.monotonic()
    with contextlib.redirect_stdout(view):
        launch.launch(LaunchRequest(str(job), backend="sim", job_id="sim-1", nnodes=hosts, live=True,
                                    skip_preflight=True))
    wall, cpu = time.monotonic() - began, cpu_seconds() - cpu0
    if threads and "cores" in running:
        print(f"while every host ran: {running['cores']:.2f} cores; CPU s by thread:", file=sys.stderr)
        for name, used in sorted(running["threads"].items(), key=lambda item: -item[1])[:12]:
            print(f"  {used:7.2f}  {name}", file=sys.stderr)
    backend = made[0]
    printed = sum(h.total or 0 for h in backend.helpers)
    stored = sum(e.nlines for e in read_index(str(Store().job_dir("sim-1").root)) if e.rank is not None)
    failures = Store().get("sim-1").failures
    return {
        "hosts": hosts, "controller_cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "launch_s": round(max(backend.first_output.values()) - began, 2),
        "stop_s": round(time.monotonic() - lost_at[0], 2) if lost_at else None,
        "lines": printed, "lines_lost": printed - stored, "root_cause": failures[0]["host"] if failures else None,
        "root_reason": failures[0]["reason"] if failures else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the job runs before a host is lost")
    parser.add_argument("--json", action="store_true", help="print one JSON line (else a readable one)")
    parser.add_argument("--threads", action="store_true",
                        help="also say on stderr the cores used while every host ran, by thread")
    parser.add_argument("--helper", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.helper:
        return helper_main()
    with tempfile.TemporaryDirectory(prefix="scale-sim-") as home:
        result = measure(args.hosts, args.seconds, Path(home), args.threads)
    print(json.dumps(result) if args.json else "  ".join(f"{k} {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
