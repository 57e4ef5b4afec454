"""The machinery of a fault cell: a job on the namespace cluster, driven to a phase, faulted, observed.

A `Scene` is one cell's run: it writes the job and an inventory whose node2 runs python
through a `Gate` (so a phase can be held while the fault is injected), starts `distrun
launch` in the background, drives it to the cell's phase, injects the fault (`FAULTS`), and
then watches the controller and every host until both are done or the cell's bound has
passed. What it saw is an `Observed`; invariants.py judges it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tests.cluster.harness import Cluster, Proc
from tests.cluster.procs import pose_as_rank_argv, second_user
from tests.faults.matrix import (
    FAULTY_HOST,
    FREEZE,
    FT_GROUP,
    GRACE,
    HEARTBEAT,
    LOCK,
    RANK,
    STALL,
    Cell,
    Fault,
    Outcome,
    Phase,
)
from tests.helpers import REPO, distrun, job_lines, unique_job_id, wait_for

WORKER = Path(__file__).parent / "jobs" / "worker.py"
FT_WORKER = REPO / "jobs" / "train_ft.py"
FT_BACK = re.compile(rf"restarting: attempt 2.*?^\[g{FT_GROUP}\] \[node\d r0\] ft step ", re.M | re.S)
# The lighthouse started again, then 5 steps of group FT_GROUP (from whichever start of it).
LIGHTHOUSE_BACK = re.compile(rf"^\[lighthouse\] restarting: attempt 2.*?(?:^\[g{FT_GROUP}\] \[node\d r0\] ft step "
                             r".*?){5}", re.M | re.S)
POLL = 0.1
PHASE_WAIT = 120.0
HOSTS = ("node0", "node1", "node2")
NODE2 = HOSTS.index(FAULTY_HOST)
IMPOSTOR_HOST = 1  # node1: a host no fault reboots
IMPOSTOR_RANK = 7



# ---------------------------------------------------------------- hosts


def job_processes(cluster: Cluster, i: int, job_id: str) -> list[Proc]:
    """Every process of the job on host i: its supervisor (the job id in its argv) and everything
    started with the job's id (or one of its replica groups', `<id>-g<K>`, or its lighthouse's,
    `<id>-lh`) in its environment (the gate, torchrun, the ranks, the lighthouse), the job's user's
    (the impostor carries the same markers as another user)."""
    ours = re.compile(re.escape(job_id) + r"(-g\d+|-lh)?")
    return [p for p in cluster.processes(i) if p.uid() == os.getuid()
            and (ours.fullmatch(p.environ().get("DISTRUN_JOB_ID", "")) or any(job_id in arg for arg in p.cmdline))]


def probes(cluster: Cluster, i: int) -> list[Proc]:
    """distrun's probes on host i (a launch's preflight)."""
    return [p for p in cluster.processes(i) if any("distrun-probe" in arg for arg in p.cmdline)]


def supervisor(cluster: Cluster, i: int, job_id: str) -> Proc:
    return _one(cluster, i, lambda p: "distrun-supervisor" in p.cmdline and job_id in p.cmdline, "supervisor")


def torchrun(cluster: Cluster, i: int, job_id: str) -> Proc:
    # distrun's program that runs it, by name in the plan (remote/distrun_torchrun.py).
    return _one(cluster, i, lambda p: p.environ_has(job_id, key="DISTRUN_JOB_ID")
                and any(arg.endswith("/distrun_torchrun.py") for arg in p.cmdline), "torchrun")


def worker(cluster: Cluster, rank: int, job_id: str) -> Proc:
    return _one(cluster, rank // 2, lambda p: p.environ_has(job_id, key="DISTRUN_JOB_ID")
                and p.environ_has(str(rank), key="RANK"), f"rank {rank}")


def _one(cluster: Cluster, i: int, match: Callable[[Proc], bool], what: str) -> Proc:
    deadline = time.monotonic() + 30
    while True:
        found = [p for p in cluster.processes(i) if match(p)]
        if found or time.monotonic() > deadline:
            break
        time.sleep(POLL)
    assert found, f"no {what} on {HOSTS[i]}"
    return found[0]


# ---------------------------------------------------------------- the gate


class Gate:
    """node2's python, wrapped: a command of an armed role (probe, torchrun) waits for `release`.

    The wrapper is a shell script the inventory names as node2's python; it recognises the
    probe by its `distrun-probe` tag and torchrun by its program `distrun_torchrun.py`, and execs the
    real python once released (the held process is then the real one, same pid). Beside it, as
    beside any host's python, is `torchft_lighthouse` (a fault-tolerant job's lighthouse, lighthouse.program).
    """

    ROLES: ClassVar[dict[str, str]] = {"probe": "*distrun-probe*", "torchrun": "*/distrun_torchrun.py*"}

    def __init__(self, root: Path) -> None:
        self.dir = root / "gate"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = root / "python-gated"
        cases = "".join(f'  {pattern}) role={role} ;;\n' for role, pattern in self.ROLES.items())
        self.path.write_text(
            "#!/bin/sh\n"
            f'case "$*" in\n{cases}  *) role=none ;;\nesac\n'
            f'if [ -e "{self.dir}/arm-$role" ]; then\n'
            f'  touch "{self.dir}/reached-$role"\n'
            f'  while [ ! -e "{self.dir}/go-$role" ]; do sleep 0.05; done\n'
            "fi\n"
            f'exec {sys.executable} "$@"\n'
        )
        self.path.chmod(0o755)
        beside = Path(sys.executable).parent / "torchft_lighthouse"
        if beside.exists() and not (root / beside.name).exists():
            (root / beside.name).symlink_to(beside)

    def arm(self, role: str) -> None:
        (self.dir / f"arm-{role}").touch()

    def reached(self, role: str, timeout: float = PHASE_WAIT) -> None:
        assert wait_for(lambda: (self.dir / f"reached-{role}").exists(), timeout), f"node2's {role} never started"

    def release(self) -> None:
        for role in self.ROLES:
            (self.dir / f"go-{role}").touch()


# ---------------------------------------------------------------- jobs


def write_job(path: Path, name: str, args: list[str], *, nproc: int = 2, heartbeat: float | None = HEARTBEAT,
              grace: float | None = GRACE) -> Path:
    """A job file running the matrix's worker; a timing left None is distrun's default."""
    timing = "".join(f"{key}: {value:g}\n" for key, value in (("heartbeat_timeout", heartbeat),
                                                               ("stop_grace", grace)) if value is not None)
    path.write_text(f"name: {name}\nscript: {WORKER}\nargs: {json.dumps(args)}\nnproc_per_node: {nproc}\n{timing}")
    return path


@dataclass
class Controller:
    """`distrun launch` running in the background; its terminal is a file (or a pipe nobody reads)."""

    proc: subprocess.Popen[bytes]
    home: Path
    job_id: str
    out: Path
    pipe_reader: threading.Thread | None = None

    @classmethod
    def start(cls, job: Path, inventory: Path, home: Path, job_id: str, *, piped: bool = False) -> Controller:
        env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1"}
        env.pop("DISTRUN_INVENTORY", None)
        out = home.parent / f"{job_id}.out"
        argv = [sys.executable, "-m", "orchestrator", "launch", str(job), "-i", str(inventory), "--job-id", job_id,
                "--no-live"]
        with open(out, "wb") as sink:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE if piped else sink,
                                    stderr=sink if piped else subprocess.STDOUT)
        return cls(proc, home, job_id, out)

    def drain_later(self, after: float) -> None:
        """Read the piped stdout into the output file, starting `after` seconds from now."""
        def drain() -> None:
            time.sleep(after)
            assert self.proc.stdout is not None
            with open(self.out, "ab") as sink:
                for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
                    sink.write(chunk)

        self.pipe_reader = threading.Thread(target=drain, daemon=True)
        self.pipe_reader.start()

    @property
    def job_dir(self) -> Path:
        return self.home / "jobs" / self.job_id

    def combined(self) -> str:
        """The job's lines as `distrun logs` shows them (`[node1 r3] text`), "" before there are any."""
        try:
            return job_lines(self.job_dir)
        except OSError:
            return ""

    def terminal(self) -> str:
        if self.pipe_reader is not None:
            self.pipe_reader.join(timeout=30)
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def record(self) -> dict | None:
        """The job's record as `distrun ps --json` shows it (after `ps` settled it), or None."""
        listed = distrun("ps", "--json", "--all", home=self.home)
        assert listed.returncode == 0, listed.stderr
        return next((r for r in json.loads(listed.stdout) if r["id"] == self.job_id), None)

    def wait_line(self, text: str, timeout: float = PHASE_WAIT) -> None:
        assert wait_for(lambda: text in self.combined(), timeout) or self.proc.poll() is not None, \
            f"{text!r} never appeared in the job's lines"
        assert text in self.combined(), f"the controller ended before {text!r}: {self.terminal()[-2000:]}"

    def end(self) -> None:
        """Make sure the controller is gone (after a failed cell): SIGCONT, then SIGKILL."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def write_ft_job(path: Path, cell: Cell, port: int, until: Path) -> Path:
    """The fault-tolerant cells' job: 2 replica groups of one host and one rank (node0, node1), node2 the
    spare; stepping until `until` exists. Fewer than min_replicas left: 2 needed, no relaunch. The
    lighthouse SIGKILLed: a group torchft crashes meanwhile may be relaunched 3 times."""
    below = cell.fault is Fault.GROUPS_BELOW_MIN
    relaunches = 0 if below else 3 if cell.fault is Fault.LIGHTHOUSE_KILLED else 1
    args = json.dumps(["--steps", "100000", "--step-time", "0.2", "--until", str(until)])
    path.write_text(f"name: faulty\nscript: {FT_WORKER}\nargs: {args}\n"
                    f"nproc_per_node: 1\nnnodes: 2\nenv: {{OMP_NUM_THREADS: '1', RUST_LOG: warn}}\n"
                    f"heartbeat_timeout: {HEARTBEAT:g}\nstop_grace: {GRACE:g}\n"
                    f"restarts: {{max: {relaunches}, backoff: 1}}\n"
                    f"fault_tolerance: {{min_replicas: {2 if below else 1}, lighthouse_port: {port}}}\n")
    return path


def lighthouses(port: int) -> list[str]:
    """This machine's processes listening as a lighthouse on `port` (their command lines)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if f"0.0.0.0:{port}" in line:
                found.append(line[:120])
    return found


