"""Ranks that behave as real programs do, on the 3-host lab (3 x 2 ranks, gloo): a rank that serves
something else than a Flight Recorder record on its socket, a rank with one more thread, a rank
stopped from outside. Each is held to the fault matrix's invariants (README.md): the controller back
within the bound with exit 1 and the job `failed` (never `lost`), no traceback, the root cause the
stuck rank and its host, nothing of the job left on any host.

Each job has `stall_after: 6` and `hang_timeout: 20`: the stall look (which a bad record killed as
`lost`) and the hang's diagnosis both run."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tests.cluster.harness import Cluster
from tests.cluster.test_flight_straggler_cluster import signal_all
from tests.cluster.test_launch_cluster import job_procs, output, record, start, wait_for_line, write_job
from tests.helpers import unique_job_id, wait_for

WORKER = Path(__file__).parents[1] / "cluster" / "jobs" / "odd_ranks_worker.py"
TIMING = "stall_after: 6\nhang_timeout: 20\n"
BOUND = 20 + 40  # hang_timeout, then the look at 6 ranks, the stop grace and a loaded machine's margin
CLEAN = 10  # seconds after the controller returned by which no process of the job is left


def run_to_verdict(cluster: Cluster, tmp_path: Path, name: str, args: list[str], fault=None) -> tuple[dict, str, Path]:
    """Launch, apply `fault` once every rank stepped, wait for the controller; its record, output and job dir."""
    home, job_id = tmp_path / "home", unique_job_id(name)
    job = write_job(tmp_path, name, args, extra=TIMING, script=WORKER)
    proc = start(job, cluster.write_inventory(tmp_path / "inv.yaml"), home, job_id, "--no-live")
    try:
        wait_for_line(home, job_id, "step 5", timeout=180)
        began = time.monotonic()
        if fault is not None:
            fault(job_id)
        proc.wait(timeout=BOUND + 120)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
    out = output(home, job_id)
    assert proc.returncode == 1, out[-3000:]
    assert took <= BOUND + 30, f"the controller came back {took:.0f} s after the fault"  # the fault waits for step 30
    assert "orchestrator/diagnose" not in out and "AttributeError" not in out, out[-3000:]  # no controller traceback
    assert wait_for(lambda: not any(job_procs(cluster, job_id).values()), CLEAN), job_procs(cluster, job_id)
    rec = record(home, job_id)
    assert rec["state"] == "failed", rec["state"]
    return rec, out, home / "jobs" / job_id


def test_a_rank_serving_garbage_and_one_with_a_logger_thread_leave_the_stuck_rank_named(cluster3, tmp_path):
    rec, out, kept = run_to_verdict(cluster3, tmp_path, "oddranks", ["--hang-rank", "3", "--hang-step", "30",
                                                                    "--logger-rank", "0", "--garbage-rank", "2"])
    root = rec["failures"][0]
    assert (root["kind"], root["host"], root["rank"]) == ("hang", "node1", 3), root
    assert root["reason"].endswith("rank 3 on node1 is not where the others wait: it has not entered collective "
                                   "#31 gloo:all_reduce (Flight Recorder)"), root["reason"]
    assert "rank 2: no Flight Recorder dump (the answer is not a record: entry 0 is 1, not an object)" in out
    stalls = [a["message"] for a in rec["alerts"] if a["rule"] == "stall"]  # alerts are kept as data
    assert stalls and all("rank 3 on node1 is not where the others wait" in a for a in stalls), rec["alerts"]
    (lag,) = root["flight"]
    assert (lag["behind"], lag["silent"], lag["seq"]) == ([3], [2], 31), lag
    assert json.loads((kept / "flight" / "flight.json").read_text())["errors"]["2"].startswith(
        "the answer is not a record")
    assert "thread logger:" in (kept / "stacks" / "rank0.txt").read_text()  # taken, and made no rank odd


def test_a_rank_stopped_from_outside_is_named_and_its_neighbours_are_not(cluster3, tmp_path):
    stopped: list[int] = []

    def stop_rank_3(job_id: str) -> None:
        stopped.extend(p.pid for p in cluster3.processes_with_env(1, "DISTRUN_JOB_ID", job_id)
                       if p.environ().get("RANK") == "3")
        assert len(stopped) == 1, stopped
        signal_all(stopped, signal.SIGSTOP)

    try:
        rec, out, kept = run_to_verdict(cluster3, tmp_path, "stoprank", ["--step-time", "0.02"], stop_rank_3)
    finally:
        signal_all(stopped, signal.SIGCONT)
    root = rec["failures"][0]
    assert (root["kind"], root["host"], root["rank"]) == ("hang", "node1", 3), root
    assert "rank 3 on node1 is not where the others wait: it gave no Flight Recorder record" in root["reason"]
    (lag,) = root["flight"]
    assert (lag["behind"], lag["silent"]) == ([], [3]), lag
    assert "have not entered" not in out and "has not entered" not in out, out[-3000:]
    stack = (kept / "stacks" / "rank3.txt").read_text()
    assert "stopped: state T in /proc/" in stack and "py-spy cannot read a stopped process" in stack, stack
    assert "waitpid" not in stack
    print("MEASURED a SIGSTOPped rank:", next(line for line in out.splitlines() if "flight recorder:" in line))
