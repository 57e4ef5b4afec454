"""`distrun doctor --links` at 3, 16 and 64 lab hosts: its wall time, its rounds, and what it names.

Each size is a namespace cluster (tests/cluster/: one sshd per host). At each size the check runs
`--rounds` times on healthy hosts (how many named a host: should be none) and `--rounds` times with
the middle host's link limited by `tc qdisc add dev eth0 root tbf rate 50mbit burst 32kbit latency
400ms` in its namespace (whether it, and only it, was named), alternating. Wall time is the whole
command's, start to exit; medians. The hosts and the controller share this machine's cores: the
rates are what 2 cores give many senders at once, and the check compares hosts with each other.

    flock /tmp/distrun-heavy.lock .venv/bin/python bench/links_bench.py [--sizes 3,16,64] [--rounds 5]
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
from tests.cluster.harness import Cluster

LIMIT = ["tbf", "rate", "50mbit", "burst", "32kbit", "latency", "400ms"]


def run_links(inventory: Path, home: Path) -> tuple[float, dict[str, object]]:
    """One `doctor --links --json`: its wall time and its `links` document."""
    env = {**os.environ, "DISTRUN_HOME": str(home), "DISTRUN_SSH_CONFIG": str(home / "no-ssh-config")}
    began = time.monotonic()
    argv = [sys.executable, "-m", "orchestrator", "doctor", "-i", str(inventory), "--all", "--links", "--json"]
    ran = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if not ran.stdout.strip():
        raise SystemExit(f"doctor --links printed nothing (exit {ran.returncode}): {ran.stderr[-2000:]}")
    return time.monotonic() - began, json.loads(ran.stdout)["links"]


def tc(cluster: Cluster, host: int, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", cluster.ns(host), "tc", "qdisc", *args], check=True, timeout=30)


def one_size(n: int, rounds: int, tmp: Path) -> dict[str, object]:
    """`rounds` healthy and `rounds` limited runs on n hosts, alternating."""
    healthy: list[float] = []
    limited: list[float] = []
    named_healthy, named_right = 0, 0
    shifts: list[int] = []
    with Cluster(n) as cluster:
        inventory = cluster.write_inventory(tmp / f"inventory-{n}.yaml")
        slow = n // 2
        for _ in range(rounds):
            seconds, doc = run_links(inventory, tmp / "home")
            healthy.append(seconds)
            named_healthy += bool(doc["slow"])
            shifts = list(doc["shifts"])  # type: ignore[call-overload]
            tc(cluster, slow, "add", "dev", "eth0", "root", *LIMIT)
            try:
                seconds, doc = run_links(inventory, tmp / "home")
            finally:
                tc(cluster, slow, "del", "dev", "eth0", "root")
            limited.append(seconds)
            named_right += list(doc["slow"]) == [cluster.name(slow)]  # type: ignore[call-overload]
    return {"n": n, "shifts": shifts, "healthy": healthy, "limited": limited, "named_healthy": named_healthy,
            "named_right": named_right, "rounds": rounds}


def table(results: list[dict[str, object]]) -> list[str]:
    lines = ["| hosts | rounds of the check | median s, healthy | median s, one link limited | healthy runs "
             "naming a host | limited runs naming it alone |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['n']} | {len(r['shifts'])} (shifts {r['shifts']}) | {median(r['healthy']):.2f} | "  # type: ignore[arg-type]
                     f"{median(r['limited']):.2f} | {r['named_healthy']} of {r['rounds']} | "  # type: ignore[arg-type]
                     f"{r['named_right']} of {r['rounds']} |")
    lines += ["", "| hosts | healthy wall s, in order | limited wall s, in order |", "|---|---|---|"]
    lines += [f"| {r['n']} | {', '.join(f'{s:.2f}' for s in r['healthy'])} | "  # type: ignore[attr-defined]
              f"{', '.join(f'{s:.2f}' for s in r['limited'])} |" for r in results]  # type: ignore[attr-defined]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="3,16,64")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        results = [one_size(int(n), args.rounds, Path(tmp)) for n in args.sizes.split(",")]
    after = os.getloadavg()
    body = [f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load)}; after: "
            f"{', '.join(f'{x:.2f}' for x in after)}. Each round of the check sends for 1 s.", "", *table(results)]
    path = write_results("links.md", "doctor --links on lab hosts",
                         f".venv/bin/python bench/links_bench.py --sizes {args.sizes} --rounds {args.rounds}", body)
    print(path.read_text())


if __name__ == "__main__":
    main()
