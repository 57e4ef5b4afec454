"""Telemetry from a real 3-host job on the namespace test cluster (SSH transport, no GPUs)."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.helpers import distrun

INTERVAL = 0.5
JOB_SECONDS = 4


def test_three_host_job_sends_host_samples_from_every_host_at_the_interval(
        cluster3: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    script = tmp_path / "sleep.py"
    script.write_text(f"import time\ntime.sleep({JOB_SECONDS})\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"name: tel3\nscript: {script}\nnproc_per_node: 1\ntelemetry: {{interval: {INTERVAL}}}\n")
    inventory = cluster3.write_inventory(tmp_path / "inventory.yaml")
    home = tmp_path / "home"
    result = distrun("launch", str(job), "-i", str(inventory), home=home,
                     env={"DISTRUN_SSH_CONFIG": str(tmp_path / "no-ssh-config")})
    assert result.returncode == 0, result.stdout + result.stderr
    (job_dir,) = (home / "jobs").iterdir()
    samples = [json.loads(line) for line in (job_dir / "telemetry.jsonl").read_text().splitlines()]
    for i in range(3):
        name = cluster3.name(i)
        mine = [s for s in samples if s["node"] == name and s["kind"] == "host"]
        assert {s["host"] for s in mine} == {name}  # sampled on that host, not on the controller
        assert len(mine) >= JOB_SECONDS / INTERVAL, (name, len(mine))
        gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(mine)]
        assert statistics.median(gaps) == pytest.approx(INTERVAL, abs=0.1)
        assert max(s["job_procs"] for s in mine) >= 2  # torchrun and its worker, this host's only
        assert max(s["job_procs"] for s in mine) <= 3
    assert "ALERT" not in result.stdout
