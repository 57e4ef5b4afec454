"""`distrun exec` vs `pdsh -R ssh` on 2, 4, 8 and 16 hosts of a namespace test cluster.

Both run the same commands on the same hosts (real sshd processes, one per network
namespace, tests/cluster/) with the same key and known_hosts: `true`, and a small probe
that starts python on every host. Alternating runs, start-to-exit wall time, medians and
ratios, written to bench/results/exec.md. Goals: distrun within 1.2x of pdsh at every
size, and flat: 16 hosts take less than twice what 2 hosts take.

Besides wall time, each run's CPU time is recorded on both sides: the tool's own (with
its children: pdsh's ssh processes) and the hosts' sshd (every session's processes,
collected from the sshd listeners). The hosts share this machine's cores with the tool.

`--scale` runs the other series instead: `true` on 64 and 244 hosts (the harness's
largest cluster), pdsh with a fan-out of 256 so that both tools contact every host at
once, and the controller's user and sys CPU apart. Goals at 244 hosts: distrun at most
0.5x pdsh, and its CPU growing no faster than the number of hosts. `--baseline REV`
adds distrun as it was at commit REV to the alternation. It replaces the "At scale"
section of exec.md and keeps the rest (and the other series keeps it).

Needs root, and the machine to itself (take the shared lock):
    flock /work/locks/heavy.lock .venv/bin/python bench/exec_bench.py [--rounds 7] [--scale [--baseline REV]]
"""

from __future__ import annotations

import argparse
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
SCALE_RATIO_GOAL = 0.5
SCALE_HEADING = "At scale: 64 and 244 hosts"
TOOLS = ("pdsh", "distrun")
COMMANDS = {
    "true": ["true"],
    "probe": ["python3", "-c", "import platform;print(platform.node())"],
}
SETTLE = 0.3  # after a run, time for the hosts' sshd to reap their sessions before counting CPU


@dataclass
class Cell:
    """The runs of one tool for one command on one cluster size."""

    wall: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    client_user: list[float] = field(default_factory=list)
    client_sys: list[float] = field(default_factory=list)
    sshd_cpu: list[float] = field(default_factory=list)


def measured(argv: list[str], env: dict[str, str], listeners: list[int], cell: Cell,
             cwd: Path | None = None) -> Callable[[], float]:
    """A run of `argv` (in `cwd`) that records wall time and both sides' CPU in `cell`; fails if the command fails."""
    def run() -> float:
        (user, system), server = children_cpu(), sshd_cpu(listeners)
        began = time.perf_counter()
        subprocess.run(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True, cwd=cwd)
        wall = time.perf_counter() - began
        time.sleep(SETTLE)
        user_after, system_after = children_cpu()
        cell.wall.append(wall)
        cell.client_user.append(user_after - user)
        cell.client_sys.append(system_after - system)
        cell.client_cpu.append(cell.client_user[-1] + cell.client_sys[-1])
        cell.sshd_cpu.append(sshd_cpu(listeners) - server)
        return wall
    return run


def inventory(base: Path, size: int, tmp: Path) -> Path:
    """The cluster's inventory cut to its first `size` nodes."""
    doc = yaml.safe_load(base.read_text())
    doc["nodes"] = doc["nodes"][:size]
    path = tmp / f"inventory-{size}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def commands(addrs: list[str], inv: Path, ssh_config: Path, argv: list[str],
             fanout: int | None = None) -> dict[str, tuple[list[str], dict]]:
    """The exact command lines, with their extra environment, for each tool (pdsh's fan-out: its default, 32)."""
    pdsh = ["pdsh", "-R", "ssh", *(["-f", str(fanout)] if fanout else []), "-w", ",".join(addrs), shlex.join(argv)]
    distrun = [sys.executable, "-m", "orchestrator", "exec", "-i", str(inv), "--all", "--", *argv]
    return {"pdsh": (pdsh, {"PDSH_SSH_ARGS": f"-F {ssh_config} -x -l%u %h"}), "distrun": (distrun, {})}


Results = dict[tuple[str, int], dict[str, Cell]]


