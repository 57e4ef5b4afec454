"""`distrun bench` with real jobs on CPU: one process, DDP 2 processes on this machine, and DDP
2 hosts x 2 processes on the namespace cluster. The report's table must say what the metrics
files say (recomputed here), and the page must render in Chromium with its table and plots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from orchestrator.logs.sink import job_wide
from orchestrator.report.page import PLOT_FRAME_COLOUR, TABLE_HEAD_COLOUR
from tests.browser import chromium, colour_mask, frames, ink, inside, load_rgb, render, table_rows
from tests.cluster.harness import Cluster, cleanup_stale, skip_reason
from tests.helpers import REPO
from tests.test_report import expected_numbers, table

TINY = ["--model", "tiny", "--steps", "8", "--log-every", "2", "--warmup-steps", "2", "--image-size", "32",
        "--batch-size", "4"]
BENCH_TIMEOUT = 420
STOP_TIMEOUT = 60

needs_chromium = pytest.mark.skipif(chromium() is None,
                                    reason="chromium is not installed (tests/install-system-deps.sh)")
needs_hosts = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@dataclass(frozen=True)
class Bench:
    home: Path
    report: Path
    returncode: int
    output: str

    def metrics(self, job_id: str) -> list[dict[str, Any]]:
        """The job-wide (rank 0's) records of metrics.jsonl, which also holds every rank's step time."""
        text = (self.home / "jobs" / job_id / "metrics.jsonl").read_text()
        return [record for record in map(json.loads, text.splitlines()) if job_wide(record)]

    def has_telemetry(self, job_id: str) -> bool:
        path = self.home / "jobs" / job_id / "telemetry.jsonl"
        return path.exists() and path.stat().st_size > 0

    def rows(self) -> dict[str, dict[str, str]]:
        return table(self.report.read_text())


def job_file(directory: Path, name: str, strategy: str, nproc: int, nnodes: int | None = None) -> Path:
    doc: dict[str, Any] = {
        "name": name, "script": str(REPO / "jobs" / "train_resnet50.py"), "args": ["--strategy", strategy, *TINY],
        "nproc_per_node": nproc, "env": {"OMP_NUM_THREADS": "1"}, "telemetry": {"interval": 0.5},
    }
    if nnodes is not None:
        doc["nnodes"] = nnodes
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_bench(home: Path, report: Path, *args: str, env: dict[str, str] | None = None) -> Bench:
    """`distrun bench ARGS -o REPORT`; past BENCH_TIMEOUT it gets SIGTERM, so it stops its jobs on every host."""
    full_env = {**os.environ, "DISTRUN_HOME": str(home), "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("DISTRUN_INVENTORY", None)
    with subprocess.Popen([sys.executable, "-m", "orchestrator", "bench", *args, "-o", str(report)], cwd=REPO,
                          env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            output, _ = proc.communicate(timeout=BENCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=STOP_TIMEOUT)
            output += f"\n(test: bench ran past {BENCH_TIMEOUT} s and was stopped with SIGTERM)"
    return Bench(home, report, proc.returncode, output)


@pytest.fixture(scope="module")
def local_bench(tmp_path_factory: pytest.TempPathFactory) -> Bench:
    """single (nproc 1) and ddp (nproc 2) on this machine through the local transport."""
    tmp = tmp_path_factory.mktemp("bench-local")
    inventory = tmp / "local.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": [
        {"name": "localhost", "host": "localhost", "transport": "local", "python": sys.executable}]}))
    return run_bench(tmp / "home", tmp / "report.html", str(job_file(tmp, "single", "single", 1)),
                     str(job_file(tmp, "ddp2", "ddp", 2)), "-i", str(inventory))


def job_ids(bench: Bench) -> dict[str, str]:
    """Job name -> id, from the job directories (not from the report)."""
    return {path.name.split("-")[0]: path.name for path in (bench.home / "jobs").iterdir()}


def assert_table_matches_metrics(bench: Bench, layouts: dict[str, str]) -> None:
    """Every number of every row equals what that job's metrics.jsonl gives."""
    assert bench.returncode == 0, bench.output[-4000:]
    rows, ids = bench.rows(), job_ids(bench)
    assert list(rows) == [ids[name] for name in layouts]
    base = expected_numbers(bench.metrics(ids["single"]))["throughput"]
    for name, layout in layouts.items():
        metrics, row = bench.metrics(ids[name]), rows[ids[name]]
        want = expected_numbers(metrics)
        world = metrics[0]["world_size"]
        assert row["Hosts × processes"] == layout
        assert row["Strategy"] == metrics[0]["strategy"]
        assert row["Global batch"] == str(want["batch"]) == str(4 * world)
        assert row["Steps N"] == str(want["steps"]) == "8"
        assert row["Time for N steps (s)"] == f"{want['time']:.3f}"
        assert row["Throughput (samples/s)"] == f"{want['throughput']:.1f}"
        assert row["Peak memory per process (MB)"] == f"{want['peak']:.1f}"
        assert row["Scaling efficiency"] == f"{100 * want['throughput'] / (world * base):.1f}%"


def assert_page_renders(bench: Bench) -> None:
    """No console message; the table with a row per job; a framed, drawn plot for each figure."""
    shot = render(bench.report, bench.report.with_suffix(".png"), 1400, 5000)
    image = load_rgb(shot.screenshot)
    jobs = list(bench.rows())
    telemetry = sum(bench.has_telemetry(job_id) for job_id in jobs)

    header, rows = table_rows(image, TABLE_HEAD_COLOUR)
    boxes = frames(colour_mask(image, PLOT_FRAME_COLOUR))

    assert shot.console == []
    assert len(header) >= 25 and len(rows) == len(jobs)
    assert all(np.any(inside(image, row, 2) < 100, axis=-1).sum() > 200 for row in rows)
    page = bench.report.read_text()
    runs = sum(page.count(f'alt="{what} of ') for what in ("collective rate", "lateness"))  # the ranks' collectives
    assert len(boxes) == 4 + telemetry + runs
    assert all(ink(inside(image, box)) > 0.03 for box in boxes)


@pytest.fixture(scope="module")
def cluster_bench(local_bench: Bench, tmp_path_factory: pytest.TempPathFactory) -> Bench:
    """The two local jobs by id, then ddp on two namespace hosts with two processes each."""
    tmp = tmp_path_factory.mktemp("bench-cluster")
    ids = job_ids(local_bench)
    cleanup_stale()
    with Cluster(2) as cluster:
        inventory = cluster.write_inventory(tmp / "cluster.yaml")
        return run_bench(local_bench.home, tmp / "report.html", ids["single"], ids["ddp2"],
                         str(job_file(tmp, "ddp2x2", "ddp", 2, nnodes=2)), "-i", str(inventory),
                         env={"DISTRUN_SSH_CONFIG": str(tmp / "no-ssh-config")})


def test_bench_runs_one_process_and_ddp_on_this_machine(local_bench: Bench) -> None:
    assert local_bench.returncode == 0, local_bench.output[-4000:]
    assert "bench: report written to" in local_bench.output
    assert [job_id.split("-")[0] for job_id in local_bench.rows()] == ["single", "ddp2"]


def test_local_report_table_equals_the_metrics_files(local_bench: Bench) -> None:
    assert_table_matches_metrics(local_bench, {"single": "1 × 1", "ddp2": "1 × 2"})


@needs_chromium
def test_local_report_renders_in_chromium_with_its_table_and_plots(local_bench: Bench) -> None:
    assert_page_renders(local_bench)


@pytest.mark.cluster
@needs_hosts
def test_bench_adds_a_two_host_ddp_job_on_the_namespace_cluster(local_bench: Bench, cluster_bench: Bench) -> None:
    assert cluster_bench.returncode == 0, cluster_bench.output[-4000:]
    assert [job_id.split("-")[0] for job_id in cluster_bench.rows()] == ["single", "ddp2", "ddp2x2"]
    assert list(cluster_bench.rows())[:2] == list(local_bench.rows())
    assert "<td>node0</td><td>node0</td>" in cluster_bench.report.read_text()  # the hosts' own hostnames
    assert "<td>node1</td><td>node1</td>" in cluster_bench.report.read_text()


@pytest.mark.cluster
@needs_hosts
def test_cluster_report_table_equals_the_metrics_files(cluster_bench: Bench) -> None:
    assert_table_matches_metrics(cluster_bench, {"single": "1 × 1", "ddp2": "1 × 2", "ddp2x2": "2 × 2"})


@pytest.mark.cluster
@needs_hosts
@needs_chromium
def test_cluster_report_renders_in_chromium_with_its_table_and_plots(cluster_bench: Bench) -> None:
    assert_page_renders(cluster_bench)
