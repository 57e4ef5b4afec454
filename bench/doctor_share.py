"""Doctor alone at 244 hosts: the controller's CPU per host and the wall time over the CPU floor.

The short form of `doctor_bench.py --scale` for issue 31's goals (at most 5 ms of controller
CPU per host; wall time within 1.1x the CPU floor, median of 3): no pdsh and no 64-host row,
so that it holds the shared lock for a few minutes. `--baseline REV` alternates doctor as of
commit REV (one that has `--all`) with this checkout's. Writes the "Controller's share at 244 hosts" section of
bench/results/doctor.md.

    flock /tmp/distrun-heavy.lock .venv/bin/python bench/doctor_share.py [--rounds 3] [--baseline REV]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from common import checkout, median, sshd_listeners, write_section
from doctor_bench import Cell, Cluster, commands, cpu_split, floor, floor_ratio, inventory, measured

HOSTS = 244
HEADING = f"Controller's share at {HOSTS} hosts (issue 31)"


def run(rounds: int, tmp: Path, baseline: tuple[str, Path] | None) -> tuple[dict[str, Cell], float]:
    with Cluster(HOSTS) as cluster:
        listeners = sshd_listeners(cluster.state_dir)
        inv = inventory(cluster.write_inventory(tmp / "inventory.yaml"), HOSTS, tmp)
        argv, env = commands([cluster.addr(i) for i in range(HOSTS)], inv, cluster.ssh_config)["doctor"]
        cells = {"doctor": Cell()}
        # A run exiting 1 (a check's false error on this loaded machine) is counted, not fatal.
        runs = {"doctor": measured("doctor", argv, env, cells["doctor"], listeners, may_fail=True)}
        measured("doctor", argv, env, Cell(), listeners, may_fail=True)()
        if baseline is not None:
            old = f"doctor {baseline[0]}"
            cells[old] = Cell()
            runs[old] = measured(old, argv, env, cells[old], listeners, cwd=baseline[1], may_fail=True)
            measured(old, argv, env, Cell(), listeners, cwd=baseline[1], may_fail=True)()
        for _ in range(rounds):
            for call in runs.values():
                call()
        return cells, cluster.bringup_seconds


def table(cells: dict[str, Cell]) -> list[str]:
    rows = ["| tool | wall s | controller CPU ms per host (goal: at most 5) | wall / CPU floor (goal: at most 1.1) "
            "| controller CPU s (user + sys) | hosts' sshd CPU s | CPU floor s | failed runs |",
            "|---|---|---|---|---|---|---|---|"]
    for tool, cell in cells.items():
        per_host = median(cell.cpu) / HOSTS * 1000
        rows.append(f"| {tool} | {median(cell.wall):.2f} | {per_host:.1f} | {floor_ratio(cell):.2f} "
                    f"| {cpu_split(cell)} | {median(cell.sshd):.2f} | {floor(cell):.2f} | {len(cell.failed)} |")
    rows += ["", "| tool | wall s, in order | controller CPU s, in order | hosts' sshd CPU s, in order |",
             "|---|---|---|---|"]
    rows += [f"| {tool} | {', '.join(f'{v:.2f}' for v in c.wall)} | {', '.join(f'{v:.2f}' for v in c.cpu)} | "
             f"{', '.join(f'{v:.2f}' for v in c.sshd)} |" for tool, c in cells.items()]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="REV")
    args = parser.parse_args()
    os.environ["DISTRUN_SSH_CONFIG"] = os.devnull
    os.environ.pop("SSH_AUTH_SOCK", None)
    tmp = Path(tempfile.mkdtemp(prefix="distrun-doctor-share-"))
    baseline = (args.baseline, checkout(args.baseline, tmp)) if args.baseline else None
    load_before = os.getloadavg()
    cells, bringup = run(args.rounds, tmp, baseline)
    load_after = os.getloadavg()
    body = [
        f"{args.rounds} alternating rounds (after one untimed run of each); medians; wall time from start to exit. "
        f"The {HOSTS}-host cluster came up in {bringup:.1f} s. Taken while holding the shared heavy lock; other "
        "engineers' light work still shared the 2 cores.",
        "",
        "- doctor: `python -m orchestrator doctor -i INVENTORY --all --json` (full probe, as in the series above)",
        *([f"- doctor {args.baseline}: the same command from a checkout of commit {args.baseline}"]
          if baseline else []),
        "- controller CPU: user + sys of doctor (interpreter start-up included); CPU floor: controller and hosts' "
        "CPU together over the 2 cores; wall / CPU floor: each run's own, median over the runs",
        f"- load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{', '.join(f'{v:.2f}' for v in load_after)}",
        "", *table(cells),
    ]
    options = f"--rounds {args.rounds}" + (f" --baseline {args.baseline}" if args.baseline else "")
    command = f"flock /tmp/distrun-heavy.lock .venv/bin/python bench/doctor_share.py {options} (as root)"
    path = write_section("doctor.md", HEADING, command, body)
    print(path.read_text())


if __name__ == "__main__":
    main()
