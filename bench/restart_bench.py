"""Time from a lost host to training running again on a spare, and its parts.

The hosts are a namespace test cluster (tests/cluster/): 3 hosts, a job with `nnodes: 2` (one
spare), 2 gloo ranks per host of tests/cluster/jobs/restart_worker.py (a step every 0.4 s,
checkpointed after each), `restarts: {max: 1, backoff: 0}` and the default heartbeat_timeout and
stop_grace. Once step 8 is printed, node1's link is cut; the job goes on on node0 and node2.

The parts, from the job's record and the arrival times of its lines:
- detection: the cut -> the controller's failure (node1 silent for heartbeat_timeout);
- stop: -> attempt 1 ended (every host stopped);
- preflight: -> attempt 2 began (connect, probe, preflight, stage on node0 and node2);
- rendezvous: -> the first `resumed from step K` (supervisors, torchrun, the workers' import of
  torch, init_process_group);
- resume: -> the first step of attempt 2.

Needs root, and the machine to itself (take the shared lock):
    flock /work/locks/heavy.lock .venv/bin/python bench/restart_bench.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, median, write_results

sys.path.insert(0, str(REPO))
from orchestrator.logs.query import Query, Style, read_lines
from orchestrator.spec.model import DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_STOP_GRACE
from orchestrator.store import Store
from tests.cluster.harness import Cluster

WORKER = REPO / "tests" / "cluster" / "jobs" / "restart_worker.py"
CUT_AFTER = "step 8 attempt 1"
GOAL = DEFAULT_HEARTBEAT_TIMEOUT + 15
NOTES = """
Notes: `resume` is this worker's own (it reads one number, so its first step arrives in the same
batch as its `resumed from step K` line); a real script adds the load of its checkpoint there
(jobs/train_resnet50.py's `--checkpoint-every`). `preflight` is short: the controller connects
to node0 and node2 again and probes both at once, over SSH inside one machine (a real network
adds its round trips, and a cold host its first import of python's modules). Most of
the total is detection, which is heartbeat_timeout by design, and the workers' start (import
torch on 2 cores, then gloo's rendezvous).
"""
MEANING = {
    "detection": "the cut -> the controller's failure (node1 silent for heartbeat_timeout)",
    "stop": "-> attempt 1 ended, every host stopped",
    "preflight": "-> attempt 2 began: connect, probe, preflight on node0 and node2",
    "rendezvous": "-> `resumed from step K`: supervisors, torchrun, import torch, init_process_group",
    "resume": "-> the first step of attempt 2",
}


def job_file(tmp: Path) -> Path:
    path = tmp / "job.yaml"
    path.write_text(f"name: spare\nscript: {WORKER}\nargs: [--steps, '60', --step-time, '0.4']\nnproc_per_node: 2\n"
                    f"env: {{OMP_NUM_THREADS: '1'}}\nnnodes: 2\nrestarts: {{max: 1, backoff: 0}}\n"
                    f"checkpoint_dir: {tmp / 'ckpt'}\n")
    return path


def lines_with_times(home: Path, job_id: str, attempt: int) -> list[tuple[float, str]]:
    """(arrival time, text) of every line of one attempt."""
    shown = read_lines(home / "jobs" / job_id, Query(attempt=attempt), Style(timestamps=True, bare=True))
    found = []
    for line in "".join(shown).splitlines():
        stamp, _, text = line.partition(" ")
        whole, _, millis = stamp.partition(".")
        found.append((time.mktime(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000, text))
    return found


def first(lines: list[tuple[float, str]], prefix: str) -> float:
    return next(t for t, text in lines if text.startswith(prefix))


def one_round(cluster: Cluster, tmp: Path, number: int) -> dict[str, float]:
    home = tmp / f"home{number}"
    home.mkdir()
    job_id = f"spare-{number}"
    env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    inv = cluster.write_inventory(tmp / "inv.yaml")
    with open(home / "out.txt", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(job_file(tmp / f"r{number}")),
                                 "-i", str(inv), "--nodes", "node0,node1,node2", "--job-id", job_id, "--no-live"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    cut = cluster.cut_during(proc, 1, 300, ready_within=300,
                             ready=lambda: any(t.startswith(CUT_AFTER) for _, t in lines_with_times(home, job_id, 1)),
                             says=lambda: (home / "out.txt").read_text()[-3000:])
    if proc.returncode != 0:
        raise RuntimeError((home / "out.txt").read_text()[-3000:])
    attempts = Store(home).get(job_id).attempts
    again = lines_with_times(home, job_id, 2)
    marks = [cut, attempts[0]["failure"]["time"], attempts[0]["ended"], attempts[1]["started"],
             first(again, "resumed from step"), first(again, "step ")]
    times = {part: marks[i + 1] - marks[i] for i, part in enumerate(MEANING)}
    times["total"] = marks[-1] - cut
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, Cluster(3) as cluster:
        for number in range(rounds):
            (Path(tmp) / f"r{number}").mkdir()
            runs.append(one_round(cluster, Path(tmp), number))
            print(json.dumps(runs[-1]), flush=True)
            time.sleep(DEFAULT_HEARTBEAT_TIMEOUT + DEFAULT_STOP_GRACE)  # the cut host ends its part of the job
    keys = [*MEANING, "total"]
    body = [
        "Taken while holding /work/locks/heavy.lock (nothing else heavy ran).", "",
        f"3 namespace hosts, `nnodes: 2` and one spare, 2 gloo ranks per host (restart_worker.py, a step every "
        f"0.4 s, checkpointed after each), heartbeat_timeout {DEFAULT_HEARTBEAT_TIMEOUT:g} s and stop_grace "
        f"{DEFAULT_STOP_GRACE:g} s (the defaults), `restarts: {{max: 1, backoff: 0}}`. node1's link is cut after "
        f"step 8; seconds from the cut, median of {rounds} rounds. Goal: total at most heartbeat_timeout + 15 s "
        f"= {GOAL:g} s.", "",
        "| part | what | median (s) |", "|---|---|---:|",
        *(f"| {part} | {what} | {median([r[part] for r in runs]):.2f} |" for part, what in MEANING.items()),
        f"| **total** | the cut -> training running again | **{median([r['total'] for r in runs]):.2f}** |", "",
        "Every round (" + ", ".join(keys) + "):", "",
        *(f"- {', '.join(f'{r[k]:.2f}' for k in keys)}" for r in runs),
        *NOTES.splitlines(),
    ]
    path = write_results("restart.md", "Restarts: from a lost host to training on the spare",
                         f"flock /work/locks/heavy.lock .venv/bin/python bench/restart_bench.py --rounds {rounds}",
                         body, keep=("The README's scenario, once",))
    print(path.read_text())


if __name__ == "__main__":
    main()
