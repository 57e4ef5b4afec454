"""The host-side sampler: host figures, the job's processes, the nvidia-smi fallback, the loop."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.remote import sampler, supervisor
from tests.test_sampler_nvml import FakeGpu, FakeNvml

# nvidia-smi's CSV for SMI_GPU_FIELDS and SMI_APP_FIELDS with `--format=csv,noheader,nounits`:
# a busy data-centre GPU, an idle one, and a GeForce that has no ECC and cannot read its power.
# Written out in the driver's format (this machine has no GPU to capture from).
SMI_GPUS = """\
0, GPU-5f3b1c2e-8a4d-4e0f-9b7a-1d2c3e4f5a6b, 98, 71234, 81559, 64, 512.34, 700.00, 1980, 0x0000000000000000, 0
1, GPU-0c9d8e7f-6a5b-4c3d-2e1f-0a9b8c7d6e5f, 0, 4, 81559, 33, 71.02, 700.00, 345, 0x0000000000000001, 3
2, GPU-aa11bb22-cc33-dd44-ee55-ff6677889900, 23, 1024, 24564, 45, [Not Supported], [N/A], 2520, \
0x0000000000000044, [N/A]
"""
SMI_APPS = """\
GPU-5f3b1c2e-8a4d-4e0f-9b7a-1d2c3e4f5a6b, 4242, 30512
GPU-5f3b1c2e-8a4d-4e0f-9b7a-1d2c3e4f5a6b, 4243, 20480
GPU-aa11bb22-cc33-dd44-ee55-ff6677889900, 777, [N/A]
"""


def test_smi_parser_reads_every_field_and_maps_unavailable_values_to_none() -> None:
    busy, idle, geforce = sampler.parse_smi_gpus(SMI_GPUS)
    assert busy == {
        "gpu": 0, "source": "nvidia-smi", "uuid": "GPU-5f3b1c2e-8a4d-4e0f-9b7a-1d2c3e4f5a6b", "util": 98,
        "mem_used_mb": 71234.0, "mem_total_mb": 81559.0, "temp_c": 64, "power_w": 512.34, "power_limit_w": 700.0,
        "sm_clock_mhz": 1980, "throttle": [], "ecc_uncorrected": 0, "xid": None, "xid_last": None,
    }
    assert idle["throttle"] == ["gpu_idle"] and idle["ecc_uncorrected"] == 3
    assert geforce["power_w"] is None and geforce["power_limit_w"] is None and geforce["ecc_uncorrected"] is None
    assert geforce["throttle"] == ["sw_power_cap", "hw_thermal"]


def test_smi_parser_skips_lines_that_are_not_samples() -> None:
    text = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n\n" + SMI_GPUS
    assert [g["gpu"] for g in sampler.parse_smi_gpus(text)] == [0, 1, 2]
    assert sampler.parse_smi_gpus("No devices were found\n") == []


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `nvidia-smi` on PATH that prints the output above for the two queries."""
    (tmp_path / "gpus.csv").write_text(SMI_GPUS)
    (tmp_path / "apps.csv").write_text(SMI_APPS)
    script = tmp_path / "nvidia-smi"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
          --query-gpu=*) cat {tmp_path / 'gpus.csv'} ;;
          --query-compute-apps=*) cat {tmp_path / 'apps.csv'} ;;
          *) exit 6 ;;
        esac
    """))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return script


def test_without_nvml_bindings_gpus_are_read_with_nvidia_smi(fake_smi: Path) -> None:
    gpus = sampler.open_gpus(FakeNvml([], no_driver=True))
    assert isinstance(gpus, sampler.SmiGpus)
    samples = gpus.read([4242, 4243, 777])
    # gpu2's job process shows no memory figure: how much the job holds there is unknown.
    assert [s["job_mem_mb"] for s in samples] == [50992.0, 0, None]
    assert all("uuid" not in s for s in samples)


def test_without_nvml_or_nvidia_smi_there_is_no_gpu_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert sampler.open_gpus(FakeNvml([], no_driver=True)) is None


# ---------------------------------------------------------------- the job's processes


@pytest.fixture
def job() -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A job id and two of its processes: one spinning on a CPU, one asleep."""
    job_id = f"sampler-test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DISTRUN_JOB_ID": job_id}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env)
             for code in ("while True: pass", "import time; time.sleep(60)")]
    try:
        yield job_id, procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


READERS: dict[str, Callable[[], Callable[[int], Any]]] = {
    "proc": lambda: sampler.read_proc_stat, "psutil": lambda: sampler.PsutilReader(psutil)}


