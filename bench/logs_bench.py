"""Log relaying figures (bench/results/logs.md): the flood against its peer, the controller's capacity, memory.

1. A flooding job, 3 namespace hosts x 2 ranks x N lines of 80 bytes each: under distrun (lines
   shown on the controller's stdout, which goes to a file, and kept in the job directory) against
   pdsh + torchrun (no --tee) running the same job with the lines written to /dev/null on the
   hosts. Alternating rounds; medians and the ratio; every relayed run checked complete. While
   distrun runs, the resident memory of the controller and of each host's supervisor is sampled.
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
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO, median, write_results
from launch_bench import JOB, PYTHON, distrun_argv, job_file, pdsh_argv

sys.path.insert(0, str(REPO))
from orchestrator import remote
from orchestrator.backends.ssh import SUPERVISOR_ONLY
from orchestrator.launch import HostRun
from orchestrator.logs import LogSink
from orchestrator.logs.screen import Screen
from orchestrator.plan import HostPlan
from orchestrator.store import JobDir
from tests.cluster.harness import Cluster

FAKE_TORCHRUN = REPO / "tests" / "fake_torchrun"


# ---------------------------------------------------------------- memory while a command runs


@dataclass
class Peaks:
    """Peak resident memory (MB) seen per process role while sampling."""

    mb: dict[str, float] = field(default_factory=dict)

    def see(self, role: str, kb: int) -> None:
        self.mb[role] = max(self.mb.get(role, 0.0), kb / 1024)


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def supervisors(job_id: str) -> list[int]:
    """Pids of the job's supervisors (their argv carries the job id after the bootstrap)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"distrun-supervisor" in argv and job_id.encode() in argv:
                found.append(int(entry))
    return found


def sample(pid: int, job_id: str, peaks: Peaks, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        peaks.see("controller", rss_kb(pid))
        for sup in supervisors(job_id):
            peaks.see("supervisor", rss_kb(sup))


# ---------------------------------------------------------------- 1. the flood against its peer


def run_distrun(job: Path, inv: Path, env: dict[str, str], job_id: str, out: Path, peaks: Peaks) -> float:
    """distrun with stdout to a file; seconds from start to exit, memory sampled meanwhile."""
    began = time.perf_counter()
    with open(out, "w") as fh:
        proc = subprocess.Popen(distrun_argv(job, inv, 3, job_id), env={**os.environ, **env}, cwd=REPO, stdout=fh,
                                stderr=subprocess.STDOUT)
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(proc.pid, job_id, peaks, stop), daemon=True)
        sampler.start()
        rc = proc.wait()
        stop.set()
        sampler.join()
    if rc != 0:
        raise RuntimeError(f"distrun exited {rc}: {out.read_text()[-2000:]}")
    return time.perf_counter() - began


def run_pdsh(cluster: Cluster, lines: int, port: int, env: dict[str, str]) -> float:
    argv = pdsh_argv(cluster, 3, JOB, [str(lines)], port, tag="BENCH_DEVNULL=1")
    began = time.perf_counter()
    subprocess.run(argv, env={**os.environ, **env}, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
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
          env: dict[str, str]) -> tuple[list[str], Peaks]:
    job = job_file(tmp, "loud", JOB, [str(lines)])
    home, peaks = Path(env["DISTRUN_HOME"]), Peaks()
    times: dict[str, list[float]] = {"pdsh": [], "distrun": []}
    checks = []
    suffix = uuid.uuid4().hex[:6]  # the hosts' copies share one ~/.distrun here: no earlier run's copy is added to
    for i in range(rounds):
        times["pdsh"].append(run_pdsh(cluster, lines, 29700 + i, env))
        out, job_id = tmp / f"screen-{i}.txt", f"loud-{suffix}-{i}"
        try:
            times["distrun"].append(run_distrun(job, inv, env, job_id, out, peaks))
            checks.append(complete(home, job_id, out, lines))
        finally:
            shutil.rmtree(Path(f"~/.distrun/jobs/{job_id}").expanduser(), ignore_errors=True)
    p, d = median(times["pdsh"]), median(times["distrun"])
    runs = {k: ", ".join(f"{x:.2f}" for x in v) for k, v in times.items()}
    return [
        f"3 hosts x 2 ranks, {lines:,} lines of 80 bytes per rank ({6 * lines:,} lines, "
        f"{6 * lines * 80 / 1e6:.0f} MB), {rounds} alternating rounds (pdsh first in each).", "",
        "| run | median s | runs |", "|---|---|---|",
        f"| pdsh + torchrun, lines to /dev/null on the hosts | {p:.2f} | {runs['pdsh']} |",
        f"| distrun: lines on the controller's stdout (a file) and in the job directory | {d:.2f} | "
        f"{runs['distrun']} |", "",
        f"**distrun / pdsh = {d / p:.3f}** (goal <= 1.05). Every distrun run complete (each line once in "
        f"ranks/*.out and on the screen file): {all(checks)}.",
    ], peaks


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
            rows, peaks = flood(cluster, inv, tmp, args.rounds, args.lines, env)
        body += ["## The flood: distrun against pdsh + torchrun", "", *rows, "",
                 "## Memory during the flood", "",
                 "Peak resident set size sampled every 0.1 s over all distrun rounds:", "",
                 "| process | peak RSS MB |", "|---|---|",
                 *(f"| {role} | {mb:.0f} |" for role, mb in sorted(peaks.mb.items())), ""]
    body += ["## The controller's capacity", "", *capacity(tmp, args.lines, args.rounds)]
    path = write_results("logs.md", "Log relaying: distrun against pdsh + torchrun, and the controller's capacity",
                         f"python bench/logs_bench.py --rounds {args.rounds} --lines {args.lines}", body)
    print(path.read_text())


if __name__ == "__main__":
    main()
