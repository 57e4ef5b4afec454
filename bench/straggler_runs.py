"""Straggler alerts on healthy hosts: programs that print nothing for distrun, run N times on the
namespace lab, none slowed; every straggler alert is a false one.

    .venv/bin/python -m tests.cluster up -n 3 --inventory /tmp/lab.yaml   # in another shell
    .venv/bin/python bench/straggler_runs.py -i /tmp/lab.yaml [--runs 10] [--seconds 45]

Writes bench/results/stragglers.md: per program, the runs, their progress and any alert.
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

from common import REPO, write_results

JOBS = REPO / "tests" / "cluster" / "jobs"
PROGRAMS = {
    "epoch_worker.py (DDP, 20 steps an epoch, 20 ms data wait a step)": (JOBS / "epoch_worker.py", ["--seconds"]),
    "snapshot_trainer.py (own Trainer, snapshot file, 8 short steps an epoch)": (JOBS / "snapshot_trainer.py", None),
}


def job_file(folder: Path, script: Path, args: list[str]) -> Path:
    path = folder / f"{script.stem}.yaml"
    path.write_text(f"name: {script.stem.replace('_', '-')}\nscript: {script}\nargs: {json.dumps(args)}\n"
                    "nproc_per_node: 2\nenv: {OMP_NUM_THREADS: '1'}\nheartbeat_timeout: 20\n")
    return path


def one_run(folder: Path, inventory: str, script: Path, args: list[str], seconds: float) -> dict[str, object]:
    """One launch on every host; stopped after `seconds` unless it ended."""
    home = Path(tempfile.mkdtemp(prefix="home-", dir=folder))
    env = {**os.environ, "DISTRUN_HOME": str(home)}
    job_id = f"healthy-{int(time.time() * 1000) % 10**9}"
    argv = [sys.executable, "-m", "orchestrator", "launch", str(job_file(folder, script, args)), "-i", inventory,
            "--job-id", job_id, "--no-live"]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        subprocess.run([sys.executable, "-m", "orchestrator", "stop", job_id], cwd=REPO, env=env,
                       capture_output=True, timeout=120)
        out, _ = proc.communicate(timeout=120)
    record = json.loads(subprocess.run([sys.executable, "-m", "orchestrator", "ps", "--json", "--all"], cwd=REPO,
                                       env=env, capture_output=True, text=True, check=True).stdout)[0]
    return {"alerts": [a for a in record["alerts"] if "straggler" in a],
            "progress": record.get("progress") or {}, "said": "ALERT straggler" in out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=45.0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    body = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (script, seconds_flag) in PROGRAMS.items():
            endless = ["100000", "5", "--snapshot_path", f"{tmp}/snapshot.pt"]
            script_args = [*seconds_flag, str(int(args.seconds))] if seconds_flag else endless
            runs = [one_run(Path(tmp), args.inventory, script, script_args, args.seconds + 30)
                    for _ in range(args.runs)]
            named = [r for r in runs if r["alerts"] or r["said"]]
            body += [f"## {name}", "", f"{len(runs)} runs on healthy hosts: straggler named in {len(named)}.", "",
                     "| run | collectives completed | collectives/s at the end | straggler alerts |",
                     "|---|---|---|---|"]
            for i, run in enumerate(runs, 1):
                progress = run["progress"]
                body.append(f"| {i} | {progress.get('collectives', 0)} | {progress.get('collectives_per_s')} | "
                            f"{'; '.join(run['alerts']) or 'none'} |")
            body.append("")
    load_after = os.getloadavg()
    body.insert(0, f"Load average before {load_before[0]:.1f}, after {load_after[0]:.1f}; 3 namespace hosts x 2 "
                   "ranks (gloo, CPU), each program stopped after its seconds or at its end.\n")
    command = f".venv/bin/python bench/straggler_runs.py -i INVENTORY --runs {args.runs} --seconds {args.seconds:g}"
    print(write_results("stragglers.md", "Straggler alerts on healthy hosts", command, body))


if __name__ == "__main__":
    main()
