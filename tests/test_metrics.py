"""A job's figures for Prometheus: names and labels, the record's alerts by kind, `distrun metrics` from
a running job's files, and a launch refused in one line when its metrics port is in use.

The lab test (tests/cluster/test_metrics_cluster.py) has a real Prometheus scrape a real job.
"""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.liveness import process_start
from orchestrator.metrics import JobFigures, bind, exposition, families_json
from orchestrator.spec import load_job
from orchestrator.store import JobRecord, JobState, Store
from orchestrator.telemetry.alerts import HostState
from orchestrator.telemetry.alerts import recorded as read_alert
from tests.helpers import distrun

NAME = re.compile(r"^distrun_[a-z0-9_]+$")
HOST = {"kind": "host", "t": 100.5, "cpu_pct": 37.5, "cpus": 16, "mem_used_mb": 2048, "mem_total_mb": 8192,
        "net_rx_bytes": 10, "net_tx_bytes": 20, "load1": 1.5, "job_procs": 3, "job_cpu_pct": 150.0, "job_rss_mb": 512}
GPU = {"kind": "gpu", "gpu": 0, "util": 90, "mem_used_mb": 1024, "mem_total_mb": 81920, "power_w": 412.0,
       "power_limit_w": 700.0, "temp_c": 61, "sm_clock_mhz": 1980, "throttle": ["sw_power_cap"], "ecc_uncorrected": 0,
       "xid": 2, "xid_last": 79, "job_mem_mb": 900}
ALERTS = ("14:02:11 node1: gpu0 idle for 60 s (utilisation 0% < 5%)",
          "14:02:12 node1: gpu1: 1 new XID error(s) (1 in all, last XID 79)",
          "14:02:13 node0: straggler: rank 3 takes 0.900 s a step, 3.0x the median 0.300 s of all ranks, for 5 "
          "intervals in a row (to step 40)",
          "14:02:14 node2: no telemetry samples for 7 s since the last (expected every 2 s)")


def figures() -> JobFigures:
    hosts = [HostState("node0", HOST, {0: GPU, 1: {**GPU, "gpu": 1, "throttle": []}}), HostState("node1")]
    return JobFigures("train-1", "running", 2, hosts, hosts_lost=1, quarantined=("node9",), alerts=ALERTS,
                      ranks={0: {"node": "node0", "rank": 0, "step": 40, "step_time_s": 0.3, "samples_per_s": 12.0}},
                      throughput={"samples_per_s": 24.0})


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_name_follows_prometheus_conventions_and_carries_the_job_label() -> None:
    text = exposition([figures()])
    for family in text_string_to_metric_families(text):
        assert NAME.match(family.name), family.name
        assert not family.name.endswith("_pct") and "_mb" not in family.name, family.name
        assert all(s.labels["job"] == "train-1" for s in family.samples), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        if family.name.endswith("_ratio"):
            assert all(0 <= s.value <= 1 for s in family.samples), family.name


def test_figures_are_scaled_to_base_units_with_host_gpu_and_rank_labels() -> None:
    found = samples(exposition([figures()]))
    node0 = {"job": "train-1", "host": "node0"}
    assert found[("distrun_host_cpu_ratio", frozenset(node0.items()))] == 0.375
    assert found[("distrun_host_memory_total_bytes", frozenset(node0.items()))] == 8192 * 1024 * 1024
    gpu0 = frozenset({**node0, "gpu": "0"}.items())
    assert found[("distrun_gpu_utilization_ratio", gpu0)] == 0.9
    assert found[("distrun_gpu_sm_clock_hertz", gpu0)] == 1980e6
    assert found[("distrun_gpu_xid_errors_total", gpu0)] == 2
    assert found[("distrun_gpu_throttle", frozenset({**node0, "gpu": "0", "reason": "sw_power_cap"}.items()))] == 1
    assert not [k for k in found if k[0] == "distrun_gpu_throttle" and ("gpu", "1") in k[1]]
    assert found[("distrun_rank_steps_total", frozenset({**node0, "rank": "0"}.items()))] == 40
    assert not [k for k in found if ("host", "node1") in k[1]]  # a host without a sample yet has no series


