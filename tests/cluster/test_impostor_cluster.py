"""Another user on a host poses as a rank (issue 30): 2 namespace hosts x 2 ranks, gloo, CPU.

The impostor is a second, unprivileged user of the test hosts (procs.second_user) running, beside
a root job, a process with the job's markers (DISTRUN_JOB_ID, DISTRUN_NODE) and RANK=7, as anyone
who reads `ps` can. distrun must neither list it as a rank nor signal it.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.procs import pose_as_rank_argv, second_user
from tests.cluster.test_hang_cluster import HANG_WORKER
from tests.cluster.test_launch_cluster import job_procs, start, wait_for_line, write_job
from tests.helpers import distrun, wait_for

JOB = "imp-1"


@pytest.fixture
def impostor_beside_the_job(make_cluster, tmp_path: Path) -> Iterator[tuple[object, Path, int]]:
    """A running root job on 2 hosts, and on node1 the impostor's process carrying its markers."""
    cluster = make_cluster(2)
    inv = cluster.write_inventory(tmp_path / "inv.yaml")
    home = tmp_path / "home"
    uid = second_user()
    job = write_job(tmp_path, "healthy", ["--steps", "100000", "--step-time", "1"], script=HANG_WORKER)
    proc = start(job, inv, home, JOB, "--no-live")
    impostor = None
    try:
        wait_for_line(home, JOB, "step 2")
        posed = cluster.host_run(1, pose_as_rank_argv(uid, JOB, "node1", 7))
        assert posed.returncode == 0, posed.stderr
        assert wait_for(lambda: any(p.uid() == uid for p in job_procs(cluster, JOB)[1]), 10)
        impostor = next(p.pid for p in job_procs(cluster, JOB)[1] if p.uid() == uid)
        yield cluster, home, impostor
    finally:
        distrun("stop", JOB, home=home, timeout=60)
        proc.wait(timeout=60)
        if impostor is not None:
            os.kill(impostor, signal.SIGKILL)


def test_another_users_process_with_the_jobs_markers_is_never_a_rank_and_never_signalled(impostor_beside_the_job):
    cluster, home, impostor = impostor_beside_the_job
    done = distrun("stack", JOB, "--json", home=home, timeout=60)
    assert done.returncode == 0, done.stderr
    ranks = sorted(r for g in json.loads(done.stdout)["groups"] for r in g["ranks"])
    assert ranks == [0, 1, 2, 3]
    stopped = distrun("stop", JOB, home=home, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert wait_for(lambda: [p.pid for ps in job_procs(cluster, JOB).values() for p in ps] == [impostor], 30)
    os.kill(impostor, 0)  # still alive: stop signalled only the job's own processes
