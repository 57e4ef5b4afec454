"""The ranks' short socket directory under the hosts' /tmp leaves nothing behind (issue 46.9), on the
3-host lab: a job whose ~/.distrun/jobs/<id>/sock is too long for a socket gets one per host; node2's
supervisor is SIGKILLed mid-run, and the cleanup the controller then runs on node2 removes node2's
directory (the supervisor recorded it), as the other hosts' supervisors remove theirs."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from tests.cluster.harness import Cluster
from tests.faults.scene import WORKER, Controller, job_processes, supervisor
from tests.helpers import wait_for

# /root/.distrun/jobs/<id>/sock/rank99999.sock is over 107 bytes with an id this long.
LONG_ID = f"sd{os.getpid() % 10**6:06d}-" + "x" * 72


def test_a_sigkilled_supervisors_socket_directory_is_removed_by_the_cleanup_that_follows(
        cluster3: Cluster, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: sockdir\nscript: {WORKER}\nnproc_per_node: 1\nheartbeat_timeout: 4\nstop_grace: 2\n")
    home = tmp_path / "home"
    home.mkdir()
    made = os.path.join("/tmp", f"distrun-{LONG_ID[:8]}-*")  # the hosts share this machine's /tmp
    controller = Controller.start(job, cluster3.write_inventory(tmp_path / "inv.yaml"), home, LONG_ID)
    try:
        controller.wait_line("[node2 r2] tick 2 2", timeout=120)
        assert len(glob.glob(made)) == 3  # one per host's supervisor
        os.kill(supervisor(cluster3, 2, LONG_ID).pid, 9)
        assert controller.proc.wait(timeout=60) == 1, controller.terminal()[-2000:]
        assert wait_for(lambda: not any(job_processes(cluster3, i, LONG_ID) for i in range(3)), 15)
        assert glob.glob(made) == [], controller.terminal()[-2000:]
    finally:
        controller.end()
        for left in glob.glob(made):
            for sock in Path(left).iterdir():
                sock.unlink()
            Path(left).rmdir()
