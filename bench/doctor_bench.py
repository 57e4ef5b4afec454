"""`distrun doctor` vs `pdsh -R ssh` running the same probe, on 2, 4, 8 and 16 hosts.

The hosts are a namespace test cluster (tests/cluster/: one sshd per network namespace,
ed25519 keys, strict host-key checking for both tools). pdsh runs doctor's own probe
(orchestrator/remote/probe.py, `full` facts, the same python) on every host at once;
doctor does that and the rest of its work: the master listening on the rendezvous port
while the others connect, name resolution, the checks and the table. Alternating runs,
start-to-exit wall time of the whole command, medians and ratios, written to
bench/results/doctor.md. Goals: doctor within 1.3x of pdsh, and under 3 s on 16 hosts.

`--scale` runs the other series instead: 64 and 244 hosts (the harness's largest
cluster), pdsh with a fan-out of 256 so that both tools reach every host at once, with
the controller's user and sys CPU and the hosts' sshd CPU (each session's processes:
the probe). Goals at 244 hosts: at most 5 ms of controller CPU per host, and wall time within
1.1x the CPU floor. Hosts and controller share this
machine's cores, so their CPU together, divided by the cores, is the least wall time
any tool could take here; the table shows it. `--baseline REV` adds doctor as it was
at commit REV to the alternation (its failures are counted, not fatal). It replaces
the "At scale" section of doctor.md and keeps the rest (and the other series keeps it).

Needs root, and the machine to itself (take the shared lock):
    flock /tmp/distrun-heavy.lock .venv/bin/python bench/doctor_bench.py [--rounds 7] [--scale [--baseline REV]]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from common import (
    REPO,
    alternate,
    before_all_flag,
    checkout,
    children_cpu,
    median,
    sshd_cpu,
    sshd_listeners,
    write_results,
    write_section,
)

sys.path.insert(0, str(REPO))
from tests.cluster.harness import Cluster

SIZES = (2, 4, 8, 16)
SCALE_SIZES = (64, 244)
SCALE_FANOUT = 256
CPU_PER_HOST_GOAL_MS = 5.0  # the controller's CPU per host at the largest size
FLOOR_RATIO_GOAL = 1.1  # wall time over the CPU floor
SCALE_HEADING = "At scale: 64 and 244 hosts"
TOOLS = ("pdsh", "doctor")
RATIO_GOAL = 1.3
SECONDS_GOAL = 3.0
SETTLE = 0.3  # after a run, time for the hosts' sshd to reap their sessions


@dataclass
class Cell:
    """The runs of one tool on one cluster size."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    user: list[float] = field(default_factory=list)
    sys: list[float] = field(default_factory=list)
    sshd: list[float] = field(default_factory=list)  # the hosts' sshd and sessions (scale series only)
    failed: list[int] = field(default_factory=list)  # exit codes of runs allowed to fail (a baseline's)
    inside: list[float] = field(default_factory=list)  # doctor's own `seconds` (no interpreter start-up)


def probe_command(python: str, workdir: Path) -> str:
    """The shell line pdsh runs on each host: doctor's probe, `full` facts, from argv."""
    options = json.dumps({"full": True, "workdir": str(workdir)}).encode()
    source = (f"{(REPO / 'orchestrator' / 'remote' / 'probe.py').read_text()}\n"
              f"import io\nsys.stdin = io.TextIOWrapper(io.BytesIO({options!r} + b'\\n'))\nmain([])\n")
    encoded = base64.b64encode(source.encode()).decode()
    return shlex.join([python, "-c", f"import base64; exec(base64.b64decode('{encoded}'))"])


