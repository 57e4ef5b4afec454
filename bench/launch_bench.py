"""Multi-host launch figures on namespace hosts with real sshd, distrun vs pdsh + torchrun.

1. Launch to exit of a trivial all-reduce job (2 processes per host) on 2 and 4 hosts,
   alternating distrun and pdsh running torchrun with `--node-rank %n` (DeepSpeed's way).
2. A host's link cut mid-run: seconds until no process of the job is left on the others.
3. Log relaying: a job whose ranks print N lines each, relayed to the controller's stdout
   and job files, against the same job writing them to /dev/null; lines checked complete.

Writes bench/results/launch.md. Run as root:  .venv/bin/python bench/launch_bench.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common import REPO, alternate, median, timed, write_results

sys.path.insert(0, str(REPO))
from tests.cluster.harness import Cluster

JOB = REPO / "bench" / "allreduce_job.py"
SLEEPER = REPO / "tests" / "cluster" / "jobs" / "worker.py"
PYTHON = sys.executable
CUT_CAP = 60.0


def job_file(tmp: Path, name: str, script: Path, args: list[str], env: str = "") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\nscript: {script}\nargs: {args!r}\nnproc_per_node: 2\n"
                    f"env: {{OMP_NUM_THREADS: '1'{env}}}\ntelemetry: {{enabled: false}}\nheartbeat_timeout: 10\n")
    return path


def distrun_argv(job: Path, inv: Path, nnodes: int, job_id: str | None = None) -> list[str]:
    argv = [PYTHON, "-m", "orchestrator", "launch", str(job), "-i", str(inv), "--nnodes", str(nnodes)]
    return argv + (["--job-id", job_id] if job_id else [])


def pdsh_argv(cluster: Cluster, nnodes: int, script: Path, args: list[str], port: int, tag: str = "") -> list[str]:
    addrs = [cluster.addr(i) for i in range(nnodes)]
    env = f"OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 {tag}"
    remote = (f"cd {REPO} && {env} {PYTHON} -m torch.distributed.run --nnodes {nnodes} --nproc-per-node 2 "
              f"--node-rank %n --master-addr {addrs[0]} --master-port {port} {script} {' '.join(args)}")
    return ["pdsh", "-R", "ssh", "-w", ",".join(addrs), remote]


def launch_to_exit(cluster: Cluster, inv: Path, tmp: Path, rounds: int, env: dict[str, str]) -> list[str]:
    job = job_file(tmp, "allreduce", JOB, [])
    rows = ["| hosts | pdsh + torchrun s | distrun s | distrun / pdsh | runs pdsh | runs distrun |",
            "|---|---|---|---|---|---|"]
    ports = iter(range(29600, 29999))
    for nnodes in (2, 4):
        times = alternate({
            "pdsh": lambda n=nnodes: timed(pdsh_argv(cluster, n, JOB, [], next(ports)), env),
            "distrun": lambda n=nnodes: timed(distrun_argv(job, inv, n), env),
        }, rounds)
        p, d = median(times["pdsh"]), median(times["distrun"])
        runs = {name: ", ".join(f"{x:.1f}" for x in values) for name, values in times.items()}
        rows.append(f"| {nnodes} | {p:.2f} | {d:.2f} | **{d / p:.3f}** | {runs['pdsh']} | {runs['distrun']} |")
    return rows


def seconds_until_gone(cluster: Cluster, key: str, value: str, hosts: list[int], cap: float) -> float | None:
    began = time.monotonic()
    while time.monotonic() - began < cap:
        if not any(cluster.processes_with_env(i, key, value) for i in hosts):
            return time.monotonic() - began
        time.sleep(0.25)
    return None


def wait_running(cluster: Cluster, key: str, value: str, hosts: list[int], count: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sum(len(cluster.processes_with_env(i, key, value)) for i in hosts) >= count:
            time.sleep(3)
            return
        time.sleep(0.25)
    raise RuntimeError(f"the job {value} never started")


def cut_trial(cluster: Cluster, start: Callable[[], subprocess.Popen[bytes]], value: str) -> float | None:
    proc = start()
    try:
        wait_running(cluster, "DISTRUN_JOB_ID", value, [0, 1, 2], 3 * 3)
        cluster.cut(2)
        return seconds_until_gone(cluster, "DISTRUN_JOB_ID", value, [0, 1], CUT_CAP)
    finally:
        cluster.restore(2)
        proc.terminate()
        proc.wait()
        for i in range(3):
            for found in cluster.processes_with_env(i, "DISTRUN_JOB_ID", value):
                subprocess.run(["kill", "-9", str(found.pid)], check=False)


def link_cut(cluster: Cluster, inv: Path, tmp: Path, env: dict[str, str]) -> list[str]:
    job = job_file(tmp, "sleeper", SLEEPER, ["--sleep", "120"])
    full = {**os.environ, **env}
    ours = cut_trial(cluster, lambda: subprocess.Popen(distrun_argv(job, inv, 3, "cut-bench"), env=full,
                                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                     "cut-bench")
    peer = cut_trial(cluster, lambda: subprocess.Popen(
        pdsh_argv(cluster, 3, SLEEPER, ["--sleep", "120"], 29555, tag="DISTRUN_JOB_ID=cut-peer"), env=full,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), "cut-peer")

    def shown(value: float | None) -> str:
        return f"{value:.1f} s" if value is not None else f"still running after {CUT_CAP:.0f} s (hangs)"

    return ["| launcher | link of node2 cut -> no job process left on node0, node1 |", "|---|---|",
            f"| distrun (heartbeat_timeout 10 s) | {shown(ours)} |", f"| pdsh + torchrun | {shown(peer)} |"]


def log_relay(inv: Path, tmp: Path, rounds: int, lines: int, env: dict[str, str]) -> list[str]:
    home = Path(env["DISTRUN_HOME"])
    relayed = job_file(tmp, "loud", JOB, [str(lines)])
    quiet = job_file(tmp, "quiet", JOB, [str(lines)], env=", BENCH_DEVNULL: '1'")
    counted: list[int] = []

    def run_relayed() -> float:
        job_id = f"loud-{len(counted)}"
        seconds = timed(distrun_argv(relayed, inv, 3, job_id), env)
        ranks = home / "jobs" / job_id / "ranks"
        counted.append(sum(sum(1 for ln in (ranks / f"{r}.out").open() if " line " in ln) for r in range(6)))
        return seconds

    times = alternate({"devnull": lambda: timed(distrun_argv(quiet, inv, 3), env), "relayed": run_relayed}, rounds)
    q, r = median(times["devnull"]), median(times["relayed"])
    total = 6 * lines
    return [
        f"3 hosts x 2 ranks, {lines} lines of 80 bytes per rank ({total} lines), {rounds} alternating rounds.", "",
        "| run | median s | runs |", "|---|---|---|",
        f"| lines written to /dev/null by the ranks | {q:.2f} | {', '.join(f'{x:.1f}' for x in times['devnull'])} |",
        f"| lines relayed to the controller (terminal + combined/node/rank files) | {r:.2f} | "
        f"{', '.join(f'{x:.1f}' for x in times['relayed'])} |", "",
        f"Lines delivered complete in every relayed run: {all(c == total for c in counted)} ({counted}).",
        f"Relay throughput: {total / r:,.0f} lines/s end to end; job slowdown from relaying: "
        f"**{(r / q - 1) * 100:+.1f} %** (goal: <= 5 %).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lines", type=int, default=100000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="distrun-launch-bench-"))
    os.environ["DISTRUN_SSH_CONFIG"] = os.devnull
    with Cluster(4) as cluster:
        inv = cluster.write_inventory(tmp / "inv.yaml")
        env = {"DISTRUN_HOME": str(tmp / "home"), "PDSH_SSH_ARGS": f"-F {cluster.ssh_config} -x -l%u %h"}
        body = ["Hosts: network namespaces of this machine, each with its own OpenSSH sshd (tests/cluster/), "
                "sharing the machine's 2 cores with the launcher and every rank; gloo on CPU.", "",
                "## Launch to exit, trivial all-reduce job (2 processes per host)", "",
                *launch_to_exit(cluster, inv, tmp, args.rounds, env), "",
                "## A host's link cut mid-run", "", *link_cut(cluster, inv, tmp, env), "",
                "## Log relaying", "", *log_relay(inv, tmp, args.rounds, args.lines, env)]
    path = write_results("launch.md", "Multi-host launch: distrun vs pdsh + torchrun",
                         f"python bench/launch_bench.py --rounds {args.rounds} --lines {args.lines}", body)
    print(path.read_text())


if __name__ == "__main__":
    main()
