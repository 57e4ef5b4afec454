"""Third-party counts for bench/results/teardown.md (issue 32): how often a rank aborts at exit on
2 namespace hosts x 1 rank, under distrun against pdsh -S + torchrun, round by round alternating.

Jobs: `accelerate` is HuggingFace accelerate's own distributed self-test
(`python -m accelerate.test_utils.scripts.test_script`, unmodified; `pip install -e .[bench]`);
`allreduce` is jobs/allreduce_bench.py as it was before jobs/quick_exit.py (a copy whose only
change is a plain return from main instead of `quick_exit(0)`). Launchers: `distrun` (distrun
launch -i the cluster's inventory) and `pdsh` (`pdsh -S -R ssh` running torchrun with
`--node-rank %n` on each host: -S makes pdsh return the largest exit code of the hosts).
A run counts as an abort as in teardown_bench.py. Runs go to bench/results/teardown-runs.jsonl
with launcher `distrun` or `pdsh-S` and where `hosts2`; `--report` prints the table (95% Wilson
intervals, Fisher's exact test of distrun against pdsh -S). Run as root, under the machine's heavy lock:

    flock /tmp/distrun-heavy.lock .venv/bin/python bench/teardown_thirdparty.py --label thirdparty --rounds 20
    .venv/bin/python bench/teardown_thirdparty.py --label thirdparty --report

`--end` times the end of a successful job instead (issue 41): bench/end_job.py (written as pytorch/examples'
ddp-tutorial-series multinode.py is) on `--hosts` namespace hosts x 2 ranks, distrun against pdsh -S +
torchrun round by round alternating; for each run the seconds from its last epoch line (as the launcher
printed it) to the launcher's exit. Runs go to bench/results/teardown-end-runs.jsonl; `--end --report`
prints each launcher's median and distrun's ratio to pdsh's:

    .venv/bin/python bench/teardown_thirdparty.py --end --label end --rounds 10
    .venv/bin/python bench/teardown_thirdparty.py --end --label end --report
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from common import REPO, RESULTS
from teardown_bench import (
    FINAL,
    PYTHON,
    RUNS_FILE,
    Run,
    classify,
    files_text,
    fisher_two_sided,
    load,
    run_command,
    wilson,
)

from tests.cluster.harness import Cluster

HOSTS = 2
TIMEOUT = 240.0
# Each host's own directory (a tmpfs per host): accelerate's self-test writes and deletes a file in
# its working directory on every host's local main process, which races on a shared one.
WORKDIR = "/srv/node"
ALLREDUCE_ARGS = ["--backend", "gloo", "--sizes", "1048576,16777216", "--iters", "5"]  # doctor's, less 64 MiB
ACCELERATE = "accelerate.test_utils.scripts.test_script"
LAUNCHERS = ("distrun", "pdsh-S")
JOBS = ("accelerate", "allreduce")


def allreduce_without_quick_exit(folder: Path) -> Path:
    """jobs/allreduce_bench.py with a plain return from main (the interpreter's finalization runs)."""
    text = (REPO / "jobs" / "allreduce_bench.py").read_text()
    ending = "    quick_exit(0)\n"
    if not text.endswith(ending):
        raise SystemExit("jobs/allreduce_bench.py no longer ends with quick_exit(0): update this bench")
    script = folder / "allreduce_bench.py"
    script.write_text(text[:-len(ending)])
    shutil.copy(REPO / "jobs" / "quick_exit.py", folder / "quick_exit.py")  # still imported
    return script


class ThirdParty:
    def __init__(self, cluster: Cluster, scratch: Path, label: str) -> None:
        self.cluster = cluster
        self.scratch = scratch
        self.label = label
        self.inventory = cluster.write_inventory(scratch / "inventory.yaml")
        self.script = allreduce_without_quick_exit(scratch)
        self.ports = itertools.count(29600)
        self.jobs = {job: self.job_file(job) for job in JOBS}

    def job_file(self, job: str) -> Path:
        what = f"module: {ACCELERATE}" if job == "accelerate" else f"script: {self.script}\nargs: {ALLREDUCE_ARGS}"
        path = self.scratch / f"{job}.yaml"
        path.write_text(f"name: {job}\n{what}\nnproc_per_node: 1\nworkdir: {WORKDIR}\n"
                        "env: {OMP_NUM_THREADS: '1'}\n")
        return path

    def argv(self, job: str, launcher: str, run_dir: Path) -> list[str]:
        if launcher == "distrun":
            return [PYTHON, "-m", "orchestrator", "launch", str(self.jobs[job]), "-i", str(self.inventory), "--no-live"]
        addrs = [self.cluster.addr(i) for i in range(HOSTS)]
        target = ["-m", ACCELERATE] if job == "accelerate" else [str(self.script), *ALLREDUCE_ARGS]
        remote = (f"cd {WORKDIR} && OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 TMPDIR={run_dir} "
                  f"{PYTHON} -m torch.distributed.run --nnodes {HOSTS} --nproc-per-node 1 --node-rank %n "
                  f"--master-addr {addrs[0]} --master-port {next(self.ports)} {shlex.join(target)}")
        return ["pdsh", "-S", "-R", "ssh", "-w", ",".join(addrs), remote]

    def env(self, run_dir: Path) -> dict[str, str]:
        return {**os.environ, "OMP_NUM_THREADS": "1", "DISTRUN_HOME": str(run_dir / "distrun-home"),
                "TMPDIR": str(run_dir), "PDSH_SSH_ARGS": f"-F {self.cluster.ssh_config} -x -l%u %h",
                "PYTHONPATH": str(REPO)}

    def one(self, job: str, launcher: str, round_no: int) -> Run:
        run_dir = Path(tempfile.mkdtemp(prefix=f"{job}-{launcher}-", dir=self.scratch))
        began, started = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S")
        rc, text = run_command(self.argv(job, launcher, run_dir), REPO, self.env(run_dir), TIMEOUT)
        if rc is None:
            for i in range(HOSTS):
                self.cluster.kill_all(i)
        seconds = time.monotonic() - began
        text += "\n" + files_text(run_dir)
        outcome = classify(rc, text)
        shutil.rmtree(run_dir, ignore_errors=True)
        interesting = [line for line in text.splitlines() if "SIGABRT" in line or "terminate" in line
                       or "Error" in line or "crashed at" in line]
        return Run(label=self.label, where="hosts2", job=job, launcher=launcher, round=round_no, rc=rc,
                   outcome=outcome, final_line=bool(FINAL.search(text)), seconds=round(seconds, 1),
                   started=started, switch_interval=None,
                   tail="" if outcome == "ok" else "\n".join(interesting[-12:])[-2000:])


def table(rows: list[dict[str, object]]) -> list[str]:
    """Per job: each launcher's runs, aborts, other failures, abort rate and Fisher's p against pdsh -S."""
    out = ["| job | launcher | runs | aborts | other failures | abort rate (95% CI) | Fisher p vs pdsh -S |",
           "|---|---|---|---|---|---|---|"]
    for job in JOBS:
        counts = {launcher: Counter(str(r["outcome"]) for r in rows if r["job"] == job and r["launcher"] == launcher)
                  for launcher in LAUNCHERS}
        base = counts["pdsh-S"]
        for launcher, count in counts.items():
            n, k = sum(count.values()), count["abort"]
            low, high = wilson(k, n)
            bn, bk = sum(base.values()), base["abort"]
            p = "" if launcher == "pdsh-S" else f"{fisher_two_sided(k, n - k, bk, bn - bk):.3f}"
            rate = f"{k / n:.1%} ({low:.1%}-{high:.1%})" if n else "-"
            out.append(f"| {job} | {launcher} | {n} | {k} | {n - k - count['ok']} | {rate} | {p} |")
    return out


END_RUNS = RESULTS / "teardown-end-runs.jsonl"
END_JOB = REPO / "bench" / "end_job.py"
LAST_LINE = re.compile(r"Epoch \d+ \| Batchsize")
END_ARGS = ["--epochs", "5"]
END_TIMEOUT = 90.0  # a run that aborts at exit leaves torchrun by hand in its exit barrier for 300 s


def timed_lines(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, float | None, float, str]:
    """Run `argv`: (exit code or None on timeout, seconds from its last epoch line to its exit (None:
    none came), seconds from start to exit, its output). stdout and stderr are read as one stream,
    each line stamped as it arrives."""
    began = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    killer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    killer.start()
    last, lines = None, []
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace")
        lines.append(line)
        if LAST_LINE.search(line):
            last = time.monotonic()
    rc = proc.wait()
    ended = time.monotonic()
    timed_out = not killer.is_alive()
    killer.cancel()
    return (None if timed_out else rc), (None if last is None else ended - last), ended - began, "".join(lines)


class EndBench:
    """distrun against pdsh -S + torchrun on the same cluster, the end of a successful job timed."""

    def __init__(self, cluster: Cluster, scratch: Path, hosts: int) -> None:
        self.cluster = cluster
        self.hosts = hosts
        self.inventory = cluster.write_inventory(scratch / "inventory.yaml")
        self.job = scratch / "end.yaml"
        self.job.write_text(f"name: end\nscript: {END_JOB}\nargs: {json.dumps(END_ARGS)}\nnproc_per_node: 2\n"
                            "env: {OMP_NUM_THREADS: '1'}\n")
        self.ports = itertools.count(29700)
        self.scratch = scratch

    def argv(self, launcher: str) -> list[str]:
        if launcher == "distrun":
            return [PYTHON, "-m", "orchestrator", "launch", str(self.job), "-i", str(self.inventory), "--no-live"]
        addrs = [self.cluster.addr(i) for i in range(self.hosts)]
        remote = (f"OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 {PYTHON} -m torch.distributed.run "
                  f"--nnodes {self.hosts} --nproc-per-node 2 --node-rank %n --master-addr {addrs[0]} "
                  f"--master-port {next(self.ports)} {shlex.join([str(END_JOB), *END_ARGS])}")
        return ["pdsh", "-S", "-R", "ssh", "-w", ",".join(addrs), remote]

    def one(self, launcher: str, label: str, round_no: int) -> dict[str, object]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTRUN_HOME": str(self.scratch / "distrun-home"),
               "PDSH_SSH_ARGS": f"-F {self.cluster.ssh_config} -x -l%u %h", "PYTHONPATH": str(REPO)}
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        load = os.getloadavg()[0]
        rc, end, total, text = timed_lines(self.argv(launcher), env, END_TIMEOUT)
        if rc is None:
            for i in range(self.hosts):
                self.cluster.kill_all(i)
        return {"label": label, "launcher": launcher, "round": round_no, "rc": rc, "hosts": self.hosts,
                "last_line_to_exit_s": None if end is None else round(end, 3), "total_s": round(total, 3),
                "load1": round(load, 2), "started": started,
                "aborted": "SIGABRT" in text or "terminate called without an active exception" in text,
                "tail": "" if rc == 0 else text[-1500:]}