def comparison(results: Results) -> list[str]:
    rows = ["| command | hosts | pdsh s | distrun s | distrun / pdsh | within 1.2x | best of runs: pdsh / distrun s "
            "(ratio) | client CPU s: pdsh / distrun | sshd CPU s: pdsh / distrun |",
            "|---|---|---|---|---|---|---|---|---|"]
    for (command, size), cells in results.items():
        pdsh, ours = cells["pdsh"], cells["distrun"]
        ratio = median(ours.wall) / median(pdsh.wall)
        rows.append(
            f"| `{command}` | {size} | {median(pdsh.wall):.3f} | {median(ours.wall):.3f} | {ratio:.2f} | "
            f"{'yes' if ratio <= 1.2 else 'NO'} | {min(pdsh.wall):.3f} / {min(ours.wall):.3f} "
            f"({min(ours.wall) / min(pdsh.wall):.2f}) | "
            f"{median(pdsh.client_cpu):.2f} / {median(ours.client_cpu):.2f} | "
            f"{median(pdsh.sshd_cpu):.2f} / {median(ours.sshd_cpu):.2f} |"
        )
    return rows


def flatness(results: Results) -> list[str]:
    rows = ["| command | tool | 2 hosts s | 16 hosts s | 16 / 2 | under 2x | best of runs: 2 / 16 hosts s (ratio) |",
            "|---|---|---|---|---|---|---|"]
    for command in COMMANDS:
        for tool in TOOLS:
            two, sixteen = results[(command, 2)][tool].wall, results[(command, 16)][tool].wall
            ratio = median(sixteen) / median(two)
            rows.append(f"| `{command}` | {tool} | {median(two):.3f} | {median(sixteen):.3f} | {ratio:.2f} | "
                        f"{'yes' if ratio < 2 else 'NO'} | {min(two):.3f} / {min(sixteen):.3f} "
                        f"({min(sixteen) / min(two):.2f}) |")
    return rows


def goals(results: Results) -> list[str]:
    """The two goals, met or not, by medians and by best runs."""
    def ratio(command: str, size: int, pick: Callable[[list[float]], float]) -> float:
        cells = results[(command, size)]
        return pick(cells["distrun"].wall) / pick(cells["pdsh"].wall)

    def flat(command: str, pick: Callable[[list[float]], float]) -> float:
        return pick(results[(command, 16)]["distrun"].wall) / pick(results[(command, 2)]["distrun"].wall)

    lines = []
    for name, pick in (("medians", median), ("best runs", min)):
        close = [key for key in results if ratio(*key, pick) <= 1.2]
        flats = ", ".join(f"`{command}` {flat(command, pick):.2f}x" for command in COMMANDS)
        lines.append(f"- by {name}: within 1.2x of pdsh in {len(close)} of {len(results)} cells; "
                     f"16 hosts / 2 hosts for distrun: {flats} (goal: under 2x)")
    return lines


def spread(results: Results) -> float:
    return max(max(cell.wall) / min(cell.wall) for cells in results.values() for cell in cells.values())


def every_run(results: Results) -> list[str]:
    rows = ["| command | hosts | tool | wall s, in order |", "|---|---|---|---|"]
    for (command, size), cells in results.items():
        for tool, cell in cells.items():
            rows.append(f"| `{command}` | {size} | {tool} | {', '.join(f'{v:.3f}' for v in cell.wall)} |")
    return rows


def run_all(cluster: object, tmp: Path, rounds: int) -> Results:
    """Every command on every size, the tools alternating within each round."""
    base = cluster.write_inventory(tmp / "inventory.yaml")
    listeners = sshd_listeners(cluster.state_dir)
    results: Results = {}
    for command, argv in COMMANDS.items():
        for size in SIZES:
            lines = commands([cluster.addr(i) for i in range(size)], inventory(base, size, tmp),
                             cluster.ssh_config, argv)
            for tool_argv, env in lines.values():
                measured(tool_argv, env, listeners, Cell())()  # one untimed run each: caches, sshd warm
            cells = {tool: Cell() for tool in TOOLS}
            alternate({tool: measured(*lines[tool], listeners, cells[tool]) for tool in TOOLS}, rounds)
            results[(command, size)] = cells
            print(command, size, {tool: f"{median(cell.wall):.3f}" for tool, cell in cells.items()}, flush=True)
    return results


ScaleResults = dict[int, dict[str, Cell]]
Run = tuple[list[str], dict[str, str], Path | None]  # argv, extra environment, working directory


