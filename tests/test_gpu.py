"""remote/gpu.py: one rule for a value the driver cannot give, in every reader of nvidia-smi and
NVML; and no GPU left held by a job, against a fake NVML with nvidia-ml-py's call signatures
(this machine has no GPU) and real processes found as the supervisor finds the job's."""

from __future__ import annotations

import inspect
import io
import json
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from orchestrator.liveness import process_start
from orchestrator.remote import cleanup, gpu, sampler, supervisor
from orchestrator.remote.config import SupervisorConfig
from orchestrator.remote.stream import StreamWriter
from orchestrator.store import JobRecord, JobState, Store
from tests.helpers import REPO, distrun, record_this_process_as_the_jobs_root
from tests.test_probe import Process, fake_pynvml
from tests.test_sampler_nvml import FakeGpu, FakeHandle, FakeNvml
from tests.test_supervisor_lifecycle import config, decode

UNKNOWN = ["", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]"]
UUID = "GPU-1f3a6c2e-8d0b-4c1e-9a57-2b8c4d6e0f11"
HELD = 2_100_000_000  # bytes: "2.1 GB"


@pytest.mark.parametrize("cell", UNKNOWN)
def test_every_reader_takes_an_unavailable_value_as_unknown_and_keeps_its_row(cell: str) -> None:
    facts_row = f"0, NVIDIA H100 80GB HBM3, 81559, 4, 580.159.04, {cell}, {cell}, {UUID}"
    sample_row = f"0, {UUID}, {cell}, 4, 81559, {cell}, {cell}, {cell}, {cell}, {cell}, {cell}"
    apps = gpu.parse_smi_apps(f"{UUID}, 4242, {cell}")

    (device,) = gpu.parse_smi_facts(facts_row, apps)["devices"]
    (sample,) = sampler.parse_smi_gpus(sample_row)

    assert apps == [gpu.SmiApp(UUID, 4242, None)]
    assert device["processes"] == [{"pid": 4242, "used_mib": None}]
    assert device["persistence"] is None and device["ecc_uncorrected"] is None
    assert [sample[k] for k in ("util", "temp_c", "power_w", "power_limit_w", "sm_clock_mhz", "throttle",
                                "ecc_uncorrected")] == [None] * 7


def test_nvml_gives_unknown_process_memory_as_unknown_to_the_probe_and_the_sampler() -> None:
    nvml = fake_pynvml({0: 0}, {0: [Process(4242, None), Process(4243, 1024**2)]})
    (device,) = gpu.nvml_facts(nvml)["devices"]
    (sample,) = sampler.NvmlGpus(FakeNvml([FakeGpu(procs=[(4242, None), (4243, 1024**2)])])).read([4242, 4243])
    assert device["processes"] == [{"pid": 4242, "used_mib": None}, {"pid": 4243, "used_mib": 1}]
    assert sample["job_mem_mb"] is None


# ---------------------------------------------------------------- no GPU left held


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


class DriverNvml(FakeNvml):
    """A fake NVML whose GPUs are held by real processes: `holders` maps a pid to (gpu, bytes), and
    the driver frees a process's memory once it has died (as the real one does at teardown)."""

    def __init__(self, gpus: int, holders: dict[int, tuple[int, int | None]]) -> None:
        super().__init__([FakeGpu() for _ in range(gpus)])
        self.holders = holders

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used)
                for pid, (index, used) in self.holders.items() if index == handle.index and alive(pid)]


def test_the_driver_fake_has_nvidia_ml_pys_signature() -> None:
    fake = inspect.signature(DriverNvml(1, {}).nvmlDeviceGetComputeRunningProcesses)
    assert list(fake.parameters) == list(inspect.signature(pynvml.nvmlDeviceGetComputeRunningProcesses).parameters)


@pytest.fixture
def on_gpu_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """This machine as a GPU host whose NVML is the `nvml` the test puts in the dict."""
    driver: dict[str, Any] = {}
    monkeypatch.setattr(gpu, "has_nvidia_driver", lambda: True)
    monkeypatch.setattr(gpu, "import_nvml", lambda: driver["nvml"])
    yield driver


def job_env(job_id: str) -> dict[str, str]:
    return {**os.environ, "DISTRUN_JOB_ID": job_id, "DISTRUN_NODE": "n0"}


def started(proc: subprocess.Popen[bytes], job_id: str) -> int:
    """proc's pid once it has exec'd with the job's environment."""
    deadline = time.monotonic() + 5
    while proc.pid not in supervisor.job_processes(job_id, os.getpid(), "n0") and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc.pid


def test_the_end_kills_a_job_process_holding_a_gpu_names_it_and_leaves_another_jobs_gpu(on_gpu_host) -> None:
    job_id = f"gpu-{os.getpid()}"
    worker = subprocess.Popen(["sleep", "300"], env=job_env(job_id), start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], env=job_env("another-job"))
    try:
        started(worker, job_id)
        on_gpu_host["nvml"] = nvml = DriverNvml(2, {worker.pid: (1, HELD), other.pid: (0, 30 * HELD)})

        left, freed = supervisor.end_job_freeing_gpus(job_id, "n0", None, grace=1.0)

        assert freed == [f"freed 2.1 GB on gpu1 held by pid {worker.pid}"]
        assert worker.wait(timeout=5) == -signal.SIGTERM and left == 0
        assert other.poll() is None
        assert nvml.calls["nvmlInit"] == nvml.calls["nvmlShutdown"] == 1
    finally:
        for proc in (worker, other):
            proc.kill()
            proc.wait()


