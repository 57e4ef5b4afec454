"""Log relaying figures (bench/results/logs.md): the flood against its peer, the controller's capacity, memory.

1. A flooding job, 3 namespace hosts x 2 ranks x N lines of 80 bytes each: under distrun (lines
   shown on the controller's stdout, which goes to a file, and kept in the job directory) against
   pdsh + torchrun (no --tee) running the same job with the lines written to /dev/null on the
   hosts. Alternating rounds; medians and the ratio; every relayed run checked complete. In both
   launchers' runs every process's CPU time is sampled and summed per role (controller, ssh, sshd,
   supervisor, torchrun's agent, ranks), and distrun's processes' resident memory.
2. The controller's capacity: host streams recorded from the real supervisor (run here with the
   flooding job's lines, tests/fake_torchrun standing in for torchrun) are fed to the controller's
   own code (HostRun -> LogSink -> files + screen to a file), pinned to one core.

Writes bench/results/logs.md. Run as root, holding the heavy lock:
    flock /work/locks/heavy.lock .venv/bin/python bench/logs_bench.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO, TICK, median, write_results
from launch_bench import JOB, PYTHON, distrun_argv, job_file, pdsh_argv

sys.path.insert(0, str(REPO))
from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_ONLY
from orchestrator.logs import LogSink
from orchestrator.logs.screen import Screen
from orchestrator.plan import HostPlan
from orchestrator.run.hostrun import HostRun
from orchestrator.store import JobDir
from tests.cluster.harness import Cluster

FAKE_TORCHRUN = REPO / "tests" / "fake_torchrun"


# ---------------------------------------------------------------- memory and CPU while a command runs

PAGE = os.sysconf("SC_PAGE_SIZE")
ROLES = ("controller", "ssh client", "sshd", "pdsh", "supervisor", "torchrun agent", "ranks")


@dataclass
class Usage:
    """What each process role used while sampling: peak resident memory (MB) of distrun's own
    processes, and CPU seconds (each process's utime + stime as last seen, summed per role)."""

    mb: dict[str, float] = field(default_factory=dict)
    seen: dict[int, tuple[str, int]] = field(default_factory=dict)
    busy: float = 0.0

    def cpu(self) -> dict[str, float]:
        seconds = dict.fromkeys(ROLES, 0.0)
        for role, ticks in self.seen.values():
            seconds[role] += ticks / TICK
        return seconds


def role_of(pid: int, argv: list[bytes], comm: str, controller: int | None) -> str | None:
    """The role of a process in a flood run, or None when it is not part of it."""
    if pid == controller:
        return "controller"
    if comm in ("ssh", "pdsh", "sshd"):
        return "ssh client" if comm == "ssh" else comm
    if any(b"distrun-supervisor" in a for a in argv):
        return "supervisor"
    if any(b"torch.distributed.run" in a or a.endswith((b"torchrun", b"distrun_torchrun.py")) for a in argv):
        return "torchrun agent"
    if any(a.endswith(JOB.name.encode()) for a in argv):
        return "ranks"
    return None


def machine_busy() -> float:
    """CPU seconds the machine has spent not idle since boot (all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def look(usage: Usage, controller: int | None, job_id: str | None) -> None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        role = role_of(pid, argv, comm, controller)
        if role is None:
            continue
        usage.seen[pid] = (role, int(rest[11]) + int(rest[12]))
        if role == "controller" or (role == "supervisor" and job_id and job_id.encode() in argv):
            usage.mb[role] = max(usage.mb.get(role, 0.0), int(rest[21]) * PAGE / 2**20)


def sampled(proc: subprocess.Popen[bytes], usage: Usage, job_id: str | None) -> int:
    """Wait for `proc`, looking at every process every 0.25 s (a process's last 0.25 s is not seen)."""
    controller = proc.pid if job_id else None
    began = machine_busy()
    while proc.poll() is None:
        look(usage, controller, job_id)
        time.sleep(0.25)
    usage.busy += machine_busy() - began
    return proc.returncode


# ---------------------------------------------------------------- 1. the flood against its peer


def run_distrun(job: Path, inv: Path, env: dict[str, str], job_id: str, out: Path, usage: Usage) -> float:
    """distrun with stdout to a file; seconds from start to exit, memory and CPU sampled meanwhile."""
    began = time.perf_counter()
    with open(out, "w") as fh:
        proc = subprocess.Popen(distrun_argv(job, inv, 3, job_id), env={**os.environ, **env}, cwd=REPO, stdout=fh,
                                stderr=subprocess.STDOUT)
        rc = sampled(proc, usage, job_id)
    if rc != 0:
        raise RuntimeError(f"distrun exited {rc}: {out.read_text()[-2000:]}")
    return time.perf_counter() - began


# The peers: the job's own /dev/null file (block-buffered: a few hundred writes per rank), and the
# job's stdout written line by line as under distrun (PYTHONUNBUFFERED, plan.py) but sent to /dev/null.
PEERS = {"pdsh": ("BENCH_DEVNULL=1", ""), "pdsh-same-writes": ("PYTHONUNBUFFERED=1", " >/dev/null")}
CONTENDERS = (*PEERS, "distrun")
TITLES = {"pdsh": "pdsh + torchrun, the job writing to its own /dev/null file (block-buffered)",
          "pdsh-same-writes": "pdsh + torchrun, the job's stdout written line by line as under distrun, to /dev/null",
          "distrun": "distrun: lines on the controller's stdout (a file) and in the job directory"}


def run_pdsh(cluster: Cluster, peer: str, lines: int, port: int, env: dict[str, str], usage: Usage) -> float:
    """pdsh + torchrun with the lines to /dev/null on the hosts; seconds, CPU sampled meanwhile."""
    tag, redirect = PEERS[peer]
    argv = pdsh_argv(cluster, 3, JOB, [str(lines)], port, tag=tag)
    argv[-1] += redirect
    began = time.perf_counter()
    proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    if sampled(proc, usage, None) != 0:
        raise RuntimeError(f"{peer} failed")
    return time.perf_counter() - began


JOB_LINE = re.compile(r"^rank [0-5] line \d+ x{60}$")
SHOWN_LINE = re.compile(r"^\[node[0-2] r[0-5]\] rank [0-5] line \d+ x{60}$")


def complete(home: Path, job_id: str, out: Path, lines: int) -> bool:
    """Every rank's lines in the job directory and on the (file) screen: the job's own lines only,
    not torchrun's (a traceback's `File ..., line 994` is not one of them)."""
    ranks = home / "jobs" / job_id / "ranks"
    stored = sum(sum(1 for ln in (ranks / f"{r}.out").open() if JOB_LINE.match(ln)) for r in range(6))
    shown = sum(1 for ln in out.open(errors="replace") if SHOWN_LINE.match(ln))
    return stored == shown == 6 * lines


def flood(cluster: Cluster, inv: Path, tmp: Path, rounds: int, lines: int,
          env: dict[str, str]) -> tuple[list[str], dict[str, Usage]]:
    job = job_file(tmp, "loud", JOB, [str(lines)])
    home, usage = Path(env["DISTRUN_HOME"]), {name: Usage() for name in CONTENDERS}
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    checks = []
    suffix = uuid.uuid4().hex[:6]  # the hosts' copies share one ~/.distrun here: no earlier run's copy is added to
    for i in range(rounds):
        for k, peer in enumerate(PEERS):
            times[peer].append(run_pdsh(cluster, peer, lines, 29700 + len(PEERS) * i + k, env, usage[peer]))
        out, job_id = tmp / f"screen-{i}.txt", f"loud-{suffix}-{i}"
        try:
            times["distrun"].append(run_distrun(job, inv, env, job_id, out, usage["distrun"]))
            checks.append(complete(home, job_id, out, lines))
        finally:
            shutil.rmtree(Path(f"~/.distrun/jobs/{job_id}").expanduser(), ignore_errors=True)
    med = {name: median(values) for name, values in times.items()}
    return [
        f"3 hosts x 2 ranks, {lines:,} lines of 80 bytes per rank ({6 * lines:,} lines, "
        f"{6 * lines * 80 / 1e6:.0f} MB), {rounds} alternating rounds (in each: {', '.join(CONTENDERS)}).", "",
        "| run | median s | runs |", "|---|---|---|",
        *(f"| {TITLES[name]} | {med[name]:.2f} | {', '.join(f'{x:.2f}' for x in times[name])} |"
          for name in CONTENDERS), "",
        *(f"**distrun / {peer} = {med['distrun'] / med[peer]:.3f}** (goal <= 1.05)." for peer in PEERS), "",
        f"Every distrun run complete (each line once in ranks/*.out and on the screen file): {all(checks)}.",
    ], usage


def cpu_rows(usage: dict[str, Usage], rounds: int) -> list[str]:
    """Per role, CPU seconds per round under each contender."""
    cpu = {name: u.cpu() for name, u in usage.items()}
    rows = [f"| role | {' | '.join(f'{name} CPU s' for name in CONTENDERS)} |",
            f"|---|{'---:|' * len(CONTENDERS)}"]
    rows += [f"| {role} | {' | '.join(f'{cpu[name][role] / rounds:.2f}' for name in CONTENDERS)} |" for role in ROLES]
    rows.append(f"| the whole machine (busy, /proc/stat) | "
                f"{' | '.join(f'{usage[name].busy / rounds:.2f}' for name in CONTENDERS)} |")
    return rows


# ---------------------------------------------------------------- 2. the controller's capacity


def record_stream(tmp: Path, lines: int, node_rank: int) -> bytes:
    """A host's stream as the real supervisor writes it: 2 ranks x `lines` lines of 80 bytes, each
    written on its own under `python -u` as the flooding job writes them (so batches are cut as
    they are in the flood)."""
    worker = tmp / "flood_worker.py"
    worker.write_text("import os, sys\nr = os.environ['RANK']\n"
                      f"for i in range({lines}):\n"
                      "    sys.stdout.write(f'rank {r} line {i:07d} ' + 'x' * 58 + '\\n')\n")
    cfg = {"job_id": "rec", "node": f"node{node_rank}", "host_dir": str(tmp / "host"), "heartbeat_timeout": None,
           "stop_grace": 1, "telemetry_interval": None, "first_rank": 2 * node_rank, "exact_ranks": True,
           "secret_names": [], "env": {},
           "argv": [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--node-rank", str(node_rank),
                    "--redirects", "3", str(worker)]}
    payload = remote.bundle("supervisor", SUPERVISOR_ONLY)
    result = subprocess.run(remote.bootstrap_argv(PYTHON, payload, "bench"), input=payload + json.dumps(cfg).encode()
                            + b"\n", capture_output=True, env={**os.environ, "PYTHONPATH": str(FAKE_TORCHRUN)},
                            check=True)
    return result.stdout


def feed(streams: list[bytes], tmp: Path, screen_file: Path | None) -> tuple[float, float, int]:
    """(wall s, CPU s, lines) for the controller's code to take the streams in 64 KB chunks."""
    job_dir = JobDir(tmp / f"cap-{time.monotonic_ns()}")
    job_dir.create()
    out = open(screen_file, "w") if screen_file else None  # noqa: SIM115 - closed below
    sink = LogSink(job_dir, Screen(out, job_id="cap") if out else None, secrets=["not-in-the-lines"])
    hosts = [HostRun(HostPlan(f"node{i}", "h", i, 2, "python3", "/", [], {}, [], None), sink)
             for i in range(len(streams))]
    began, cpu = time.perf_counter(), time.process_time()
    for host, stream in zip(hosts, streams, strict=True):
        for at in range(0, len(stream), 1 << 16):
            host.on_data(stream[at:at + (1 << 16)])
    sink.close()
    wall, used = time.perf_counter() - began, time.process_time() - cpu
    if out:
        out.close()
    count = sum((job_dir.root / "ranks" / f"{r}.out").read_bytes().count(b"\n") for r in range(2 * len(streams)))
    return wall, used, count


def capacity(tmp: Path, lines: int, rounds: int) -> list[str]:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    streams = [record_stream(tmp, lines, node_rank) for node_rank in range(3)]
    batches = streams[0].count(b"\n\x1f") + 1
    rows = ["| controller path | lines | median wall s | median lines/s (wall) | lines/s per CPU second |",
            "|---|---|---|---|---|"]
    for name, screen in (("job directory only (detached)", None), ("job directory + screen (to a file)",
                                                                   tmp / "screen.txt")):
        runs = [feed(streams, tmp, screen) for _ in range(rounds)]
        wall, cpu, count = median([r[0] for r in runs]), median([r[1] for r in runs]), runs[0][2]
        rows.append(f"| {name} | {count:,} | {wall:.3f} | {count / wall:,.0f} | {count / cpu:,.0f} |")
    return [f"3 recorded host streams of 2 ranks x {lines:,} lines of 80 bytes, written by the real supervisor "
            f"(about {len(streams[0]) * 3 / 1e6:.0f} MB, {batches} batches per host), fed in 64 KB chunks to "
            f"HostRun.on_data in one process pinned to one core; {rounds} runs each, medians.", "", *rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--skip-flood", action="store_true", help="only the controller's capacity")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="distrun-logs-bench-"))
    os.environ["DISTRUN_SSH_CONFIG"] = os.devnull
    body = ["Hosts: network namespaces of this machine, each with its own OpenSSH sshd (tests/cluster/), sharing "
            "the machine's 2 cores with the controller and every rank; gloo on CPU. Figures taken while holding "
            "/work/locks/heavy.lock (no other benchmark or cluster test running).", ""]
    if not args.skip_flood:
        with Cluster(3) as cluster:
            inv = cluster.write_inventory(tmp / "inv.yaml")
            env = {"DISTRUN_HOME": str(tmp / "home"), "PDSH_SSH_ARGS": f"-F {cluster.ssh_config} -x -l%u %h"}
            rows, usage = flood(cluster, inv, tmp, args.rounds, args.lines, env)
        body += ["## The flood: distrun against pdsh + torchrun", "", *rows, "",
                 "## Where the CPU goes", "",
                 "Every process's utime + stime, sampled every 0.25 s in both launchers' runs alike and summed "
                 "per role; seconds per round (the last 0.25 s of each process is not seen):", "",
                 *cpu_rows(usage, args.rounds), "",
                 "## Memory during the flood", "",
                 "Peak resident set size sampled every 0.25 s over all distrun rounds:", "",
                 "| process | peak RSS MB |", "|---|---|",
                 *(f"| {role} | {mb:.0f} |" for role, mb in sorted(usage["distrun"].mb.items())), ""]
    body += ["## The controller's capacity", "", *capacity(tmp, args.lines, args.rounds)]
    path = write_results("logs.md", "Log relaying: distrun against pdsh + torchrun, and the controller's capacity",
                         f"python bench/logs_bench.py --rounds {args.rounds} --lines {args.lines}", body)
    print(path.read_text())


if __name__ == "__main__":
    main()
