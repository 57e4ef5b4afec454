"""Stragglers on real hosts (3 namespace hosts x 2 ranks, gloo, CPU): the bundled training script
with one rank made slow is named, live, in the record and in the report; the same job without it is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.test_launch_cluster import TRAIN, record, write_job
from tests.helpers import distrun

SLOW_RANK = 3  # on node1 (2 ranks a host)
# 16 steps logged every 2: 8 intervals, enough for 5 slow ones in a row after a first noisy one. A healthy
# rank here is busy 5-35 ms a step, and single intervals at 1.5-1.7x the median occur; 5 in a row did not.
ARGS = ["--model", "tiny", "--image-size", "64", "--batch-size", "4", "--steps", "16", "--log-every", "2"]


@pytest.fixture
def inv(cluster3, tmp_path) -> Path:
    return cluster3.write_inventory(tmp_path / "inv.yaml")


def launch(tmp_path: Path, inv: Path, home: Path, job_id: str, *args: str) -> str:
    job = write_job(tmp_path, job_id.split("-")[0], [*ARGS, *args], script=TRAIN)
    result = distrun("launch", str(job), "-i", str(inv), "--job-id", job_id, "--no-live", home=home, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result.stdout


def busy_by_rank(home: Path, job_id: str) -> dict[int, list[float]]:
    """Each rank's busy_s per interval, from the job's metrics.jsonl."""
    rows = [json.loads(line) for line in (home / "jobs" / job_id / "metrics.jsonl").read_text().splitlines()]
    by_rank: dict[int, list[float]] = {}
    for row in sorted((r for r in rows if "busy_s" in r), key=lambda r: r["step"]):
        by_rank.setdefault(row["rank"], []).append(row["busy_s"])
    return by_rank


def test_a_rank_made_slow_is_named_with_its_host_live_in_the_record_and_in_the_report(cluster3, inv, tmp_path):
    home = tmp_path / "home"
    out = launch(tmp_path, inv, home, "slow-1", "--slow-rank", str(SLOW_RANK), "--slow-s", "0.5")
    print("MEASURED busy_s per rank, rank 3 slowed:",
          {r: [round(b, 3) for b in v] for r, v in busy_by_rank(home, "slow-1").items()})
    alerts = [a for a in record(home, "slow-1")["alerts"] if a["rule"] == "straggler"]
    assert len(alerts) == 1, record(home, "slow-1")["alerts"]
    assert (alerts[0]["node"], alerts[0]["rank"]) == ("node1", SLOW_RANK)
    assert alerts[0]["message"].startswith(f"straggler: rank {SLOW_RANK} takes ")
    assert f"[node1] distrun: ALERT straggler: rank {SLOW_RANK} takes " in out
    print("MEASURED alert:", next(line for line in out.splitlines() if "ALERT straggler" in line))
    page = tmp_path / "report.html"
    assert distrun("report", "slow-1", "-o", str(page), home=home).returncode == 0
    text = page.read_text()
    assert "<h4>Alerts while it ran</h4>" in text and f"straggler: rank {SLOW_RANK} takes " in text


def test_the_same_job_without_a_slow_rank_names_no_straggler(cluster3, inv, tmp_path):
    home = tmp_path / "home"
    out = launch(tmp_path, inv, home, "even-1")
    busy = busy_by_rank(home, "even-1")
    assert sorted(busy) == list(range(6)) and all(len(b) == 8 for b in busy.values())
    print("MEASURED busy_s per rank, healthy:", {r: [round(b, 3) for b in v] for r, v in busy.items()})
    assert "straggler" not in out
    assert not [a for a in record(home, "even-1")["alerts"] if "straggler" in a]