def run_scale(cluster: object, tmp: Path, rounds: int, baseline: tuple[str, Path] | None) -> ScaleResults:
    """`true` on each scale size, pdsh at fan-out 256, the tools alternating within each round."""
    base = cluster.write_inventory(tmp / "inventory.yaml")
    listeners = sshd_listeners(cluster.state_dir)
    results: ScaleResults = {}
    for size in SCALE_SIZES:
        lines = commands([cluster.addr(i) for i in range(size)], inventory(base, size, tmp), cluster.ssh_config,
                         COMMANDS["true"], fanout=SCALE_FANOUT)
        runs: dict[str, Run] = {tool: (*lines[tool], None) for tool in TOOLS}
        if baseline is not None:
            # `python -m` imports the package from the working directory: the old checkout's.
            argv, env = lines["distrun"]
            runs[f"distrun {baseline[0]}"] = (before_all_flag(argv, baseline[1]), env, baseline[1])
        for argv, env, cwd in runs.values():
            measured(argv, env, listeners, Cell(), cwd)()
        cells = {tool: Cell() for tool in runs}
        alternate({tool: measured(argv, env, listeners, cells[tool], cwd)
                   for tool, (argv, env, cwd) in runs.items()}, rounds)
        results[size] = cells
        print("true", size, {tool: f"{median(cell.wall):.3f}" for tool, cell in cells.items()}, flush=True)
    return results


def scale_table(results: ScaleResults) -> list[str]:
    rows = [f"| hosts | tool | wall s | best s | / pdsh | goal at {max(SCALE_SIZES)}: at most {SCALE_RATIO_GOAL}x pdsh "
            "| controller CPU s (user + sys) | hosts' sshd CPU s |", "|---|---|---|---|---|---|---|---|"]
    for size, cells in results.items():
        pdsh = median(cells["pdsh"].wall)
        for tool, cell in cells.items():
            ratio = median(cell.wall) / pdsh
            goal = "" if tool == "pdsh" or size != max(SCALE_SIZES) else ("yes" if ratio <= SCALE_RATIO_GOAL else "NO")
            rows.append(f"| {size} | {tool} | {median(cell.wall):.2f} | {min(cell.wall):.2f} | {ratio:.2f} | {goal} | "
                        f"{cpu_split(cell)} | {median(cell.sshd_cpu):.2f} |")
    return rows


def cpu_split(cell: Cell) -> str:
    return f"{median(cell.client_user):.2f} + {median(cell.client_sys):.2f} = {median(cell.client_cpu):.2f}"


def scale_growth(results: ScaleResults) -> list[str]:
    """How each tool's controller CPU grew from the smallest to the largest size, against the hosts."""
    small, large = SCALE_SIZES[0], SCALE_SIZES[-1]
    hosts = large / small
    lines = []
    for tool in results[large]:
        grew = median(results[large][tool].client_cpu) / median(results[small][tool].client_cpu)
        verdict = "no faster than" if grew <= hosts else "FASTER than"
        lines.append(f"- {tool}: controller CPU x{grew:.2f} from {small} to {large} hosts (hosts x{hosts:.2f}): "
                     f"{verdict} the number of hosts")
    return lines


def scale_runs(results: ScaleResults) -> list[str]:
    rows = ["| hosts | tool | wall s, in order | controller CPU s, in order |", "|---|---|---|---|"]
    for size, cells in results.items():
        rows += [f"| {size} | {tool} | {', '.join(f'{v:.2f}' for v in cell.wall)} | "
                 f"{', '.join(f'{v:.2f}' for v in cell.client_cpu)} |" for tool, cell in cells.items()]
    return rows


