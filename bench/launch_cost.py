"""The fixed cost of a launch: distrun vs pdsh + torchrun, launch to exit, on 3 and 16 namespace hosts.

A trivial job (bench/launch_cost_job.py: init, one all-reduce, one line per rank, a barrier, exit)
runs on N hosts (real sshd per network namespace, tests/cluster/), in alternating rounds:
- pdsh -R ssh -w <hosts> running torchrun with `--node-rank %n` (DeepSpeed's way), and
- distrun launch of the same job (same static rendezvous, same processes per host).
Each run's stdout is read line by line and stamped, so both sides split alike into
start -> first rank line -> last rank line -> exit. distrun's side runs through `--phases`,
which stamps the controller's steps (imports, connect + probe, preflight, stage, record,
supervisors started, hosts exited, summary recorded) into a file and then runs the CLI as is.

`--baseline REV` adds distrun as it was at commit REV to the alternation (its own checkout).
Writes the "Fixed cost" section of bench/results/launch.md (the rest is launch_bench.py's).
Needs root and the machine to itself (the shared lock):
    flock /tmp/distrun-heavy.lock .venv/bin/python bench/launch_cost.py [--rounds 5] [--sizes 3 16] [--baseline REV]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO, alternate, checkout, children_cpu, median, write_section

sys.path.insert(0, str(REPO))

JOB = REPO / "bench" / "launch_cost_job.py"
PYTHON = sys.executable
HEADING = "Fixed cost of a launch: 3 and 16 hosts"
RANK_MARK = re.compile(rb"rank \d+ ready cpu=([\d.]+)")  # each rank's one line
PORTS = iter(range(29600, 29999))
# distrun's steps, stamped by --phases, in the order they happen.
STEPS = ("imported", "prepared", "preflighted", "staged", "submitted", "started", "watched", "finished")


# ---------------------------------------------------------------- distrun with stamped steps


def run_with_phases(out: str, argv: list[str]) -> None:
    """Run distrun's CLI with `argv`, writing {step: monotonic seconds} to `out` at exit."""
    stamps: dict[str, float] = {"began": float(os.environ["BENCH_BEGAN"])}
    if os.environ.get("BENCH_SRC"):
        sys.path.insert(0, os.environ["BENCH_SRC"])  # distrun as it was at --baseline

    def stamp(name: str) -> None:
        stamps.setdefault(name, time.monotonic())

    import atexit

    from orchestrator.backends.ssh import SshBackend
    from orchestrator.cli.main import main
    from orchestrator.run.attempt import Attempt

    stamp("imported")

    def after(cls: type, method: str, name: str) -> None:
        inner = getattr(cls, method)

        def wrapped(*args: object, **kwargs: object) -> object:
            try:
                return inner(*args, **kwargs)
            finally:
                stamp(name)

        setattr(cls, method, wrapped)

    after(SshBackend, "prepare", "prepared")
    after(SshBackend, "preflight", "preflighted")
    after(SshBackend, "stage", "staged")
    after(SshBackend, "submit", "submitted")
    after(SshBackend, "start", "started")
    after(Attempt, "_watch", "watched")
    after(Attempt, "run", "finished")
    atexit.register(lambda: Path(out).write_text(json.dumps({**stamps, "epoch": time.time() - time.monotonic()})))
    sys.argv = ["distrun", *argv]
    main()


# ---------------------------------------------------------------- one run, stamped


@dataclass
class Run:
    """One launch: seconds from start to its first and last rank line and to its exit; distrun's steps."""

    first: float
    last: float
    total: float
    cpu: float  # the launcher's own CPU seconds (pdsh: with its ssh clients)
    rank_cpu: float  # CPU seconds each rank had used by its line (imports, rendezvous), median of the ranks
    steps: dict[str, float] = field(default_factory=dict)


