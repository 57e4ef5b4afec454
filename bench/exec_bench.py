"""`distrun exec` vs `pdsh -R ssh` on 2, 4, 8 and 16 hosts of a namespace test cluster.

Both run the same commands on the same hosts (real sshd processes, one per network
namespace, tests/cluster/) with the same key and known_hosts: `true`, and a small probe
that starts python on every host. Alternating runs, start-to-exit wall time, medians and
ratios, written to bench/results/exec.md. Goals: distrun within 1.2x of pdsh at every
size, and flat: 16 hosts take less than twice what 2 hosts take.

Besides wall time, each run's CPU time is recorded on both sides: the tool's own (with
its children: pdsh's ssh processes) and the hosts' sshd (every session's processes,
collected from the sshd listeners). The hosts share this machine's cores with the tool.

Needs root:  .venv/bin/python bench/exec_bench.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from common import REPO, alternate, median, write_results

SIZES = (2, 4, 8, 16)
TOOLS = ("pdsh", "distrun")
COMMANDS = {
    "true": ["true"],
    "probe": ["python3", "-c", "import platform;print(platform.node())"],
}
SETTLE = 0.3  # after a run, time for the hosts' sshd to reap their sessions before counting CPU
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Cell:
    """The runs of one tool for one command on one cluster size."""

    wall: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    sshd_cpu: list[float] = field(default_factory=list)


def sshd_cpu(listeners: list[int]) -> float:
    """CPU seconds used so far by the sshd listeners and every session they reaped."""
    total = 0
    for pid in listeners:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(argv: list[str], env: dict[str, str], listeners: list[int], cell: Cell) -> Callable[[], float]:
    """A run of `argv` that records wall time and both sides' CPU in `cell`; fails if the command fails."""
    def run() -> float:
        client, server = children_cpu(), sshd_cpu(listeners)
        began = time.perf_counter()
        subprocess.run(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True)
        wall = time.perf_counter() - began
        time.sleep(SETTLE)
        cell.wall.append(wall)
        cell.client_cpu.append(children_cpu() - client)
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


def commands(addrs: list[str], inv: Path, ssh_config: Path, argv: list[str]) -> dict[str, tuple[list[str], dict]]:
    """The exact command lines, with their extra environment, for each tool."""
    pdsh = ["pdsh", "-R", "ssh", "-w", ",".join(addrs), shlex.join(argv)]
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
    found = subprocess.run(["pgrep", "-f", f"sshd -D -f {cluster.state_dir}/"], capture_output=True, text=True)
    listeners = [int(pid) for pid in found.stdout.split()]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.cluster.harness import Cluster

    os.environ["DISTRUN_SSH_CONFIG"] = os.devnull
    os.environ.pop("SSH_AUTH_SOCK", None)
    tmp = Path(tempfile.mkdtemp(prefix="distrun-exec-bench-"))
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
    path = write_results("exec.md", "distrun exec vs pdsh -R ssh", command, body)
    print(path.read_text())


if __name__ == "__main__":
    main()
