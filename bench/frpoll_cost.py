"""What a host's Flight Recorder poll costs a rank: the CPU the rank spends answering one fetch of
a full record (2000 entries, the size distrun sets), against the poll's period (every 5 s).

    .venv/bin/python bench/frpoll_cost.py [--fetches 20]

Two gloo ranks under torchrun fill their records with 3000 all_reduces and serve them on sockets
of their own (torch's worker_main, as distrun's worker entry does); the rank's CPU time is read
before and after the fetches. Writes its section of bench/results/shim.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from common import median, write_section

from orchestrator.remote.flightrec import fetch
from orchestrator.remote.frpoll import POLL_EVERY

RANK = """import os, time
import torch, torch.distributed as dist
from torch.distributed.elastic.control_plane import worker_main
folder = os.path.dirname(os.path.abspath(__file__))
os.environ["TORCH_WORKER_SERVER_SOCKET"] = os.path.join(folder, f"rank{os.environ['RANK']}.sock")
with worker_main():
    dist.init_process_group("gloo")
    t = torch.ones(1000)
    for _ in range(3000):
        dist.all_reduce(t)
    open(os.path.join(folder, f"ready{os.environ['RANK']}"), "w").close()
    time.sleep(120)
"""


def rank_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetches", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "rank.py").write_text(RANK)
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
        ranks = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                  "2", str(folder / "rank.py")], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            while not (folder / "ready0").exists():
                time.sleep(0.5)
            served = fetch(str(folder / "rank0.sock"))
            entries = len(served["flight"]["entries"])  # type: ignore[index]
            pid = next(p.pid for p in psutil.Process(ranks.pid).children(recursive=True)
                       if p.environ().get("RANK") == "0")
            walls, cpus = [], []
            for _ in range(args.fetches):
                before, began = rank_cpu(pid), time.perf_counter()
                fetch(str(folder / "rank0.sock"))
                walls.append(time.perf_counter() - began)
                cpus.append(rank_cpu(pid) - before)
        finally:
            os.killpg(ranks.pid, 9)
            ranks.wait()
    cpu = sum(cpus) / len(cpus)
    body = [f"{args.fetches} fetches of rank 0's record ({entries} entries) while it idles; load average "
            f"{os.getloadavg()[0]:.1f}.", "",
            f"- the rank's CPU per fetch (mean): {cpu * 1e3:.1f} ms, {cpu / POLL_EVERY * 100:.2f} % of one core at "
            f"one fetch every {POLL_EVERY:g} s",
            f"- a fetch's wall time (median): {median(walls) * 1e3:.1f} ms, in the supervisor's poll thread, never "
            "in the rank's training thread"]
    command = f".venv/bin/python bench/frpoll_cost.py --fetches {args.fetches}"
    print(write_section("shim.md", "The Flight Recorder poll's cost in a rank", command, body))
    print("\n".join(body))


if __name__ == "__main__":
    main()
