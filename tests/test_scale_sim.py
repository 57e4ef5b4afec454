"""bench/scale_sim.py at a small scale: the controller's real launch, run loop, sink, live view and
stop against simulated hosts, one JSON line out, and every line a host printed in the job's files."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO

KEYS = {"hosts", "controller_cpu_s", "wall_s", "peak_rss_mb", "launch_s", "stop_s", "lines", "lines_lost",
        "root_cause", "root_reason"}


def test_scale_sim_runs_eight_simulated_hosts_to_the_host_it_loses_and_loses_no_line() -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "scale_sim.py"), "--hosts", "8", "--seconds", "2",
                           "--json"], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])

    assert set(result) == KEYS
    assert result["hosts"] == 8
    # 16 ranks at 10 lines/s for at least the 2 s before the loss.
    assert result["lines"] >= 16 * 10 * 2
    assert result["lines_lost"] == 0
    assert result["root_cause"] == "sim4"  # the host the bench lost, and no other
    assert 0 < result["launch_s"] < result["wall_s"] and 0 < result["stop_s"] < result["wall_s"]
