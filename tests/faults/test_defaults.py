"""With distrun's default timing, a cut link ends the job everywhere quickly (issue 13: within 20 s, goal 10 s)."""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.spec.model import DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_STOP_GRACE
from tests.cluster.harness import Cluster
from tests.faults.scene import Controller, job_processes, wait_for, write_job

CUT_BOUND = 20.0


def test_with_default_timing_a_cut_link_leaves_the_others_clean_and_the_controller_back_within_20_s(
        cluster3: Cluster, tmp_path: Path) -> None:
    job = write_job(tmp_path / "job.yaml", "defaults", [], heartbeat=None, grace=None)
    controller = Controller.start(job, cluster3.write_inventory(tmp_path / "inv.yaml"), tmp_path / "home", "dflt-1")
    try:
        for rank in range(6):
            controller.wait_line(f"r{rank}] tick {rank} 2")
        cluster3.cut(2)
        cut_at = time.monotonic()
        others_clean = wait_for(lambda: not any(job_processes(cluster3, i, "dflt-1") for i in (0, 1)), CUT_BOUND)
        clean_after = time.monotonic() - cut_at
        rc = controller.proc.wait(timeout=max(0.1, CUT_BOUND - clean_after) + 30)
        back_after = time.monotonic() - cut_at
    finally:
        cluster3.restore(2)
        controller.end()
    restored = time.monotonic()
    assert wait_for(lambda: not job_processes(cluster3, 2, "dflt-1"),
                    DEFAULT_HEARTBEAT_TIMEOUT + DEFAULT_STOP_GRACE + 3), "the cut host did not end the job itself"
    print(f"link cut, default timing: others clean after {clean_after:.1f} s, controller back after "
          f"{back_after:.1f} s, cut host clean {time.monotonic() - restored:.1f} s after its link returned")
    assert others_clean and back_after <= CUT_BOUND, f"clean after {clean_after:.1f} s, back after {back_after:.1f} s"
    assert rc == 1
    root = controller.record()["failures"][0]  # type: ignore[index]
    assert (root["host"], root["kind"]) == ("node2", "lost")
