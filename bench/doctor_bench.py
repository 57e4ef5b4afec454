"""`distrun doctor` vs `pdsh -R ssh` running the same probe, on 2, 4, 8 and 16 hosts.

The hosts are a namespace test cluster (tests/cluster/: one sshd per network namespace,
ed25519 keys, strict host-key checking for both tools). pdsh runs doctor's own probe
(orchestrator/remote/probe.py, `full` facts, the same python) on every host at once;
doctor does that and the rest of its work: the master listening on the rendezvous port
while the others connect, name resolution, the checks and the table. Alternating runs,
start-to-exit wall time of the whole command, medians and ratios, written to
bench/results/doctor.md. Goals: doctor within 1.3x of pdsh, and under 3 s on 16 hosts.

Needs root:  .venv/bin/python bench/doctor_bench.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import base64
import json
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
TOOLS = ("pdsh", "doctor")
RATIO_GOAL = 1.3
SECONDS_GOAL = 3.0
SETTLE = 0.3  # after a run, time for the hosts' sshd to reap their sessions


@dataclass
class Cell:
    """The runs of one tool on one cluster size."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    inside: list[float] = field(default_factory=list)  # doctor's own `seconds` (no interpreter start-up)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def probe_command(python: str, workdir: Path) -> str:
    """The shell line pdsh runs on each host: doctor's probe, `full` facts, from argv."""
    options = json.dumps({"full": True, "workdir": str(workdir)}).encode()
    source = (f"{(REPO / 'orchestrator' / 'remote' / 'probe.py').read_text()}\n"
              f"import io\nsys.stdin = io.TextIOWrapper(io.BytesIO({options!r} + b'\\n'))\nmain([])\n")
    encoded = base64.b64encode(source.encode()).decode()
    return shlex.join([python, "-c", f"import base64; exec(base64.b64decode('{encoded}'))"])


def commands(addrs: list[str], inv: Path, ssh_config: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The exact command lines, with their extra environment, for each tool."""
    pdsh = ["pdsh", "-R", "ssh", "-w", ",".join(addrs), probe_command(sys.executable, REPO)]
    doctor = [sys.executable, "-m", "orchestrator", "doctor", "-i", str(inv), "--all", "--json"]
    return {"pdsh": (pdsh, {"PDSH_SSH_ARGS": f"-F {ssh_config} -x -l%u %h"}), "doctor": (doctor, {})}


def measured(tool: str, argv: list[str], env: dict[str, str], cell: Cell) -> Callable[[], float]:
    """A run of `argv` recording wall and client CPU time in `cell`; fails if the command fails."""
    def run() -> float:
        cpu = children_cpu()
        began = time.perf_counter()
        done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"{tool} exited {done.returncode}: {done.stderr[-2000:] or done.stdout[-2000:]}")
        time.sleep(SETTLE)
        cell.wall.append(wall)
        cell.cpu.append(children_cpu() - cpu)
        if tool == "doctor":
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.cluster.harness import Cluster

    os.environ["DISTRUN_SSH_CONFIG"] = os.devnull
    os.environ.pop("SSH_AUTH_SOCK", None)
    tmp = Path(tempfile.mkdtemp(prefix="distrun-doctor-bench-"))
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
                         ".venv/bin/python bench/doctor_bench.py (as root)", body)
    print(path.read_text())


if __name__ == "__main__":
    main()