def test_memory_the_driver_keeps_after_sigkill_is_named_as_not_freed(on_gpu_host) -> None:
    on_gpu_host["nvml"] = DriverNvml(1, {os.getpid(): (0, None)})  # this process: it stays alive
    holders = gpu.GpuHolders.open()
    assert holders is not None
    held = holders.held_by({os.getpid()})
    expected = f"memory on gpu0 held by pid {os.getpid()} not freed 0.2 s after SIGKILL"
    assert holders.released(held, wait=0.2) == [expected]


def test_a_host_without_an_nvidia_driver_is_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "has_nvidia_driver", lambda: False)
    assert gpu.GpuHolders.open() is None


def test_stop_without_a_controller_reports_the_gpu_memory_it_freed(on_gpu_host, capsys, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = f"gpu-stop-{os.getpid()}"
    monkeypatch.setenv("HOME", str(tmp_path))
    record_this_process_as_the_jobs_root(tmp_path, job_id, "n0")  # where the supervisor records itself
    worker = subprocess.Popen(["sleep", "300"], env=job_env(job_id), start_new_session=True)
    try:
        started(worker, job_id)
        on_gpu_host["nvml"] = DriverNvml(1, {worker.pid: (0, HELD)})
        cleanup.main([job_id, "n0", "1"])
        assert json.loads(capsys.readouterr().out) == {
            "found": 1, "killed": 0, "gpus_freed": [f"freed 2.1 GB on gpu0 held by pid {worker.pid}"]}
    finally:
        worker.kill()
        worker.wait()


def test_a_dataloader_worker_left_on_a_gpu_after_torchrun_exits_is_killed_and_in_the_exit(
        tmp_path: Path, on_gpu_host, monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "worker.pid"
    # torchrun's stand-in leaves a worker in a session of its own (re-parented once it exits).
    leave_worker = ("import subprocess, sys; p = subprocess.Popen(['sleep', '300'], start_new_session=True, "
                    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                    f"open({str(pidfile)!r}, 'w').write(str(p.pid))")
    cfg = config(tmp_path, [sys.executable, "-c", leave_worker])
    monkeypatch.setattr(supervisor.Supervisor, "_catch_signals", lambda self: None)

    class LeftWorker(DriverNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
            if pidfile.exists() and not self.holders:
                self.holders[int(pidfile.read_text())] = (0, HELD)
            return super().nvmlDeviceGetComputeRunningProcesses(handle)

    on_gpu_host["nvml"] = LeftWorker(1, {})
    out = io.BytesIO()
    supervisor.Supervisor(SupervisorConfig.from_dict(cfg), StreamWriter(out)).run(io.BytesIO())

    pid = int(pidfile.read_text())
    _, events = decode(out.getvalue())
    line = f"freed 2.1 GB on gpu0 held by pid {pid}"
    assert events[-1]["ev"] == "exit" and events[-1]["gpus_freed"] == [line]
    assert line in [e["msg"] for e in events if e["ev"] == "note"]
    assert not alive(pid) and supervisor.job_processes(cfg["job_id"], os.getpid(), "n0") == []


# A live job's controller, as `stop` finds it: on SIGTERM it records the job's end (the GPU lines as data,
# a summary whose words only look like one) and exits.
FAKE_CONTROLLER = """import signal, sys, time
from pathlib import Path
from orchestrator.store import JobState, Store
def end(*_):
    Store(Path(sys.argv[1])).end(sys.argv[2], JobState.STOPPED, 143, "job stopped\\nnot a GPU: held by pid 1 in words",
                           gpus_freed=["node0: freed 2.1 GB on gpu0 held by pid 4242"])
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
print("ready", flush=True)
time.sleep(60)
"""


def test_stop_prints_the_gpu_lines_the_jobs_record_keeps_not_lines_of_its_summary(tmp_path: Path) -> None:
    home, job_id = tmp_path / "home", "gpu-20261126-050000-a1b2"
    proc = subprocess.Popen([sys.executable, "-c", FAKE_CONTROLLER, str(home), job_id, "orchestrator-test-controller"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        Store(home).save(JobRecord(id=job_id, name="gpu", spec_path="", inventory="<built-in>",
                                   hosts=["localhost"], state=JobState.RUNNING, controller_pid=proc.pid,
                                   controller_start=process_start(proc.pid)))
        stopped = json.loads(distrun("stop", job_id, "--json", home=home).stdout)
    finally:
        proc.kill()
        proc.wait()
    assert stopped["gpus_freed"] == ["node0: freed 2.1 GB on gpu0 held by pid 4242"]
    assert Store(home).get(job_id).gpus_freed == stopped["gpus_freed"]