def cpu_seconds(pids: list[int]) -> float:
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def test_a_host_with_proc_reads_the_jobs_processes_without_importing_psutil() -> None:
    # psutil's import costs each host ~20 ms of CPU at the job's start, beside the ranks' imports.
    code = ("import sys; from orchestrator.remote import sampler; reader = sampler.process_reader(); "
            "print(reader is sampler.read_proc_stat, 'psutil' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


@pytest.mark.parametrize("reader", READERS)
def test_job_processes_cpu_and_memory_are_measured(job: tuple[str, list[Any]], reader: str) -> None:
    job_id, procs = job
    tracker = sampler.JobProcesses(job_id, READERS[reader]())
    time.sleep(0.3)
    tracker.sample(0.3)
    before = cpu_seconds([p.pid for p in procs])
    time.sleep(1.0)
    after = cpu_seconds([p.pid for p in procs])
    pids, cpu, rss_mb = tracker.sample(1.0)
    assert sorted(pids) == sorted(p.pid for p in procs)
    assert cpu / 100 == pytest.approx(after - before, abs=0.1)  # CPU seconds in the last second
    assert after - before > 0.05  # one of them spins (however busy this machine is)
    assert rss_mb > 5


def test_first_sample_has_no_cpu_figure_yet(job: tuple[str, list[Any]]) -> None:
    tracker = sampler.JobProcesses(job[0], sampler.read_proc_stat)
    assert tracker.sample(1.0)[1] is None


def test_job_processes_are_found_again_only_every_few_samples(job: tuple[str, list[Any]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    scans = []
    real = supervisor.job_processes
    monkeypatch.setattr(supervisor, "job_processes", lambda *a: scans.append(1) or real(*a))
    tracker = sampler.JobProcesses(job[0], sampler.read_proc_stat)
    for _ in range(2 * sampler.REDISCOVER_EVERY):
        tracker.sample(0.1)
    assert len(scans) == 2


def test_a_process_that_ended_triggers_a_new_scan(job: tuple[str, list[Any]]) -> None:
    job_id, procs = job
    tracker = sampler.JobProcesses(job_id, sampler.read_proc_stat)
    tracker.sample(0.1)
    procs[1].kill()
    procs[1].wait()
    assert len(tracker.sample(0.1)[0]) == 1
    extra = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "DISTRUN_JOB_ID": job_id})
    try:
        time.sleep(0.2)
        assert extra.pid in tracker.sample(0.1)[0]
    finally:
        extra.kill()
        extra.wait()


def test_host_sample_has_every_documented_field() -> None:
    host = sampler.HostSampler("no-such-job", 1.0)
    time.sleep(0.2)
    sample, pids = host.sample()
    assert pids == []
    assert set(sample) == {
        "kind", "t", "host", "interval", "cpus", "cpu_pct", "load1", "mem_used_mb", "mem_total_mb", "net_rx_bytes",
        "net_tx_bytes", "net_rx_bps", "net_tx_bps", "job_procs", "job_cpu_pct", "job_rss_mb", "sampler_cpu_s"}
    assert 0 <= sample["cpu_pct"] <= 100 and 0 < sample["mem_used_mb"] < sample["mem_total_mb"]
    assert sample["net_rx_bytes"] >= 0 and sample["net_rx_bps"] >= 0 and abs(sample["t"] - time.time()) < 5


# ---------------------------------------------------------------- the loop


def run_for(seconds: float, interval: float, **kwargs: Any) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    done = threading.Event()
    thread = threading.Thread(target=sampler.run, args=(interval, "no-such-job",
                                                       lambda ev, **f: events.append((ev, f)), done), kwargs=kwargs)
    thread.start()
    time.sleep(seconds)
    done.set()
    thread.join(5)
    assert not thread.is_alive()
    return events


def test_interval_below_the_minimum_is_raised_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler, "open_gpus", lambda _nvml: None)
    events = run_for(1.1, 0.01)
    times = [f["t"] for _, f in events]
    assert 3 <= len(times) <= 5
    assert min(b - a for a, b in itertools.pairwise(times)) > 0.2
    assert all(f["interval"] == sampler.MIN_INTERVAL for _, f in events)


class Broken:
    source = "broken"

    def read(self, job_pids: list[int]) -> list[dict[str, Any]]:
        raise RuntimeError("the driver fell over")

    def close(self) -> None:
        """Nothing to release."""


def test_a_failing_reading_is_reported_once_and_sampling_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler, "open_gpus", lambda _nvml: Broken())
    events = run_for(1.2, 0.25)
    notes = [f["msg"] for ev, f in events if ev == "note"]
    assert notes == ["telemetry: sampling failed: RuntimeError: the driver fell over"]
    assert sum(ev == "tel" for ev, _ in events) >= 3


def test_samples_are_also_kept_in_a_file_on_the_host(tmp_path: Path) -> None:
    keep = tmp_path / "node0.telemetry.jsonl"
    events = run_for(0.8, 0.25, nvml=FakeNvml([FakeGpu()]), keep=str(keep))
    kept = [json.loads(line) for line in keep.read_text().splitlines()]
    assert kept == [fields for ev, fields in events if ev == "tel"]
    assert [s["kind"] for s in kept[:2]] == ["host", "gpu"]
