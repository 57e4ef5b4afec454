"""What a rank's Flight Recorder holds on NCCL, read as distrun reads it (on a lent GPU).

One rank under torchrun and distrun's worker entry runs all-reduces on CUDA with NCCL; while it
waits at the end, this script fetches its record over the rank's socket (remote/flightrec.py) and
writes which timing fields the entries carry: the trace draws a collective as a slice from its
entry to its completion, and gloo records no completion (time_discovered_completed_ns is 0 there).
Run twice, without and with TORCH_NCCL_ENABLE_TIMING=1 (duration_ms needs CUDA events).

    python bench/gpu_flight.py OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.remote.flightrec import fetch, unix_http_connection  # noqa: E402
from orchestrator.remote.frpoll import reduce  # noqa: E402

WORKER = REPO / "orchestrator" / "remote" / "distrun_worker.py"
FIELDS = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms", "state")


def rank_program(ready: str) -> None:
    """The rank: 200 all-reduces of 4 MiB on CUDA, then it waits for the fetch."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(200):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    Path(ready).write_text("ready")
    time.sleep(6)
    dist.destroy_process_group()


def handler(path: str, name: str) -> object:
    """Another handler's JSON answer on the rank's socket (or why there is none)."""
    connection = unix_http_connection()(path, 10)
    try:
        connection.request("POST", f"/handler/{name}")
        response = connection.getresponse()
        body = response.read()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    try:
        return json.loads(body) if response.status == 200 else f"HTTP {response.status}: {body[:300]!r}"
    except ValueError:
        return f"not JSON: {body[:300]!r}"


def one_run(timing: bool) -> dict[str, Any]:
    """Start the rank, fetch its record once it is done, and keep what its entries carry."""
    with tempfile.TemporaryDirectory() as tmp:
        ready, sockets = os.path.join(tmp, "ready"), os.path.join(tmp, "sock")
        os.mkdir(sockets, 0o700)
        env = {**os.environ, "DISTRUN_WORKER_SOCKETS": sockets, "TORCH_FR_BUFFER_SIZE": "2000",
               "TORCH_NCCL_ENABLE_TIMING": "1" if timing else "0"}
        torchrun = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     "--nproc-per-node", "1", str(WORKER), __file__, "--rank", ready], env=env)
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) and time.monotonic() < deadline and torchrun.poll() is None:
            time.sleep(0.2)
        got = fetch(os.path.join(sockets, "rank0.sock"), timeout=10)
        nccl = handler(os.path.join(sockets, "rank0.sock"), "dump_nccl_trace_json?includecollectives=true")
        rc = torchrun.wait(timeout=120)
    dump = got.get("flight")
    if isinstance(dump, dict) and not dump.get("entries") and isinstance(nccl, dict):
        dump = {**nccl, "handler": "dump_nccl_trace_json"}
    entries = dump.get("entries", []) if isinstance(dump, dict) else []
    return {"timing": timing, "torchrun_rc": rc, "error": got.get("flight_error"), "entries": len(entries),
            "keys": sorted(entries[0]) if entries else [],
            "first": [{k: e.get(k) for k in FIELDS} for e in entries[:3]],
            "with_completion": sum(1 for e in entries if e.get("time_discovered_completed_ns")),
            "with_duration": sum(1 for e in entries if e.get("duration_ms")),
            "reduced_tail": reduce(dump, 0)["c"][-3:] if isinstance(dump, dict) else None,
            "version": dump.get("version") if isinstance(dump, dict) else None,
            "handler": dump.get("handler", "fr_trace_json") if isinstance(dump, dict) else None,
            "nccl_answer": nccl if not isinstance(nccl, dict) else sorted(nccl)}


def main() -> None:
    if sys.argv[1:2] == ["--rank"]:
        rank_program(sys.argv[2])
        return
    runs = [one_run(timing=False), one_run(timing=True)]
    held = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()
    result = {"runs": runs, "compute_apps_after": held}
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
