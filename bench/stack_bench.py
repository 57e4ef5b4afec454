"""`distrun stack` vs `pdsh -R ssh` running py-spy on each rank, on 3 and 16 hosts, 2 ranks per host.

The hosts are a namespace test cluster (tests/cluster/). The ranks are plain python processes
with the environment the supervisor and torchrun give a rank (DISTRUN_JOB_ID, DISTRUN_NODE,
RANK, LOCAL_RANK), each waiting in a function: py-spy's work does not depend on torch, and 32
torch ranks would not fit this machine's 2 cores. The job's record names a stand-in controller
process, since no launch runs. pdsh does what an operator would by hand: on every host, find the
job's processes in /proc and run `py-spy dump` on each, one after another. distrun does that with
every rank of a host at once, then folds the stacks. Alternating runs, start-to-exit wall time,
medians and ratios, written to bench/results/stack.md.

Needs root, and the machine to itself (take the shared lock):
    flock /work/locks/heavy.lock .venv/bin/python bench/stack_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from common import REPO, alternate, median, timed, write_results

sys.path.insert(0, str(REPO))
from orchestrator.store import JobRecord, JobState, Store
from tests.cluster.harness import Cluster

SIZES = (3, 16)
RANKS_PER_HOST = 2
JOB_ID = "stack-bench-1"
RANK = "import time\ndef wait_in_collective():\n    time.sleep(3600)\nwait_in_collective()\n"
PYSPY = str(Path(sys.executable).parent / "py-spy")


def pdsh_command(addrs: list[str]) -> list[str]:
    """pdsh running py-spy on each of the job's processes of each host, found as stop finds them."""
    line = (f"for p in /proc/[0-9]*; do e=$( {{ tr '\\0' '\\n' < $p/environ; }} 2>/dev/null) || continue; "
            f"case \"$e\" in *DISTRUN_JOB_ID={JOB_ID}*) ;; *) continue;; esac; "
            f"echo \"$e\" | grep -qx \"DISTRUN_NODE=$(hostname)\" || continue; "
            f"{shlex.quote(PYSPY)} dump --pid ${{p#/proc/}}; done")
    return ["pdsh", "-R", "ssh", "-w", ",".join(addrs), line]


def start_ranks(size: int) -> list[subprocess.Popen[bytes]]:
    procs = []
    for host in range(size):
        for local in range(RANKS_PER_HOST):
            env = {**os.environ, "DISTRUN_JOB_ID": JOB_ID, "DISTRUN_NODE": f"node{host}",
                   "RANK": str(host * RANKS_PER_HOST + local), "LOCAL_RANK": str(local)}
            procs.append(subprocess.Popen([sys.executable, "-c", RANK], env=env))
    return procs


def run_size(cluster: Cluster, size: int, tmp: Path, rounds: int) -> dict[str, list[float]]:
    doc = yaml.safe_load(cluster.write_inventory(tmp / "inventory.yaml").read_text())
    doc["nodes"] = doc["nodes"][:size]
    inv = tmp / f"inventory-{size}.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    home = tmp / f"home-{size}"
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "orchestrator"])
    ranks = start_ranks(size)
    try:
        Store(home).save(JobRecord(id=JOB_ID, name="bench", spec_path="x.yaml", inventory=str(inv),
                                   hosts=[f"node{i}" for i in range(size)], backend="ssh",
                                   state=JobState.RUNNING, controller_pid=controller.pid))
        stack = [sys.executable, "-m", "orchestrator", "stack", JOB_ID, "--json"]
        env = {"DISTRUN_HOME": str(home)}
        check = subprocess.run(stack, env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True)
        groups = json.loads(check.stdout)["groups"]
        assert [len(g["ranks"]) for g in groups] == [size * RANKS_PER_HOST], check.stdout[-2000:]
        pdsh = pdsh_command([cluster.addr(i) for i in range(size)])
        pdsh_env = {"PDSH_SSH_ARGS": f"-F {cluster.ssh_config} -x -l%u %h"}
        dumped = subprocess.run(pdsh, env={**os.environ, **pdsh_env}, capture_output=True, text=True)
        assert dumped.stdout.count("wait_in_collective (") == size * RANKS_PER_HOST, dumped.stdout[-2000:]
        return alternate({"pdsh + py-spy": lambda: timed(pdsh, pdsh_env), "distrun stack": lambda: timed(stack, env)},
                         rounds)
    finally:
        for proc in [controller, *ranks]:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp, Cluster(max(SIZES)) as cluster:
        for size in SIZES:
            results[size] = run_size(cluster, size, Path(tmp), args.rounds)
    body = ["Taken while holding /work/locks/heavy.lock (nothing else heavy ran).", "",
            f"{RANKS_PER_HOST} ranks per host; start-to-exit wall time, median of {args.rounds} alternating runs.", "",
            "| hosts | ranks | pdsh + py-spy (s) | distrun stack (s) | ratio |", "|---|---|---|---|---|"]
    for size, times in results.items():
        peer, ours = median(times["pdsh + py-spy"]), median(times["distrun stack"])
        body.append(f"| {size} | {size * RANKS_PER_HOST} | {peer:.2f} | {ours:.2f} | {ours / peer:.2f}x |")
    body += ["", "Every run:", ""]
    body += [f"- {size} hosts, {tool}: {', '.join(f'{t:.2f}' for t in runs)}"
             for size, by_tool in results.items() for tool, runs in by_tool.items()]
    path = write_results("stack.md", "distrun stack: every rank's stack on 3 and 16 hosts",
                         "flock /work/locks/heavy.lock .venv/bin/python bench/stack_bench.py "
                         f"--rounds {args.rounds}", body)
    print(path.read_text())


if __name__ == "__main__":
    main()