def commands(addrs: list[str], inv: Path, ssh_config: Path,
             fanout: int | None = None) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The exact command lines, with their extra environment, for each tool (pdsh's fan-out: its default, 32)."""
    pdsh = ["pdsh", "-R", "ssh", *(["-f", str(fanout)] if fanout else []), "-w", ",".join(addrs),
            probe_command(sys.executable, REPO)]
    doctor = [sys.executable, "-m", "orchestrator", "doctor", "-i", str(inv), "--all", "--json"]
    return {"pdsh": (pdsh, {"PDSH_SSH_ARGS": f"-F {ssh_config} -x -l%u %h"}), "doctor": (doctor, {})}


def measured(tool: str, argv: list[str], env: dict[str, str], cell: Cell, listeners: list[int] | None = None,
             cwd: Path | None = None, may_fail: bool = False) -> Callable[[], float]:
    """A run of `argv` (in `cwd`) recording wall time, client CPU and (given the sshd listeners)
    the hosts' sshd CPU in `cell`; fails if the command fails, unless `may_fail`."""
    def run() -> float:
        (user, system), server = children_cpu(), sshd_cpu(listeners or [])
        began = time.perf_counter()
        done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, check=False, cwd=cwd)
        wall = time.perf_counter() - began
        if done.returncode != 0 and may_fail:
            cell.failed.append(done.returncode)
        elif done.returncode != 0:
            raise RuntimeError(f"{tool} exited {done.returncode}: {done.stderr[-2000:] or done.stdout[-2000:]}")
        time.sleep(SETTLE)
        user_after, system_after = children_cpu()
        cell.wall.append(wall)
        cell.user.append(user_after - user)
        cell.sys.append(system_after - system)
        cell.cpu.append(cell.user[-1] + cell.sys[-1])
        cell.sshd.append(sshd_cpu(listeners or []) - server)
        if tool.startswith("doctor") and done.stdout.startswith("{"):
            cell.inside.append(float(json.loads(done.stdout)["seconds"]))
        return wall
    return run


def inventory(base: Path, size: int, tmp: Path) -> Path:
    """The cluster's inventory cut to its first `size` nodes."""
    doc = yaml.safe_load(base.read_text())
    doc["nodes"] = doc["nodes"][:size]
    path = tmp / f"inventory-{size}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


Results = dict[int, dict[str, Cell]]


def run_all(cluster: object, tmp: Path, rounds: int) -> Results:
    """Every size, the tools alternating within each round, after one untimed run of each."""
    base = cluster.write_inventory(tmp / "inventory.yaml")
    results: Results = {}
    for size in SIZES:
        lines = commands([cluster.addr(i) for i in range(size)], inventory(base, size, tmp), cluster.ssh_config)
        for tool, (argv, env) in lines.items():
            measured(tool, argv, env, Cell())()
        cells = {tool: Cell() for tool in TOOLS}
        alternate({tool: measured(tool, *lines[tool], cells[tool]) for tool in TOOLS}, rounds)
        results[size] = cells
        print(size, {tool: f"{median(cell.wall):.3f}" for tool, cell in cells.items()}, flush=True)
    return results


def torch_import_seconds(cluster: object, runs: int) -> list[float]:
    """Wall time of pdsh running `import torch` on every host: what a probe importing it would add."""
    addrs = ",".join(cluster.addr(i) for i in range(max(SIZES)))
    argv = ["pdsh", "-R", "ssh", "-w", addrs, shlex.join([sys.executable, "-c", "import torch.distributed"])]
    cell = Cell()
    for _ in range(runs):
        measured("pdsh", argv, {"PDSH_SSH_ARGS": f"-F {cluster.ssh_config} -x -l%u %h"}, cell)()
    return cell.wall


def comparison(results: Results) -> list[str]:
    rows = [f"| hosts | pdsh s | doctor s | doctor / pdsh | within {RATIO_GOAL}x | under {SECONDS_GOAL:g} s "
            "| doctor's own s | client CPU s pdsh / doctor |", "|---|---|---|---|---|---|---|---|"]
    for size, cells in results.items():
        pdsh, ours = cells["pdsh"], cells["doctor"]
        ratio = median(ours.wall) / median(pdsh.wall)
        rows.append(f"| {size} | {median(pdsh.wall):.3f} | {median(ours.wall):.3f} | {ratio:.2f} | "
                    f"{'yes' if ratio <= RATIO_GOAL else 'NO'} | {'yes' if median(ours.wall) < SECONDS_GOAL else 'NO'} "
                    f"| {median(ours.inside):.3f} | {median(pdsh.cpu):.2f} / {median(ours.cpu):.2f} |")
    return rows