def scale_main(rounds: int, tmp: Path, baseline_rev: str | None) -> None:
    baseline = (baseline_rev, checkout(baseline_rev, tmp)) if baseline_rev else None
    load_before = os.getloadavg()
    with Cluster(max(SCALE_SIZES)) as cluster:
        bringup = cluster.bringup_seconds
        results = run_scale(cluster, tmp, rounds, baseline)
    load_after = os.getloadavg()
    body = [
        f"{rounds} alternating rounds per size (after one untimed run of each tool), `true` on every host; wall "
        "time from start to exit; medians. Taken while holding the shared heavy lock (/work/locks/heavy.lock): "
        f"no other benchmark or cluster test ran. The {max(SCALE_SIZES)}-host cluster came up in {bringup:.1f} s.",
        "",
        "- distrun: `python -m orchestrator exec -i INVENTORY -- true` (paramiko, one thread per connection); "
        "the inventory names every host's key in the cluster's known_hosts, which lists all "
        f"{max(SCALE_SIZES)} hosts at both sizes",
        *([f"- distrun {baseline[0]}: the same command run from a checkout of commit {baseline[0]}, before this "
           "series' changes"] if baseline else []),
        f"- pdsh: `PDSH_SSH_ARGS='-F CLUSTER_SSH_CONFIG -x -l%u %h' pdsh -R ssh -f {SCALE_FANOUT} -w ADDR,... true` "
        "(one OpenSSH client per host, all at once)",
        "- controller CPU: user + sys of the tool and its children (pdsh's ssh clients); hosts' sshd CPU: the "
        "hosts' sshd and their sessions. Hosts and tools share this machine's 2 cores",
        f"- load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{', '.join(f'{v:.2f}' for v in load_after)}",
        "", "### distrun vs pdsh", "", *scale_table(results), "",
        "### Controller CPU against the number of hosts", "", *scale_growth(results), "",
        "### Every run", "", *scale_runs(results),
    ]
    options = f"--scale --rounds {rounds}" + (f" --baseline {baseline_rev}" if baseline_rev else "")
    command = f"flock /work/locks/heavy.lock .venv/bin/python bench/exec_bench.py {options} (as root)"
    path = write_section("exec.md", SCALE_HEADING, command, body)
    print(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scale", action="store_true", help=f"the series on {SCALE_SIZES} hosts instead")
    parser.add_argument("--baseline", metavar="REV", help="with --scale: also run distrun as of commit REV")
    args = parser.parse_args()
    os.environ["DISTRUN_SSH_CONFIG"] = os.devnull
    os.environ.pop("SSH_AUTH_SOCK", None)
    tmp = Path(tempfile.mkdtemp(prefix="distrun-exec-bench-"))
    if args.scale:
        scale_main(args.rounds, tmp, args.baseline)
        return
    load_before = os.getloadavg()
    with Cluster(max(SIZES)) as cluster:
        results = run_all(cluster, tmp, args.rounds)
    load_after = os.getloadavg()
    body = [
        f"{args.rounds} alternating rounds per row (after one untimed run of each tool); wall time from start to "
        "exit of the whole command; medians, and the best run (least disturbed by other work on the machine). "
        "Both tools contact all hosts at once.",
        "",
        "- distrun: `python -m orchestrator exec -i INVENTORY -- COMMAND` (paramiko, one thread per host)",
        "- pdsh: `PDSH_SSH_ARGS='-F CLUSTER_SSH_CONFIG -x -l%u %h' pdsh -R ssh -w ADDR,ADDR,... 'COMMAND'` "
        "(one OpenSSH client process per host, default fanout 32)",
        "- hosts: network namespaces of this machine with their own OpenSSH sshd (tests/cluster/), ed25519 "
        "keys, strict host-key checking for both tools; they share this machine's cores with the tools",
        f"- `probe` is `{shlex.join(COMMANDS['probe'])}`",
        "- client CPU: the tool's user+sys time with its children (pdsh's ssh processes); sshd CPU: what the "
        "hosts' sshd and the sessions they ran used, both per run (median)",
        f"- load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{', '.join(f'{v:.2f}' for v in load_after)}",
        "",
        "## Goals", "", *goals(results), "",
        "The hosts' sshd run on the same cores as the tool being measured, and other work shared the machine "
        f"(load average above): runs of one tool in one row differed by up to {spread(results):.1f}x "
        "(slowest / fastest). Alternating the tools spreads that noise over both.",
        "",
        "## distrun vs pdsh", "", *comparison(results), "",
        "## 2 hosts vs 16 hosts", "", *flatness(results), "",
        "## Every run", "", *every_run(results),
    ]
    command = f".venv/bin/python bench/exec_bench.py --rounds {args.rounds}  (as root)"
    path = write_results("exec.md", "distrun exec vs pdsh -R ssh", command, body, keep=[SCALE_HEADING])
    print(path.read_text())


if __name__ == "__main__":
    main()