def stamped(argv: list[str], env: dict[str, str], ranks: int, steps_file: Path | None = None) -> Run:
    """Run `argv`, stamping the rank lines on its stdout; raises if it fails or a rank line is missing."""
    cpu = sum(children_cpu())
    began = time.monotonic()
    proc = subprocess.Popen(argv, env={**os.environ, **env, "BENCH_BEGAN": repr(began)}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    seen: list[float] = []
    rank_cpu: list[float] = []
    for line in proc.stdout:
        for found in RANK_MARK.finditer(line):
            seen.append(time.monotonic() - began)
            rank_cpu.append(float(found.group(1)))
    rc = proc.wait()
    total = time.monotonic() - began
    cpu = sum(children_cpu()) - cpu
    if rc != 0 or len(seen) != ranks:
        raise RuntimeError(f"{argv[:4]}...: exit {rc}, {len(seen)} of {ranks} rank lines")
    steps = {}
    if steps_file is not None:
        steps = {k: v - began for k, v in json.loads(steps_file.read_text()).items() if k not in ("began", "epoch")}
    return Run(seen[0], seen[-1], total, cpu, median(rank_cpu), steps)


def pdsh_argv(addrs: list[str], nproc: int, port: int) -> list[str]:
    remote = (f"cd {REPO} && OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 {PYTHON} -m torch.distributed.run "
              f"--nnodes {len(addrs)} --nproc-per-node {nproc} --node-rank %n --master-addr {addrs[0]} "
              f"--master-port {port} --max-restarts 0 {JOB}")
    return ["pdsh", "-R", "ssh", "-f", "256", "-w", ",".join(addrs), remote]


def job_file(tmp: Path, nproc: int) -> Path:
    path = tmp / f"cost-{nproc}.yaml"
    path.write_text(f"name: cost\nscript: {JOB}\nnproc_per_node: {nproc}\n"
                    "env: {OMP_NUM_THREADS: '1'}\n")
    return path


def distrun_argv(job: Path, inv: Path, nnodes: int, steps_file: Path) -> list[str]:
    return [PYTHON, str(Path(__file__).resolve()), "--phases", str(steps_file), "--", "launch", str(job),
            "-i", str(inv), "--nnodes", str(nnodes)]


# ---------------------------------------------------------------- the series


def series(addrs: list[str], inv: Path, tmp: Path, nproc: int, rounds: int, env: dict[str, str],
           baseline: tuple[str, Path] | None) -> dict[str, list[Run]]:
    """Alternating rounds of pdsh, distrun (and distrun at the baseline) on the first len(addrs) hosts."""
    nnodes, ranks = len(addrs), len(addrs) * nproc
    job, steps = job_file(tmp, nproc), tmp / "steps.json"
    contenders: dict[str, Callable[[], Run]] = {
        "pdsh": lambda: stamped(pdsh_argv(addrs, nproc, next(PORTS)), env, ranks),
        "distrun": lambda: stamped(distrun_argv(job, inv, nnodes, steps), env, ranks, steps),
    }
    if baseline is not None:
        rev, src = baseline
        old_env = {**env, "BENCH_SRC": str(src)}
        contenders[f"distrun {rev}"] = lambda: stamped(distrun_argv(job, inv, nnodes, steps), old_env, ranks, steps)
    runs: dict[str, list[Run]] = {name: [] for name in contenders}

    def one(name: str) -> float:
        run = contenders[name]()
        runs[name].append(run)
        steps = {k: round(v, 2) for k, v in run.steps.items()}
        print(f"{nnodes} hosts {name}: {run.total:.2f} s (first line {run.first:.2f}, last {run.last:.2f}, "
              f"cpu {run.cpu:.2f}, rank cpu {run.rank_cpu:.2f}) {steps}", flush=True)
        return run.total

    alternate({name: lambda name=name: one(name) for name in contenders}, rounds)
    return runs


Results = dict[tuple[int, int], dict[str, list[Run]]]


def med(runs: list[Run], key: Callable[[Run], float]) -> float:
    return median([key(r) for r in runs])


def table(results: Results) -> list[str]:
    rows = ["| hosts x procs | launcher | launch to exit s | - pdsh s | / pdsh | launcher CPU s | runs s |",
            "|---|---|---|---|---|---|---|"]
    for (nnodes, nproc), runs in results.items():
        p = med(runs["pdsh"], lambda r: r.total)
        for name, values in runs.items():
            d = med(values, lambda r: r.total)
            shown = ", ".join(f"{r.total:.1f}" for r in values)
            versus = "" if name == "pdsh" else f"**{d - p:+.2f}**"
            ratio = "" if name == "pdsh" else f"**{d / p:.3f}**"
            rows.append(f"| {nnodes} x {nproc} | {name} | {d:.2f} | {versus} | {ratio} | "
                        f"{med(values, lambda r: r.cpu):.2f} | {shown} |")
    return rows


def breakdown(results: Results) -> list[str]:
    rows = ["| hosts | launcher | start -> first rank line s | first -> last rank line s | last rank line -> exit s | "
            "CPU s of a rank by its line |", "|---|---|---|---|---|---|"]
    for (nnodes, _), runs in results.items():
        for name, values in runs.items():
            first, spread = med(values, lambda r: r.first), med(values, lambda r: r.last - r.first)
            tail = med(values, lambda r: r.total - r.last)
            rank_cpu = med(values, lambda r: r.rank_cpu)
            rows.append(f"| {nnodes} | {name} | {first:.2f} | {spread:.2f} | {tail:.2f} | {rank_cpu:.2f} |")
    return rows


def steps_table(results: Results) -> list[str]:
    """distrun's steps, each as the median seconds since the previous one."""
    names = ["began", *STEPS, "exit"]
    rows = ["| hosts | launcher | " + " | ".join(f"{a} -> {b}" for a, b in itertools.pairwise(names)) + " |",
            "|---|---|" + "---|" * (len(names) - 1)]

    def at(run: Run, step: str) -> float:
        return {"began": 0.0, "exit": run.total}.get(step, run.steps.get(step, float("nan")))

    for (nnodes, _), runs in results.items():
        for name, values in runs.items():
            if name == "pdsh":
                continue
            cells = [f"{med(values, lambda r, a=a, b=b: at(r, b) - at(r, a)):.2f}"
                     for a, b in itertools.pairwise(names)]
            rows.append(f"| {nnodes} | {name} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    if "--phases" in sys.argv[1:2]:
        run_with_phases(sys.argv[2], sys.argv[4:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 16])
    parser.add_argument("--baseline", metavar="REV", help="also run distrun as it was at commit REV")
    parser.add_argument("--no-write", action="store_true", help="print the tables only")
    args = parser.parse_args()
    from tests.cluster.harness import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="distrun-launch-cost-"))
    os.environ["DISTRUN_SSH_CONFIG"] = os.devnull
    baseline = (args.baseline, checkout(args.baseline, tmp)) if args.baseline else None
    results: Results = {}
    with Cluster(max(args.sizes)) as cluster:
        inv = cluster.write_inventory(tmp / "inv.yaml")
        env = {"DISTRUN_HOME": str(tmp / "home"), "PDSH_SSH_ARGS": f"-F {cluster.ssh_config} -x -l%u %h"}
        for nnodes in args.sizes:
            nproc = 2 if nnodes <= 4 else 1
            addrs = [cluster.addr(i) for i in range(nnodes)]
            results[(nnodes, nproc)] = series(addrs, inv, tmp, nproc, args.rounds, env, baseline)
    body = [f"Trivial all-reduce job ({JOB.relative_to(REPO)}), static rendezvous, {args.rounds} alternating "
            "rounds, launch to exit; medians.", "", *table(results), "",
            "Where the time goes (each run's stdout stamped as it is read):", "", *breakdown(results), "",
            "distrun's own steps (median seconds between stamps; `--phases`):", "", *steps_table(results)]
    print("\n".join(body))
    if not args.no_write:
        sizes = " ".join(str(s) for s in args.sizes)
        command = f"python bench/launch_cost.py --rounds {args.rounds} --sizes {sizes}"
        write_section("launch.md", HEADING, command + (f" --baseline {args.baseline}" if args.baseline else ""), body)


if __name__ == "__main__":
    main()
