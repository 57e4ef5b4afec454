"""The other hosts' story after a planted raise in a program without `@record` (issue 46.15), under
an added CPU load: 3 namespace hosts x 2 ranks of tests/cluster/jobs/plain_ddp.py (third-party style,
gloo), rank 3 raises at epoch 2, N runs with BUSY busy loops (`python3 -c 'while 1: pass'`) started
before the first run and stopped after the last.

    .venv/bin/python bench/consequence_runs.py [--runs 10] [--busy 8]     # as root: it builds the lab

Writes bench/results/consequence.md: per run, the root cause, the `Other hosts` line, whether each
other host's story is "failed as a consequence" with its own error, and the load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from common import REPO, write_results

sys.path.insert(0, str(REPO))
from tests.cluster.harness import Cluster  # the lab, as the cluster tests build it

SCRIPT = REPO / "tests" / "cluster" / "jobs" / "plain_ddp.py"
ARGS = ["--raise-rank", "3", "--raise-epoch", "2"]
CONSEQUENCE = re.compile(r"(node[02]): failed as a consequence \(rank (\d): ([\w.]+(?:Error|Exception)\b[^)]*)\)")


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    """`count` busy loops on this machine (every namespace host shares its CPUs) while the block runs."""
    procs = [subprocess.Popen(["python3", "-c", "while 1: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def one_run(folder: Path, inventory: Path, n: int) -> dict[str, object]:
    """One launch to its end: its root cause, its `Other hosts` line, and what the record says of the others."""
    home = Path(tempfile.mkdtemp(prefix="home-", dir=folder))
    env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1"}
    job = folder / "job.yaml"
    job.write_text(f"name: consequence\nscript: {SCRIPT}\nargs: {json.dumps(ARGS)}\nnproc_per_node: 2\n"
                   "env: {OMP_NUM_THREADS: '1'}\nstop_grace: 3\nheartbeat_timeout: 30\n")
    job_id = f"consequence-{n}-{int(time.time()) % 10**6}"
    load = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "orchestrator", "launch", str(job), "-i", str(inventory),
                           "--job-id", job_id, "--no-live"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    record = json.loads(subprocess.run([sys.executable, "-m", "orchestrator", "ps", "--json", "--all"], cwd=REPO,
                                       env=env, capture_output=True, text=True, check=True).stdout)[0]
    other = next((line for line in done.stdout.splitlines() if line.startswith("Other hosts: ")), "")
    said = {node: (int(rank), error) for node, rank, error in CONSEQUENCE.findall(other)}
    root = (record.get("failures") or [{}])[0]
    return {"rc": done.returncode, "seconds": time.monotonic() - started, "load": load, "other": other,
            "root": f"{root.get('host')} rank {root.get('rank')}: {root.get('message') or '(no error line)'}",
            "true": sorted(said) == ["node0", "node2"] and all(rank // 2 == int(node[-1])
                                                               for node, (rank, _) in said.items()),
            "stopped": [f["host"] for f in record.get("failures", [])[1:] if f.get("stopped")]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--busy", type=int, default=8)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp, Cluster(3) as cluster:
        inventory = cluster.write_inventory(Path(tmp) / "inv.yaml")
        with busy(args.busy):
            for n in range(1, args.runs + 1):
                runs.append(one_run(Path(tmp), inventory, n))
                print(f"run {n}: {runs[-1]['other']}", flush=True)
    true = sum(bool(run["true"]) for run in runs)
    body = [f"{len(runs)} runs, {args.busy} busy loops added: the other hosts' story is \"failed as a consequence\" "
            f"with their own error in {true} of {len(runs)}.", "",
            "| run | load (1 min) | seconds | exit | root cause | Other hosts | true | stopped in the record |",
            "|---|---|---|---|---|---|---|---|"]
    for i, run in enumerate(runs, 1):
        body.append(f"| {i} | {run['load']:.1f} | {run['seconds']:.0f} | {run['rc']} | {run['root']} | "
                    f"`{run['other']}` | {'yes' if run['true'] else 'NO'} | {', '.join(run['stopped']) or 'none'} |")
    command = f".venv/bin/python bench/consequence_runs.py --runs {args.runs} --busy {args.busy}"
    print(write_results("consequence.md", "The other hosts' story after a raise without @record, under load",
                        command, body))


if __name__ == "__main__":
    main()