def test_job_figures_say_state_attempt_restarts_lost_quarantined_and_alerts_by_kind() -> None:
    found = samples(exposition([figures()]))
    job = ("job", "train-1")
    states = {dict(k[1])["state"]: v for k, v in found.items() if k[0] == "distrun_job_state"}
    assert states == {s.value: float(s.value == "running") for s in JobState}
    assert found[("distrun_job_attempt", frozenset({job}))] == 2
    assert found[("distrun_job_restarts_total", frozenset({job}))] == 1
    assert found[("distrun_job_hosts_lost_total", frozenset({job}))] == 1
    assert found[("distrun_host_quarantined", frozenset({job, ("host", "node9")}))] == 1
    kinds = {dict(k[1])["kind"]: v for k, v in found.items() if k[0] == "distrun_job_alerts_total"}
    assert kinds == {"idle": 1, "xid": 1, "straggler": 1, "silent": 1, "memory": 0, "throttle": 0, "ecc": 0,
                     "stall": 0, "rendezvous": 0, "other": 0}
    assert found[("distrun_rank_straggler_named_total", frozenset({job, ("host", "node0"), ("rank", "3")}))] == 1


def test_a_program_without_metrics_lines_gets_its_pace_and_rank_positions_from_the_flight_recorder() -> None:
    quiet = replace(figures(), ranks={}, throughput=None,
                    progress={"collectives_per_s": 22.6, "collectives": 1708, "ranks": {"4": 1708, "0": 1848}})
    found = samples(exposition([quiet]))
    job = ("job", "train-1")
    assert found[("distrun_job_collectives_per_second", frozenset({job}))] == 22.6
    assert found[("distrun_rank_collectives_total", frozenset({job, ("rank", "4")}))] == 1708
    assert found[("distrun_rank_collectives_total", frozenset({job, ("rank", "0")}))] == 1848
    assert not [k for k in found if k[0] == "distrun_job_samples_per_second"]


def test_an_alert_line_of_the_record_is_read_back_to_its_host_rule_and_rank() -> None:
    assert read_alert(ALERTS[2]).node == "node0" and read_alert(ALERTS[2]).rank == 3
    assert [read_alert(a).rule for a in ALERTS] == ["idle", "xid", "straggler", "silent"]
    assert read_alert("14:00:00 n: something new").rule == "other"


def test_the_series_count_stays_bounded_by_hosts_gpus_and_ranks_not_by_lines() -> None:
    many = JobFigures("j", "running", 1, figures().hosts, alerts=ALERTS * 1000)
    assert len(families_json([many])[0]["samples"]) == len(families_json([figures()])[0]["samples"])
    count = sum(len(f["samples"]) for f in families_json([many]))
    assert count == sum(len(f["samples"]) for f in families_json([JobFigures("j", "running", 1, figures().hosts,
                                                                            alerts=ALERTS)]))


def test_metrics_prints_a_running_jobs_figures_from_its_files_and_nothing_once_it_ended(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store(home)
    # A stand-in for the job's controller, alive while the record says running.
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "orchestrator"])
    store.save(JobRecord(id="run-1", name="run", spec_path="x", inventory="<built-in>", hosts=["node0"],
                         backend="local", state=JobState.RUNNING, controller_pid=controller.pid,
                         controller_start=process_start(controller.pid), alerts=[ALERTS[0]]))
    job_dir = store.job_dir("run-1")
    job_dir.create()
    job_dir.telemetry.write_text(json.dumps({**HOST, "node": "node0", "t": time.time()}) + "\n")
    job_dir.metrics.write_text(json.dumps({"node": "node0", "rank": 0, "step": 7, "step_time_s": 0.5}) + "\n")
    shown = distrun("metrics", home=home)
    assert shown.returncode == 0, shown.stderr
    found = samples(shown.stdout)
    assert found[("distrun_host_cpu_ratio", frozenset({("job", "run-1"), ("host", "node0")}))] == 0.375
    assert found[("distrun_rank_steps_total", frozenset({("job", "run-1"), ("host", "node0"), ("rank", "0")}))] == 7
    names = {f["name"] for f in json.loads(distrun("metrics", "--json", home=home).stdout)}
    assert {"distrun_job_state", "distrun_host_cpu_ratio", "distrun_rank_steps"} <= names
    controller.kill()
    controller.wait()
    store.end("run-1", JobState.SUCCEEDED, 0, "done")
    assert distrun("metrics", home=home).stdout == ""


