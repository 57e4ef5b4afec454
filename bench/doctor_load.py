"""`distrun doctor` on 244 namespace hosts while this machine is loaded: no false ✗ (issue 34).

Each round runs `distrun doctor --json` on all 244 hosts of the harness's largest cluster while
HOGS busy-looping processes share this machine's cores with the hosts' sshd and probes, and
records its exit status, its port-reachable row and the load average. `--baseline REV` adds the
same command from a checkout of commit REV to each round. Writes the "Under load" section of
bench/results/doctor.md.

Needs root, and the machine to itself (take the shared lock):
    flock /tmp/distrun-heavy.lock .venv/bin/python bench/doctor_load.py [--rounds 3] [--hogs 16] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import REPO, checkout, write_section

sys.path.insert(0, str(REPO))
from tests.cluster.harness import Cluster

HOSTS = 244
HEADING = "Under load: 244 hosts"


@dataclass
class Run:
    tool: str
    wall: float
    code: int
    port: str  # port-reachable: status, and how many hosts each way
    summary: str
    others: str  # the other rows that were not ok: name, status, detail
    load: float  # 1-minute load average at the run's end


def doctor(tree: Path, inventory: Path, home: Path) -> tuple[float, int, dict]:
    env = {**os.environ, "PYTHONPATH": str(tree), "DISTRUN_HOME": str(home),
           "DISTRUN_SSH_CONFIG": str(home / "no-ssh-config")}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "orchestrator", "doctor", "-i", str(inventory), "--all", "--json"],
                          cwd=tree, env=env, capture_output=True, text=True, check=False, timeout=900)
    wall = time.monotonic() - began
    try:
        return wall, done.returncode, json.loads(done.stdout)
    except ValueError:
        return wall, done.returncode, {"checks": [], "summary": {"error": done.stderr.strip()[-200:]}}


def port_row(report: dict) -> str:
    row = next((c for c in report.get("checks", []) if c["name"] == "port-reachable"), None)
    if row is None:
        return "none"
    detail = row["detail"]
    return f"{row['status']} on {len(row['hosts'])} host(s): {detail[:160]}{'…' if len(detail) > 160 else ''}"


def other_rows(report: dict) -> str:
    rows = [c for c in report.get("checks", []) if c["status"] != "ok" and c["name"] != "port-reachable"]
    return "; ".join(f"{c['name']} {c['status']}: {c['detail'][:120]}" for c in rows)


def hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=16)
    parser.add_argument("--baseline")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="doctor-load-"))
    trees = {"doctor": REPO, **({f"doctor {args.baseline}": checkout(args.baseline, tmp)} if args.baseline else {})}
    runs: list[Run] = []
    with Cluster(HOSTS) as cluster:
        inventory = cluster.write_inventory(tmp / "inventory.yaml")
        bringup = cluster.bringup_seconds
        for _ in range(args.rounds):
            for tool, tree in trees.items():
                busy = hogs(args.hogs)
                try:
                    wall, code, report = doctor(tree, inventory, tmp / "home")
                finally:
                    for proc in busy:
                        proc.kill()
                        proc.wait()
                runs.append(Run(tool, wall, code, port_row(report), json.dumps(report.get("summary")),
                                other_rows(report), os.getloadavg()[0]))
                print(runs[-1], flush=True)
                time.sleep(5)
    body = [
        f"{args.rounds} rounds; in each, `python -m orchestrator doctor -i INVENTORY --all --json` on all "
        f"{HOSTS} hosts (full probe, the master listening while the others connect), "
        f"with {args.hogs} busy-looping processes "
        f"on this machine's {os.cpu_count()} cores for the whole run. The cluster came up in {bringup:.1f} s. "
        "Taken while holding the shared heavy lock.",
        *([f"- doctor {args.baseline}: the same command from a checkout of commit {args.baseline}, before the "
           "fix of issue 34"] if args.baseline else []),
        "",
        "| tool | wall s | exit | port-reachable | summary | the other rows not ok | load (1 min) at end |",
        "|---|---|---|---|---|---|---|",
        *(f"| {r.tool} | {r.wall:.1f} | {r.code} | {r.port.replace('|', '/')} | {r.summary} | "
          f"{r.others.replace('|', '/')} | {r.load:.1f} |" for r in runs),
    ]
    options = f"--rounds {args.rounds} --hogs {args.hogs}" + (f" --baseline {args.baseline}" if args.baseline else "")
    path = write_section("doctor.md", HEADING, f"flock /tmp/distrun-heavy.lock .venv/bin/python "
                         f"bench/doctor_load.py {options} (as root)", body)
    print(path.read_text())


if __name__ == "__main__":
    main()
