"""What every rank leaves as it ends (issue 45 item 1): the worker entry writes its rank's own Flight
Recorder record beside its socket as the program ends, the host's poller sends it at once as a `final`
event, and a finished job's positions are those, every rank at the same last collective, its rate the
whole run's. Two real gloo ranks under the real entry and the real poller."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator import remote
from orchestrator.diagnose.progress import FlightProgress
from orchestrator.remote import frpoll
from orchestrator.remote.provenance import own_roots

ENTRY = str(Path(remote.__file__).parent / remote.WORKER_PROGRAM)
SCRIPT = """\
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=int(sys.argv[2]), world_size=2)
for step in range(40):
    time.sleep(0.05)
    dist.all_reduce(torch.ones(10))
    dist.all_reduce(torch.ones(10))
"""


def test_every_ranks_last_position_comes_from_what_it_left_as_it_ended(tmp_path: Path) -> None:
    sockets = Path("/tmp") / f"dwf-{os.getpid()}"
    sockets.mkdir(mode=0o700)
    script = tmp_path / "steps.py"
    script.write_text(SCRIPT)
    got: list[dict[str, Any]] = []
    done = threading.Event()
    poller = threading.Thread(target=frpoll.run, args=(str(sockets), own_roots(), lambda _k, **f: got.append(f),
                                                       done, 2.0), daemon=True)
    poller.start()
    env = {**os.environ, "DISTRUN_WORKER_SOCKETS": str(sockets), "TORCH_FR_BUFFER_SIZE": "1000"}
    ranks = [subprocess.Popen([sys.executable, "-u", ENTRY, str(script), str(tmp_path / "rdzv"), str(rank)],
                              env={**env, "RANK": str(rank)}, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        codes = [rank.wait(timeout=120) for rank in ranks]
        deadline = time.monotonic() + 10
        while sum(len(e.get("final") or ()) for e in got) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        done.set()
        poller.join(5)
        for rank in ranks:
            rank.kill()
        for leftover in sockets.iterdir():
            leftover.unlink()
        sockets.rmdir()
    assert codes == [0, 0], [rank.stderr.read() for rank in ranks if rank.stderr]
    finals = {rank: e["ranks"][str(rank)]["done"] for e in got for rank in e.get("final") or ()}
    assert finals == {0: 80, 1: 80}
    progress = FlightProgress(world_size=2)
    for fields in got:
        progress.observe(fields, now=time.time())
    ended = progress.to_dict(ended=True)
    assert ended["ranks"] == {"0": 80, "1": 80}
    assert 0 < ended["seconds"] < 60 and abs(ended["collectives_per_s"] * ended["seconds"] - 80) < 4
    assert ended["step"]["collectives"] == 2


NCCL_SCRIPT = """\
import json, torch
from torch._C._distributed_c10d import _register_handler

def nccl_record(request, response):  # NCCL's record under its handler, as a CUDA build serves it
    entry = {"collective_seq_id": 7, "profiling_name": "nccl:all_reduce", "state": "completed",
             "time_created_ns": 1000, "time_discovered_completed_ns": 2000, "process_group": ["0", "default_pg"]}
    response.set_content(json.dumps({"version": "2.10", "entries": [entry]}), "application/json")

_register_handler("dump_nccl_trace_json", nccl_record)
"""


def test_a_rank_on_nccl_leaves_nccls_record_as_it_ends(tmp_path: Path) -> None:
    """On NCCL, torch's fr_trace_json holds no collective (a lent H200, torch 2.11): the record a rank
    leaves is NCCL's, else a GPU job's summary said `0 collectives completed` for a job that ran 1600."""
    sockets = Path("/tmp") / f"dwn-{os.getpid()}"
    sockets.mkdir(mode=0o700)
    script = tmp_path / "nccl.py"
    script.write_text(NCCL_SCRIPT)
    env = {**os.environ, "DISTRUN_WORKER_SOCKETS": str(sockets), "TORCH_FR_BUFFER_SIZE": "100", "RANK": "0"}
    try:
        ran = subprocess.run([sys.executable, "-u", ENTRY, str(script)], env=env, capture_output=True, text=True,
                             timeout=120)
        left = (sockets / "rank0.last.json").read_text() if (sockets / "rank0.last.json").exists() else ""
    finally:
        for leftover in sockets.iterdir():
            leftover.unlink()
        sockets.rmdir()
    assert ran.returncode == 0, ran.stderr
    assert '"nccl:all_reduce"' in left, left[:300]
