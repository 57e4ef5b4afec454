"""The same fault under per-step fault tolerance (torchft) and under the controller's restarts.

The hosts are a namespace test cluster (tests/cluster/): 4 hosts, 3 that train and 1 spare, one
gloo rank per host, a step every 0.3 s, 70 steps, heartbeat_timeout 4 s, `restarts: {max: 1,
backoff: 1}`. Once step 12 is printed, node1's link is cut (and restored when the job ended).

- ft: jobs/train_ft.py, `fault_tolerance: {min_replicas: 1}`: 3 replica groups of one host.
- restarts: tests/cluster/jobs/restart_worker.py, one world of 3 hosts, checkpointed after every
  step (the best case for restarts: checkpoints every N = 1 steps) and resumed from it.

Each line is timed when it reaches the controller's output. Reported from the cut: the longest
pause of a surviving host (between two of its steps), the steps a survivor ran twice, when the
lost host's work was back (ft: the first step of its group on the spare, and that step; restarts:
the first step of attempt 2), and the launch-to-exit time.

Needs root, and the machine to itself (take the shared lock):
    flock /tmp/distrun-heavy.lock .venv/bin/python bench/ft_bench.py
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from common import REPO, write_results

sys.path.insert(0, str(REPO))
from tests.cluster.harness import Cluster

FT_WORKER = REPO / "jobs" / "train_ft.py"
RESTART_WORKER = REPO / "tests" / "cluster" / "jobs" / "restart_worker.py"
STEPS, STEP_TIME, CUT_AT = 70, 0.3, 12
COMMON = (f"args: [--steps, '{STEPS}', --step-time, '{STEP_TIME}']\nnproc_per_node: 1\nnnodes: 3\n"
          "env: {OMP_NUM_THREADS: '1', RUST_LOG: warn}\nheartbeat_timeout: 4\nstop_grace: 3\n"
          "restarts: {max: 1, backoff: 1}\n")
FT_STEP = re.compile(r"^\[g\d\] \[(node\d) r0\] ft step (\d+) ")
NOTES = """
Notes: under ft the survivors' pause (the step the lost group was in fails, and the next quorum
forms without it) matches the lighthouse's `--heartbeat_timeout_ms`, 5 s as distrun sets it, after
which a silent group is out of the quorum. The lost group is
back once its controller noticed the loss (heartbeat_timeout), stopped it, took the spare and
started torchrun there; it joins at the survivors' step (healed over HTTP from a peer), so every
group ends with the same number of steps and none is repeated. Under restarts every host stops
for detection, stop, preflight and rendezvous, and the job resumes from its checkpoint: with a
checkpoint after every step (this worker's; the best case) nothing is repeated either, and the
total differs little, since this job's steps are short. With a checkpoint every N steps a restart
repeats up to N - 1 steps on every host, and with a real model loading the checkpoint adds its
own time; ft repeats none and loads nothing. One round each, on a loaded 2-core machine.
"""
RESTART_STEP = re.compile(r"^\[(node\d) r\d+\] step (\d+) attempt (\d+) ")


def run(cluster: Cluster, job: Path, tmp: Path, cut_when: str) -> tuple[list[tuple[float, str]], float, float, int]:
    """Launch, cut node1 once `cut_when` arrives; every line with its arrival time, the cut's time,
    the launch-to-exit seconds and the exit code."""
    inv = cluster.write_inventory(tmp / "inv.yaml")
    env = {**os.environ, "DISTRUN_HOME": str(tmp / "home"), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "orchestrator", "launch", str(job), "-i", str(inv), "--no-live",
            "--nodes", "node0,node1,node2,node3", "--job-id", f"{job.stem}-{uuid.uuid4().hex[:6]}"]
    lines: list[tuple[float, str]] = []
    began = time.time()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cut = threading.Event()
    cut_time = [0.0]

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))
            if not cut.is_set() and cut_when in line:
                cluster.cut(1)
                cut_time[0] = time.time()
                cut.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        code = proc.wait(timeout=400)
    finally:
        cluster.restore(1)
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
    return lines, cut_time[0], time.time() - began, code


def survivors(lines: list[tuple[float, str]], pattern: re.Pattern[str]) -> dict[str, list[tuple[float, int]]]:
    found: dict[str, list[tuple[float, int]]] = {}
    for when, line in lines:
        match = pattern.match(line)
        if match and match.group(1) in ("node0", "node2"):
            found.setdefault(match.group(1), []).append((when, int(match.group(2))))
    return found


def measure(lines: list[tuple[float, str]], cut: float, pattern: re.Pattern[str]) -> dict[str, float]:
    kept = survivors(lines, pattern)
    pause = max(b[0] - a[0] for steps in kept.values() for a, b in itertools.pairwise(steps))
    repeated = max(sum(n - 1 for n in Counter(s for _, s in steps).values()) for steps in kept.values())
    back = next(((when, int(m.group(2))) for when, line in lines if (m := pattern.match(line)) and
                 when > cut and (m.group(1) == "node3" or (m.lastindex == 3 and m.group(3) == "2"))), (cut, -1))
    return {"pause": pause, "repeated": repeated, "back": back[0] - cut, "back_step": back[1]}


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch, Cluster(4) as cluster:
        tmp = Path(scratch)
        port = 29000 + uuid.uuid4().int % 900
        ft_job = tmp / "ft.yaml"
        ft_job.write_text(f"name: ft\nscript: {FT_WORKER}\n{COMMON}"
                          f"fault_tolerance: {{min_replicas: 1, lighthouse_port: {port}}}\n")
        restart_job = tmp / "restarts.yaml"
        restart_job.write_text(f"name: restarts\nscript: {RESTART_WORKER}\n{COMMON}checkpoint_dir: {tmp / 'ckpt'}\n")
        results = {}
        for name, job, when, pattern in (("ft", ft_job, f"ft step {CUT_AT} group 1 ", FT_STEP),
                                         ("restarts", restart_job, f"step {CUT_AT} attempt 1", RESTART_STEP)):
            (tmp / name).mkdir()
            lines, cut, total, code = run(cluster, job, tmp / name, when)
            results[name] = {**measure(lines, cut, pattern), "total": total, "code": code}
            print(name, json.dumps(results[name]), flush=True)
    ft, rs = results["ft"], results["restarts"]
    body = [
        "4 namespace hosts: 3 train, 1 spare; one gloo rank per host, a step every 0.3 s, 70 steps; heartbeat_timeout "
        "4 s, `restarts: {max: 1, backoff: 1}`; node1's link cut once step 12 was printed. One round each, "
        "lines timed as they reached the controller.",
        "",
        "| | ft (`fault_tolerance`, 3 groups) | restarts (checkpoint every step) |",
        "|---|---:|---:|",
        f"| longest pause of a surviving host (s) | {ft['pause']:.1f} | {rs['pause']:.1f} |",
        f"| steps a survivor ran twice | {ft['repeated']:.0f} | {rs['repeated']:.0f} |",
        f"| the cut -> the lost host's work back (s) | {ft['back']:.1f} (group 1 on node3, at step "
        f"{ft['back_step']}) | {rs['back']:.1f} (attempt 2, at step {rs['back_step']}) |",
        f"| launch -> exit (s) | {ft['total']:.1f} | {rs['total']:.1f} |",
        f"| exit code | {ft['code']} | {rs['code']} |",
        *NOTES.splitlines(),
    ]
    path = write_results("ft.md", "Per-step fault tolerance (torchft) against restarts, on the same fault",
                         "flock /tmp/distrun-heavy.lock .venv/bin/python bench/ft_bench.py", body)
    print(path.read_text())


if __name__ == "__main__":
    main()
