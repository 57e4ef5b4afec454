"""A job's /metrics endpoint scraped by a real Prometheus (Debian's `prometheus`) on the 3-host lab.

Each lab host's sampler reads a fake NVML (tests.test_sampler_nvml.FakeNvml, put on the hosts'
PYTHONPATH by the inventory's `python:` wrapper), so the job has GPU series as well as CPU ones.
The job's ranks print a metrics line every half second until the test lets them end.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_launch_cluster import output, start
from tests.helpers import REPO, distrun, wait_for

DASHBOARD = REPO / "grafana" / "distrun-job.json"
PROMETHEUS = shutil.which("prometheus")
SHIM = f"""\
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.test_sampler_nvml import FakeGpu, FakeNvml
sys.modules[__name__] = FakeNvml([FakeGpu(util=40), FakeGpu(util=80)])
"""
# Ranks that print a metrics line every 0.5 s until the file named by their first argument exists.
# A step an all-reduce (gloo), so that the collectives' arrival skew, which the dashboard draws, has data;
# the ranks stop together once the stop file is there.
WORKER = """\
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, step, more = int(os.environ["RANK"]), 0, torch.ones(1)
while more.item() and step < 600:
    time.sleep(0.5)
    step += 1
    print("DISTRUN_METRICS " + json.dumps({"step": step, "rank": rank, "step_time_s": 0.5, "samples_per_s": 8.0}),
          flush=True)
    more = torch.zeros(1) if os.path.exists(sys.argv[1]) else torch.ones(1)
    dist.all_reduce(more, op=dist.ReduceOp.MIN)
dist.destroy_process_group()
"""

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (tests/install-system-deps.sh)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def query(api: str, expr: str) -> list[dict[str, Any]]:
    """The instant vector of `expr` from Prometheus' HTTP API ([] while it has no data)."""
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as reply:
        answer = json.load(reply)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def scraped(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real Prometheus scraping 127.0.0.1:PORT every second; yields (its API's URL, PORT)."""
    target, web = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    # honor_labels: the job's own `job` label stays (docs/metrics.md); Prometheus' would rename it.
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - {{job_name: distrun, honor_labels: true, static_configs: [{{targets: ['127.0.0.1:{target}']}}]}}\n")
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{web}"
    try:
        assert wait_for(lambda: scraped(f"{api}/-/ready"), 60), (tmp_path / "prometheus.log").read_text()[-3000:]
        yield api, target
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture
def fake_gpu_inventory(cluster3, tmp_path: Path) -> Path:
    """The lab's inventory, each host's python run with a fake NVML on its path (2 GPUs a host)."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "pynvml.py").write_text(SHIM)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'fake'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return cluster3.write_inventory(tmp_path / "inv.yaml", python=str(python))


def top_json(home: Path, job_id: str) -> dict[str, Any]:
    result = distrun("top", job_id, "--json", home=home)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cpu_agrees(api: str, home: Path, job_id: str, nodes: list[str]) -> bool:
    """Whether, for every host, Prometheus' latest CPU figure is `top --json`'s: asked when both hold
    the same sample (the same sample time), the CPU must be the same to the digit."""
    top = {h["node"]: h["host"] for h in top_json(home, job_id)["hosts"]}
    times = {r["metric"]["host"]: float(r["value"][1])
             for r in query(api, f'distrun_host_sample_timestamp_seconds{{job="{job_id}"}}')}
    cpus = {r["metric"]["host"]: float(r["value"][1]) for r in query(api, f'distrun_host_cpu_ratio{{job="{job_id}"}}')}
    same = all(top.get(n) and times.get(n) == top[n]["t"] for n in nodes)
    if same:
        assert {n: round(cpus[n] * 100, 6) for n in nodes} == {n: round(top[n]["cpu_pct"], 6) for n in nodes}
    return same


def dashboard_queries(job_id: str) -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"].replace("$job", job_id) for p in panels for t in p["targets"]]


def test_prometheus_scrapes_a_3_host_job_that_agrees_with_top_and_the_endpoint_goes_with_the_job(
        cluster3, fake_gpu_inventory, prometheus, tmp_path):
    api, port = prometheus
    home, stop, job_id = tmp_path / "home", tmp_path / "stop", "prom-1"
    (tmp_path / "worker.py").write_text(WORKER)
    job = tmp_path / "prom.yaml"
    job.write_text(f"name: prom\nscript: {tmp_path / 'worker.py'}\nargs: [{stop}]\nnproc_per_node: 1\n"
                   "env: {OMP_NUM_THREADS: '1'}\ntelemetry: {interval: 3}\n")
    launch = start(job, fake_gpu_inventory, home, job_id, "--no-live", "--metrics-port", str(port))
    try:
        endpoint = f"http://127.0.0.1:{port}/metrics"
        assert wait_for(lambda: scraped(endpoint), 60), output(home, job_id)[-3000:]
        nodes = [f"node{i}" for i in range(3)]
        assert wait_for(lambda: len(query(api, f'distrun_gpu_utilization_ratio{{job="{job_id}"}}')) == 6, 90), \
            output(home, job_id)[-3000:]
        time.sleep(10)
        assert [float(r["value"][1]) for r in query(api, 'up{job="distrun"}')] == [1.0]
        (state,) = query(api, f'distrun_job_state{{job="{job_id}"}} == 1')
        assert state["metric"]["state"] == "running"
        assert wait_for(lambda: cpu_agrees(api, home, job_id, nodes), 60, every=0.5)
        empty = [expr for expr in dashboard_queries(job_id) if not query(api, expr)]
        assert empty == [], empty
        running = distrun("metrics", home=home).stdout
        assert f'distrun_job_state{{job="{job_id}",state="running"}} 1.0' in running
    finally:
        stop.touch()
        code = launch.wait(timeout=120)
    assert code == 0, output(home, job_id)[-3000:]
    assert not scraped(endpoint)
    assert distrun("metrics", home=home).stdout == ""
    assert json.loads(distrun("metrics", "--json", home=home).stdout) == []