def test_a_metrics_port_in_use_is_one_line_exit_2_before_the_job_is_recorded(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    (tmp_path / "train.py").write_text("print('never run')\n")
    job.write_text(f"name: busy\nscript: {tmp_path / 'train.py'}\nnproc_per_node: 1\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = distrun("launch", str(job), "--backend", "local", "--metrics-port", str(port), home=tmp_path / "h")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"distrun: error: --metrics-port {port}: 127.0.0.1:{port} is in use; pick another port (--metrics-port), "
        "or another address (--metrics-addr)"]
    assert not (tmp_path / "h" / "jobs").exists() or not any((tmp_path / "h" / "jobs").iterdir())


def test_the_job_file_may_name_the_metrics_port(tmp_path: Path) -> None:
    job, script = tmp_path / "job.yaml", tmp_path / "train.py"
    script.write_text("print('never run')\n")
    job.write_text(f"name: m\nscript: {script}\nmetrics_port: 9400\n")
    assert load_job(job).metrics_port == 9400
    job.write_text(f"name: m\nscript: {script}\nmetrics_port: 0\n")
    result = distrun("launch", str(job), "--backend", "local", "--dry-run", home=tmp_path / "h")
    assert result.returncode == 2 and "metrics_port" in result.stderr, result.stderr


# ---------------------------------------------------------------- the endpoint


def test_the_endpoint_holds_a_burst_of_300_connections_and_answers_every_scrape() -> None:
    """300 connections at once on loopback (a scrape storm, or many Prometheus replicas): the
    kernel holds every one until the server thread accepts it, none waits for a SYN resent a
    second later (socketserver's backlog of 5 made 77 of 5,105 scrapes time out), and every
    one then gets its scrape."""
    endpoint = bind("127.0.0.1", 0, lambda: [figures()])
    conns: list[socket.socket] = []
    try:
        for _ in range(300):
            conn = socket.socket()
            conn.setblocking(False)
            conn.connect_ex(("127.0.0.1", endpoint.port))
            conns.append(conn)
        deadline = time.monotonic() + 0.8
        pending = set(conns)
        while pending and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(pending)[:500], [], 0.05)
            pending -= {c for c in writable if c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0}
        assert len(pending) == 0, f"{len(pending)} of 300 connections not established within 0.8 s"

        for conn in conns:
            conn.setblocking(True)
            conn.settimeout(30)
            conn.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        answers = [b"".join(iter(lambda c=conn: c.recv(65536), b"")) for conn in conns]
        assert all(a.startswith(b"HTTP/1.0 200") and b"distrun_job_state" in a for a in answers)
    finally:
        for conn in conns:
            conn.close()
        endpoint.close()


def test_an_endpoint_beyond_loopback_says_once_what_it_exposes_and_to_whom(capsys: pytest.CaptureFixture) -> None:
    local = bind("127.0.0.1", 0, lambda: [figures()])
    local.close()
    assert capsys.readouterr().err == ""

    everywhere = bind("0.0.0.0", 0, lambda: [figures()])
    everywhere.close()
    err = capsys.readouterr().err.splitlines()

    assert len(err) == 1 and "every interface" in err[0] and "anyone who can reach" in err[0], err
    assert "host" in err[0] and "--metrics-addr 127.0.0.1" in err[0] and "docs/security.md" in err[0]