def end_report(label: str) -> None:
    """Each launcher's median last-line-to-exit over its successful runs, and distrun's ratio to pdsh's."""
    rows = [json.loads(line) for line in END_RUNS.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [row for row in rows if row["label"] == label]
    medians = {}
    print("| launcher | runs | ok | median last line to exit (s) | per run (s) | median launch to exit (s) |")
    print("|---|---|---|---|---|---|")
    for launcher in ("distrun", "pdsh-S"):
        ok = [row for row in rows if row["launcher"] == launcher and row["rc"] == 0
              and row["last_line_to_exit_s"] is not None]
        runs = sum(row["launcher"] == launcher for row in rows)
        ends = [float(row["last_line_to_exit_s"]) for row in ok]
        medians[launcher] = statistics.median(ends) if ends else float("nan")
        totals = statistics.median(float(row["total_s"]) for row in ok) if ok else float("nan")
        print(f"| {launcher} | {runs} | {len(ok)} | {medians[launcher]:.2f} | "
              f"{', '.join(f'{e:.2f}' for e in ends)} | {totals:.1f} |")
    base = medians["pdsh-S"]
    print(f"\ndistrun / pdsh -S: {medians['distrun'] / base:.2f}x; bound 1.0x + 0.5 s = {base + 0.5:.2f} s; "
          f"loads {min(r['load1'] for r in rows):.1f}-{max(r['load1'] for r in rows):.1f}; "
          f"runs {min(r['started'] for r in rows)} to {max(r['started'] for r in rows)}")


def end_main(args: argparse.Namespace) -> int:
    if args.report:
        end_report(args.label)
        return 0
    launchers = ["distrun", "pdsh-S"]
    with tempfile.TemporaryDirectory(prefix="teardown-end-") as tmp, Cluster(args.hosts) as cluster:
        bench = EndBench(cluster, Path(tmp), args.hosts)
        for round_no in range(args.first_round, args.first_round + args.rounds):
            order = launchers if round_no % 2 == 0 else launchers[::-1]
            for launcher in order:
                row = bench.one(launcher, args.label, round_no)
                with END_RUNS.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(row) + "\n")
                print(f"round {round_no} {launcher:8} rc={row['rc']} last line to exit "
                      f"{row['last_line_to_exit_s']} s, total {row['total_s']} s, load {row['load1']}", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="thirdparty")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=30.0, help="start no round after this")
    parser.add_argument("--first-round", type=int, default=0)
    parser.add_argument("--report", action="store_true", help="print the label's table and run nothing")
    parser.add_argument("--end", action="store_true", help="time the end of a successful job (see the docstring)")
    parser.add_argument("--hosts", type=int, default=3, help="--end: hosts (2 ranks each)")
    args = parser.parse_args()
    if args.end:
        return end_main(args)
    if args.report:
        rows = load(args.label)
        print(f"Runs {min(str(r['started']) for r in rows)} to {max(str(r['started']) for r in rows)}")
        print("\n".join(table(rows)))
        return 0
    pairs = [(job, launcher) for job in JOBS for launcher in LAUNCHERS]
    deadline = time.monotonic() + args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="teardown-3p-") as tmp, Cluster(HOSTS, private_dirs=True) as cluster:
        bench = ThirdParty(cluster, Path(tmp), args.label)
        for round_no in range(args.first_round, args.first_round + args.rounds):
            if time.monotonic() > deadline:
                break
            shift = round_no % len(pairs)
            for job, launcher in pairs[shift:] + pairs[:shift]:
                run = bench.one(job, launcher, round_no)
                with RUNS_FILE.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(asdict(run)) + "\n")
                print(f"round {round_no} {job:10} {launcher:8} {run.outcome:7} rc={run.rc} {run.seconds:6.1f} s",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