def worker_args(phase: Phase, cell: Cell) -> list[str]:
    """What the job's ranks do: tick until stopped; in `stopping`, rank 3 fails and the rest take
    their time to stop; a cell that must succeed ends after a few seconds of ticks."""
    if cell.fault is Fault.STDOUT_STALLED:
        return ["--ticks", "60", "--chatty", "40"]
    if cell.fault is Fault.CONTROLLER_FROZEN_CHATTY:
        return ["--chatty", "1500"]
    children = ["--children"] if cell.fault is Fault.CHILDREN_LEFT else []
    if phase is Phase.STOPPING:  # with children: time to see them all before rank 3 fails
        return ["--fail-rank", str(RANK), "--fail-at", "24" if children else "8", "--linger", "60", *children]
    if cell.outcome.value == "succeeded":
        return ["--ticks", "24", *children]
    return children


# ---------------------------------------------------------------- another job on the same hosts


class Bystander:
    """A second job on the same hosts, one rank each, running through many cells: a fault of one
    job must leave it untouched (the same processes, still printing)."""

    def __init__(self, cluster: Cluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.count = 0
        self.controller: Controller | None = None
        self.until = root / "finish"

    def ensure(self) -> None:
        """Running on every host (started again after a cell that took a host down with it)."""
        if self.controller is not None and self.controller.proc.poll() is None and all(self.pids().values()):
            return
        if self.controller is not None:
            self.controller.end()
        self.count += 1
        job_id = unique_job_id(f"bystander-{self.count}")
        home = self.root / f"home{self.count}"
        home.mkdir(parents=True)
        job = write_job(self.root / f"{job_id}.yaml", "bystander",
                        ["--every", "0.5", "--until", str(self.until)], nproc=1, heartbeat=60)
        inventory = self.cluster.write_inventory(self.root / "inventory.yaml")
        self.controller = Controller.start(job, inventory, home, job_id)
        for rank in range(3):
            self.controller.wait_line(f"[node{rank} r{rank}] tick {rank} 1")

    def pids(self) -> dict[int, set[int]]:
        assert self.controller is not None
        return {i: {p.pid for p in job_processes(self.cluster, i, self.controller.job_id)} for i in range(3)}

    def lines(self) -> int:
        assert self.controller is not None
        return self.controller.combined().count(" tick ")

    def finish(self) -> tuple[int | None, dict | None]:
        """Let the job end well (once); its exit code and record."""
        if self.controller is None or self.until.exists():
            return None, None
        self.until.touch()
        try:
            rc = self.controller.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.controller.end()
            rc = None
        return rc, self.controller.record()


# ---------------------------------------------------------------- what a cell saw


@dataclass
class Observed:
    """What happened after the fault, in seconds from it (None: not within the watch)."""

    rc: int | None = None
    returned: float | None = None
    clean: float | None = None  # every host not cut off
    cut_clean: float | None = None  # the cut host, from its link's return
    leftovers: dict[str, list[str]] = field(default_factory=dict)
    record: dict | None = None
    terminal: str = ""
    files: dict[str, str] = field(default_factory=dict)  # the lines as `distrun logs` shows them; ranks/<r>.out
    bystander_before: dict[int, set[int]] = field(default_factory=dict)
    bystander_after: dict[int, set[int]] = field(default_factory=dict)
    bystander_lines: tuple[int, int] = (0, 0)
    impostor_alive: bool | None = None  # None: no impostor was placed (its host was rebooted)


class Scene:
    """One cell's run on the cluster (see the module docstring)."""

    def __init__(self, cluster: Cluster, cell: Cell, root: Path, bystander: Bystander | None,
                 default_timing: bool = False) -> None:
        self.cluster = cluster
        self.cell = cell
        self.root = root
        self.bystander = bystander
        self.timing = {"heartbeat": None, "grace": None} if default_timing else {}
        self.job_id = f"{cell.id}-{os.getpid() % 1000}-{int(time.time()) % 100000}"
        self.home = root / "home"
        self.gate = Gate(root)
        self.cut: int | None = None
        self.undo: list[Callable[[], None]] = []
        self.impostor: Proc | None = None
        self.controller: Controller | None = None
        self.fault_at = 0.0
        self.port = 29000 + int.from_bytes(os.urandom(2)) % 900  # an FT job's lighthouse
        self.until = root / "until"

    def run(self) -> Observed:
        """The whole cell: its disk made small where needed, the phase, the fault, the watch; then
        whatever the fault left undone is undone."""
        try:
            with small_disk(self):
                self.impostor = self.pose_as_rank()
                self.reach()
                self.inject()
                return self.watch()
        finally:
            self.close()

    # -- setting up ---------------------------------------------------------------

    def pose_as_rank(self) -> Proc:
        """Another user's process on node1 with the job's markers and RANK=7 (no rank of the job has
        it), there before the job starts and killed when the cell ends."""
        uid = second_user()
        self.cluster.host_run(IMPOSTOR_HOST, pose_as_rank_argv(uid, self.job_id, HOSTS[IMPOSTOR_HOST], IMPOSTOR_RANK))
        impostor = _one(self.cluster, IMPOSTOR_HOST, lambda p: p.uid() == uid and p.environ_has(self.job_id),
                        "the impostor")
        self.undo.append(lambda: os.kill(impostor.pid, signal.SIGKILL))
        return impostor

    def inventory(self) -> Path:
        nodes = [{"name": HOSTS[i], "host": self.cluster.addr(i)} for i in range(3)]
        nodes[NODE2]["python"] = str(self.gate.path)
        return self.cluster.write_inventory(self.root / "inventory.yaml", nodes=nodes)

    def launch(self) -> Controller:
        self.home.mkdir(parents=True, exist_ok=True)
        if self.cell.phase is Phase.FT:
            job = write_ft_job(self.root / "job.yaml", self.cell, self.port, self.until)
        else:
            job = write_job(self.root / "job.yaml", "faulty", worker_args(self.cell.phase, self.cell), **self.timing)
        piped = self.cell.fault is Fault.STDOUT_STALLED
        self.controller = Controller.start(job, self.inventory(), self.home, self.job_id, piped=piped)
        if piped:
            self.controller.drain_later(STALL)
        return self.controller

    # -- reaching the phase -------------------------------------------------------

    def reach(self) -> None:
        """Start the job and hold it in the cell's phase (a link cut in preflight: the link is down when
        the launch connects; cut during a probe, the connection takes ~35 s to drop)."""
        phase = self.cell.phase
        if phase is Phase.PREFLIGHT and self.cell.fault is Fault.LINK_CUT:
            self.inject()
            self.launch()
            return
        if phase is Phase.PREFLIGHT:
            self.gate.arm("probe")
        if phase is Phase.RENDEZVOUS:
            self.gate.arm("torchrun")
        controller = self.launch()
        if self.cell.fault is Fault.CHILDREN_LEFT:
            children_started(self)
        if phase is Phase.PREFLIGHT:
            self.gate.reached("probe")
        elif phase is Phase.RENDEZVOUS:
            self.gate.reached("torchrun")
            for i in range(2):
                torchrun(self.cluster, i, self.job_id)
            time.sleep(1.0)  # node0 and node1's agents are in their rendezvous, waiting for node2
        elif phase is Phase.FT:
            # Its 5th step (a group that joins late heals into a later step number).
            assert wait_for(lambda: controller.terminal().count(f" group {FT_GROUP} participants") >= 5
                            or controller.proc.poll() is not None, PHASE_WAIT), controller.terminal()[-2000:]
        elif phase is Phase.TRAINING:
            for rank in range(6):
                controller.wait_line(f"r{rank}] tick {rank} 2")
        else:
            controller.wait_line("distrun: stopping (node1 failed)")

    # -- the fault ----------------------------------------------------------------

    def inject(self) -> None:
        if self.fault_at:
            return  # injected already, before the phase (see `reach`)
        if self.bystander is not None:
            self.before = self.bystander.pids()
            self.lines_before = self.bystander.lines()
        self.fault_at = time.monotonic()
        (FT_FAULTS if self.cell.phase is Phase.FT else FAULTS)[self.cell.fault](self)
        self.gate.release()
        if self.cell.phase is Phase.FT and self.cell.outcome is not Outcome.LOST:
            threading.Thread(target=self.end_ft_job_once_healed, daemon=True).start()

    def end_ft_job_once_healed(self) -> None:
        """Once the faulted group (or the lighthouse) is started again and group FT_GROUP has stepped
        again, every group may end (`--until`)."""
        assert self.controller is not None
        back = LIGHTHOUSE_BACK if self.cell.fault is Fault.LIGHTHOUSE_KILLED else FT_BACK
        wait_for(lambda: back.search(self.controller.terminal()), self.cell.bound)  # type: ignore[union-attr]
        self.until.touch()

    # -- watching -----------------------------------------------------------------

    def watch(self) -> Observed:
        """Poll the controller and the hosts until both are done, or the bound (and a margin) passed."""
        assert self.controller is not None
        seen = Observed()
        limit = self.fault_at + self.cell.bound + 10
        while time.monotonic() < limit and (seen.returned is None or seen.clean is None):
            now = time.monotonic() - self.fault_at
            if seen.returned is None and self.controller.proc.poll() is not None:
                seen.returned, seen.rc = now, self.controller.proc.returncode
                self.restore_link()
            if seen.clean is None and not self.leftovers(reachable_only=True):
                seen.clean = now
            time.sleep(POLL)
        if seen.returned is None:
            self.controller.end()
            seen.rc = self.controller.proc.returncode
        self.restore_link()
        if self.cut is not None:
            restored = time.monotonic()
            if wait_for(lambda: not job_processes(self.cluster, self.cut, self.job_id), HEARTBEAT + GRACE + 10):
                seen.cut_clean = time.monotonic() - restored
        seen.leftovers = self.leftovers(reachable_only=False)
        seen.terminal = self.controller.terminal()
        seen.record = self.controller.record()
        seen.files = self.files()
        seen.impostor_alive = None if self.impostor is None else self.impostor.alive()
        if self.bystander is not None:
            seen.bystander_before = self.before
            seen.bystander_after = self.bystander.pids()
            wait_for(lambda: self.bystander.lines() > self.lines_before + 3, 10)  # type: ignore[union-attr]
            seen.bystander_lines = (self.lines_before, self.bystander.lines())
        return seen

    def leftovers(self, reachable_only: bool) -> dict[str, list[str]]:
        """What is left of the job (and of its preflight) on each host, cut host aside if asked."""
        found = {}
        for i in range(3):
            if reachable_only and i == self.cut:
                continue
            procs = job_processes(self.cluster, i, self.job_id) + probes(self.cluster, i)
            if procs:
                found[HOSTS[i]] = [" ".join(p.cmdline)[:120] for p in procs]
        if self.cell.phase is Phase.FT and lighthouses(self.port):
            found["lighthouse"] = lighthouses(self.port)
        return found

    def files(self) -> dict[str, str]:
        assert self.controller is not None
        root = self.controller.job_dir
        if not root.exists():
            return {}
        if self.cell.phase is Phase.FT:  # each group's lines, as the parent shows them
            groups = sorted(self.home.glob(f"jobs/{self.job_id}-g*"))
            return {"combined": "".join(f"[g{d.name.rsplit('-g', 1)[1]}] {line}\n" for d in groups
                                        for line in job_lines(d).splitlines())}
        found = {"combined": self.controller.combined()}
        for path in sorted((root / "ranks").glob("*.out")):
            found[f"rank{path.stem}"] = path.read_text(errors="replace")
        return found

    def restore_link(self) -> None:
        if self.cut is not None and not getattr(self, "_restored", False):
            self.cluster.restore(self.cut)
            self._restored = True

    def close(self) -> None:
        """Whatever happened: the link back, the gate open, undo what the fault did, no controller left."""
        self.restore_link()
        self.gate.release()
        if self.controller is not None:
            self.controller.end()
        for undo in reversed(self.undo):
            with contextlib.suppress(Exception):
                undo()


# ---------------------------------------------------------------- the faults


def _cut(scene: Scene, i: int) -> None:
    scene.cut = i
    scene.cluster.cut(i)


def _link_cut(scene: Scene) -> None:
    _cut(scene, NODE2)


def _sshd_killed(scene: Scene) -> None:
    """sshd's listener and every session of node2 SIGKILLed (what runs in the sessions lives on)."""
    cluster = scene.cluster
    cluster.stop_sshd(NODE2)
    scene.undo.append(lambda: cluster.start_sshd(NODE2))
    for proc in cluster.processes(NODE2):
        if proc.cmdline and proc.cmdline[0].startswith("sshd:"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


def _reboot(scene: Scene) -> None:
    scene.cluster.kill_all(NODE2)


def _kill(proc: Proc, sig: int = signal.SIGKILL) -> None:
    os.kill(proc.pid, sig)


def _supervisor_killed(scene: Scene) -> None:
    _kill(supervisor(scene.cluster, NODE2, scene.job_id))


def _torchrun_killed(scene: Scene) -> None:
    # In the rendezvous node2's torchrun has not started (the gate holds it): node1's waits there.
    host = 1 if scene.cell.phase is Phase.RENDEZVOUS else NODE2
    _kill(torchrun(scene.cluster, host, scene.job_id))


def _worker_killed(scene: Scene) -> None:
    # While stopping, rank 3 has failed already: a rank of node2 is the one still stopping.
    rank = 4 if scene.cell.phase is Phase.STOPPING else RANK
    _kill(worker(scene.cluster, rank, scene.job_id))


def _worker_segv(scene: Scene) -> None:
    _kill(worker(scene.cluster, RANK, scene.job_id), signal.SIGSEGV)


def _error_file_malformed(scene: Scene) -> None:
    _kill(worker(scene.cluster, RANK, scene.job_id), signal.SIGUSR1)


def _raised_no_record(scene: Scene) -> None:
    _kill(worker(scene.cluster, RANK, scene.job_id), signal.SIGUSR2)


def _controller_killed(scene: Scene) -> None:
    assert scene.controller is not None
    scene.controller.proc.kill()


def _controller_frozen(scene: Scene) -> None:
    assert scene.controller is not None
    pid = scene.controller.proc.pid
    os.kill(pid, signal.SIGSTOP)
    time.sleep(FREEZE)
    os.kill(pid, signal.SIGCONT)


def _stdout_stalled(scene: Scene) -> None:
    """Nothing to do: the controller's stdout is a pipe that is read only STALL seconds after the start."""


def _host_disk_full(scene: Scene) -> None:
    """node2's disk, where its supervisor keeps the host-side copy (~/.distrun), fills up."""
    filled = scene.cluster.host_run(NODE2, ["sh", "-c", f"cat /dev/zero > {HOST_DIR}/fill"])
    assert "No space left" in filled.stderr, filled.stderr


def _controller_disk_full(scene: Scene) -> None:
    """DISTRUN_HOME (a small tmpfs) fills up; during training, it is freed again a few seconds later."""
    filler = scene.home / "fill"
    subprocess.run(["sh", "-c", f"cat /dev/zero > {filler}"], capture_output=True, check=False)
    if scene.cell.phase is Phase.TRAINING:
        threading.Timer(5.0, lambda: filler.unlink(missing_ok=True)).start()


def _database_locked(scene: Scene) -> None:
    """Another process takes the job database's write lock and holds it for LOCK seconds."""
    code = ("import sqlite3,sys,time;db=sqlite3.connect(sys.argv[1],isolation_level=None);"
            "db.execute('BEGIN EXCLUSIVE');print('locked',flush=True);time.sleep(float(sys.argv[2]));"
            "db.execute('COMMIT')")
    holder = subprocess.Popen([sys.executable, "-c", code, str(scene.home / "distrun.db"), f"{LOCK:g}"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    scene.undo.append(holder.kill)


def _master_lost(scene: Scene) -> None:
    _cut(scene, 0)


def _children_left(scene: Scene) -> None:
    """Nothing is done: the ranks started their children (`children_started`)."""


def children_started(scene: Scene) -> None:
    """Every rank's three children (jobs/worker.py --children) were seen running (18 pids over the
    polls: a torchrun that stops its failed rank's group ends some of them early)."""
    seen: set[tuple[int, int]] = set()

    def started() -> bool:
        seen.update((i, p.pid) for i in range(3) for p in job_processes(scene.cluster, i, scene.job_id)
                    if "child-of" in p.cmdline)
        return len(seen) >= 18
    assert wait_for(started, 30), f"the ranks' children did not start: {len(seen)} of 18 seen"


FAULTS: dict[Fault, Callable[[Scene], None]] = {
    Fault.LINK_CUT: _link_cut,
    Fault.SSHD_KILLED: _sshd_killed,
    Fault.REBOOT: _reboot,
    Fault.SUPERVISOR_KILLED: _supervisor_killed,
    Fault.TORCHRUN_KILLED: _torchrun_killed,
    Fault.WORKER_KILLED: _worker_killed,
    Fault.WORKER_SEGV: _worker_segv,
    Fault.CONTROLLER_KILLED: _controller_killed,
    Fault.CONTROLLER_FROZEN: _controller_frozen,
    Fault.CONTROLLER_FROZEN_CHATTY: _controller_frozen,
    Fault.STDOUT_STALLED: _stdout_stalled,
    Fault.HOST_DISK_FULL: _host_disk_full,
    Fault.CONTROLLER_DISK_FULL: _controller_disk_full,
    Fault.DATABASE_LOCKED: _database_locked,
    Fault.MASTER_LOST: _master_lost,
    Fault.ERROR_FILE_MALFORMED: _error_file_malformed,
    Fault.RAISED_NO_RECORD: _raised_no_record,
    Fault.CHILDREN_LEFT: _children_left,
}



def _ft_cut(scene: Scene) -> None:
    _cut(scene, FT_GROUP)


def _ft_worker_killed(scene: Scene) -> None:
    group = f"{scene.job_id}-g{FT_GROUP}"
    _kill(_one(scene.cluster, FT_GROUP, lambda p: p.environ_has(group, key="DISTRUN_JOB_ID")
               and p.environ_has("0", key="RANK") and str(FT_WORKER) in p.cmdline, "group 1's rank 0"))


def _lighthouse_killed(scene: Scene) -> None:
    """The torchft_lighthouse process itself (not the torchrun that runs it) on node2, the spare."""
    light = f"{scene.job_id}-lh"
    _kill(_one(scene.cluster, NODE2, lambda p: p.environ_has(light, key="DISTRUN_JOB_ID")
               and any(arg.endswith("torchft_lighthouse") for arg in p.cmdline)
               and not any(arg.endswith("/distrun_torchrun.py") for arg in p.cmdline), "the lighthouse"))


FT_FAULTS: dict[Fault, Callable[[Scene], None]] = {
    Fault.LINK_CUT: _ft_cut,
    Fault.WORKER_KILLED: _ft_worker_killed,
    Fault.GROUPS_BELOW_MIN: _ft_worker_killed,
    Fault.CONTROLLER_KILLED: _controller_killed,
    Fault.LIGHTHOUSE_KILLED: _lighthouse_killed,
}

HOST_DIR = "/root/.distrun"


@contextlib.contextmanager
def small_disk(scene: Scene) -> Iterator[None]:
    """The cell's disk made small where its fault fills it: node2's ~/.distrun (in node2's own
    mount namespace), or DISTRUN_HOME on this machine; the job database exists before it fills."""
    if scene.cell.fault is Fault.HOST_DISK_FULL:
        mounted = scene.cluster.host_run(NODE2, ["sh", "-c", f"mkdir -p {HOST_DIR} && "
                                                 f"mount -t tmpfs -o size=2m,mode=0700 distrun-faults {HOST_DIR}"])
        assert mounted.returncode == 0, mounted.stderr
        try:
            yield
        finally:
            scene.cluster.host_run(NODE2, ["umount", "-l", HOST_DIR])
    elif scene.cell.fault is Fault.CONTROLLER_DISK_FULL:
        scene.home.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "distrun-faults", str(scene.home)], check=True)
        try:
            assert distrun("ps", home=scene.home).returncode == 0
            yield
        finally:
            subprocess.run(["umount", "-l", str(scene.home)], check=False)
    else:
        yield