def every_run(results: Results) -> list[str]:
    rows = ["| hosts | tool | wall s, in order |", "|---|---|---|"]
    for size, cells in results.items():
        rows += [f"| {size} | {tool} | {', '.join(f'{v:.3f}' for v in cell.wall)} |" for tool, cell in cells.items()]
    return rows


ScaleResults = dict[int, dict[str, Cell]]


def run_scale(cluster: object, tmp: Path, rounds: int, baseline: tuple[str, Path] | None) -> ScaleResults:
    """Each scale size, pdsh at fan-out 256, the tools alternating within each round."""
    base = cluster.write_inventory(tmp / "inventory.yaml")
    listeners = sshd_listeners(cluster.state_dir)
    results: ScaleResults = {}
    for size in SCALE_SIZES:
        lines = commands([cluster.addr(i) for i in range(size)], inventory(base, size, tmp), cluster.ssh_config,
                         fanout=SCALE_FANOUT)
        cells = {tool: Cell() for tool in TOOLS}
        runs = {tool: measured(tool, *lines[tool], cells[tool], listeners) for tool in TOOLS}
        if baseline is not None:
            # `python -m` imports the package from the working directory: the old checkout's.
            old = f"doctor {baseline[0]}"
            cells[old] = Cell()
            argv, env = lines["doctor"]
            runs[old] = measured(old, before_all_flag(argv, baseline[1]), env, cells[old], listeners, cwd=baseline[1],
                                 may_fail=True)
            measured(old, before_all_flag(argv, baseline[1]), env, Cell(), listeners, cwd=baseline[1], may_fail=True)()
        for tool, (argv, env) in lines.items():
            measured(tool, argv, env, Cell(), listeners)()
        alternate(runs, rounds)
        results[size] = cells
        print(size, {tool: f"{median(cell.wall):.3f}" for tool, cell in cells.items()}, flush=True)
    return results


def floor(cell: Cell) -> float:
    """The least wall time this run's work allows here: controller and hosts' CPU over the cores."""
    return (median(cell.cpu) + median(cell.sshd)) / (os.cpu_count() or 1)


def scale_table(results: ScaleResults) -> list[str]:
    rows = ["| hosts | tool | wall s | / pdsh | controller CPU ms per host (goal at "
            f"{max(SCALE_SIZES)}: at most {CPU_PER_HOST_GOAL_MS:g}) | wall / CPU floor (goal: at most "
            f"{FLOOR_RATIO_GOAL:g}) | doctor's own s | controller CPU s (user + sys) | hosts' sshd CPU s "
            "| CPU floor s | failed runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for size, cells in results.items():
        pdsh = median(cells["pdsh"].wall)
        for tool, cell in cells.items():
            per_host = median(cell.cpu) / size * 1000
            ours = tool == "doctor" and size == max(SCALE_SIZES)
            cpu_goal = f" ({'yes' if per_host <= CPU_PER_HOST_GOAL_MS else 'NO'})" if ours else ""
            ratio = floor_ratio(cell)
            ratio_goal = f" ({'yes' if ratio <= FLOOR_RATIO_GOAL else 'NO'})" if ours else ""
            own = f"{median(cell.inside):.2f}" if cell.inside else ""
            failed = f"{len(cell.failed)} (exit {', '.join(map(str, cell.failed))})" if cell.failed else "0"
            rows.append(f"| {size} | {tool} | {median(cell.wall):.2f} | {median(cell.wall) / pdsh:.2f} | "
                        f"{per_host:.1f}{cpu_goal} | {ratio:.2f}{ratio_goal} | {own} | {cpu_split(cell)} | "
                        f"{median(cell.sshd):.2f} | {floor(cell):.2f} | {failed} |")
    return rows


def floor_ratio(cell: Cell) -> float:
    """The median over runs of each run's wall time over its own CPU floor."""
    cores = os.cpu_count() or 1
    runs = zip(cell.wall, cell.cpu, cell.sshd, strict=True)
    return median([wall / ((cpu + sshd) / cores) for wall, cpu, sshd in runs])


def cpu_split(cell: Cell) -> str:
    return f"{median(cell.user):.2f} + {median(cell.sys):.2f} = {median(cell.cpu):.2f}"


def scale_growth(results: ScaleResults) -> list[str]:
    """How doctor's controller CPU and the hosts' CPU grew from the smallest to the largest size."""
    small, large = SCALE_SIZES[0], SCALE_SIZES[-1]
    hosts = large / small
    lines = []
    for tool in results[large]:
        grew = median(results[large][tool].cpu) / median(results[small][tool].cpu)
        lines.append(f"- {tool}: controller CPU x{grew:.2f} from {small} to {large} hosts (hosts x{hosts:.2f}): "
                     f"{'no faster than' if grew <= hosts else 'FASTER than'} the number of hosts")
    ours = results[large]["doctor"]
    cores = os.cpu_count() or 1
    lines += [
        f"- the hosts' CPU for doctor at {large} hosts: {median(ours.sshd):.2f} s, "
        f"{median(ours.sshd) / large * 1000:.0f} ms per host (sshd, the login shell and the python probe)",
        f"- so at {large} hosts no tool can take less than {floor(ours):.2f} s on this machine's {cores} cores: "
        f"{median(ours.sshd) / cores:.2f} s of it is the hosts' work, {median(ours.cpu) / cores:.2f} s the "
        "controller's",
    ]
    return lines


def scale_runs(results: ScaleResults) -> list[str]:
    rows = ["| hosts | tool | wall s, in order | controller CPU s, in order | hosts' sshd CPU s, in order |",
            "|---|---|---|---|---|"]
    for size, cells in results.items():
        rows += [f"| {size} | {tool} | {', '.join(f'{v:.2f}' for v in cell.wall)} | "
                 f"{', '.join(f'{v:.2f}' for v in cell.cpu)} | {', '.join(f'{v:.2f}' for v in cell.sshd)} |"
                 for tool, cell in cells.items()]
    return rows


def scale_main(rounds: int, tmp: Path, baseline_rev: str | None) -> None:
    baseline = (baseline_rev, checkout(baseline_rev, tmp)) if baseline_rev else None
    load_before = os.getloadavg()
    with Cluster(max(SCALE_SIZES)) as cluster:
        bringup = cluster.bringup_seconds
        results = run_scale(cluster, tmp, rounds, baseline)
    load_after = os.getloadavg()
    body = [
        f"{rounds} alternating rounds per size (after one untimed run of each tool); wall time from start to exit; "
        "medians. Taken while holding the shared heavy lock (/tmp/distrun-heavy.lock): no other benchmark or "
        f"cluster test ran. The {max(SCALE_SIZES)}-host cluster came up in {bringup:.1f} s.",
        "",
        "- doctor: `python -m orchestrator doctor -i INVENTORY --json` (full probe on every host, the master "
        "listening while the others connect, checks, output); the cluster's known_hosts lists all "
        f"{max(SCALE_SIZES)} hosts at both sizes",
        *([f"- doctor {baseline[0]}: the same command run from a checkout of commit {baseline[0]}, before this "
           "series' changes"] if baseline else []),
        f"- pdsh: `PDSH_SSH_ARGS='-F CLUSTER_SSH_CONFIG -x -l%u %h' pdsh -R ssh -f {SCALE_FANOUT} -w ADDR,... "
        "\"PYTHON -c 'import base64; exec(base64.b64decode(PROBE))'\"` (the same probe, `{\"full\": true}`, "
        "all hosts at once)",
        "- controller CPU: user + sys of the tool and its children (pdsh's ssh clients); hosts' sshd CPU: the "
        "hosts' sshd and everything their sessions ran (the probe's python); CPU floor: both together over this "
        f"machine's {os.cpu_count()} cores, which hosts and controller share",
        f"- load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{', '.join(f'{v:.2f}' for v in load_after)}",
        "", "### doctor vs pdsh", "", *scale_table(results), "",
        "### Where the time goes", "", *scale_growth(results), "",
        "### Every run", "", *scale_runs(results),
    ]
    options = f"--scale --rounds {rounds}" + (f" --baseline {baseline_rev}" if baseline_rev else "")
    command = f"flock /tmp/distrun-heavy.lock .venv/bin/python bench/doctor_bench.py {options} (as root)"
    path = write_section("doctor.md", SCALE_HEADING, command, body)
    print(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scale", action="store_true", help=f"the series on {SCALE_SIZES} hosts instead")
    parser.add_argument("--baseline", metavar="REV", help="with --scale: also run doctor as of commit REV")
    args = parser.parse_args()
    os.environ["DISTRUN_SSH_CONFIG"] = os.devnull
    os.environ.pop("SSH_AUTH_SOCK", None)
    tmp = Path(tempfile.mkdtemp(prefix="distrun-doctor-bench-"))
    if args.scale:
        scale_main(args.rounds, tmp, args.baseline)
        return
    load_before = os.getloadavg()
    with Cluster(max(SIZES)) as cluster:
        results = run_all(cluster, tmp, args.rounds)
        torch_import = torch_import_seconds(cluster, 3)
    load_after = os.getloadavg()
    body = [
        f"{args.rounds} alternating rounds per row (after one untimed run of each tool); wall time from start to "
        "exit of the whole command; medians. Both tools contact all hosts at once.",
        "",
        "- doctor: `python -m orchestrator doctor -i INVENTORY --json` (paramiko, one thread per host; full probe "
        "on every host, the master listening on 29500 while the others connect, checks, output)",
        "- pdsh: `PDSH_SSH_ARGS='-F CLUSTER_SSH_CONFIG -x -l%u %h' pdsh -R ssh -w ADDR,ADDR,... "
        "\"PYTHON -c 'import base64; exec(base64.b64decode(PROBE))'\"` where PROBE is "
        "orchestrator/remote/probe.py run with `{\"full\": true}` (one OpenSSH client per host, fanout 32)",
        "- hosts: network namespaces of this machine with their own OpenSSH sshd (tests/cluster/), ed25519 "
        "keys, strict host-key checking for both tools; hosts and tools share this machine's 2 cores",
        "- on these CPU-only hosts the full probe reads torch's version from its files; it imports torch "
        "(about 1.5 s of CPU) only on hosts with an NVIDIA GPU. For scale: pdsh running "
        f"`PYTHON -c 'import torch.distributed'` on all {max(SIZES)} hosts took "
        f"{', '.join(f'{v:.2f}' for v in torch_import)} s (median {median(torch_import):.2f} s): 16 imports "
        "share 2 cores here, while real hosts import in parallel on their own cores",
        "- doctor's own s: the `seconds` doctor reports (its work, without the interpreter's start-up); "
        "client CPU: user+sys of the tool and its children (pdsh's ssh clients), per run",
        f"- load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{', '.join(f'{v:.2f}' for v in load_after)}",
        "",
        "## doctor vs pdsh", "", *comparison(results), "",
        "## Every run", "", *every_run(results),
    ]
    path = write_results("doctor.md", "distrun doctor vs pdsh running the same probe",
                         ".venv/bin/python bench/doctor_bench.py (as root)", body, keep=[SCALE_HEADING])
    print(path.read_text())


if __name__ == "__main__":
    main()
