"""The sampler's NVML path, against a fake NVML module with nvidia-ml-py's call signatures.

This machine has no GPU. `FakeNvml` is also what the end-to-end telemetry tests install on
the "host" as its `pynvml` module.
"""

from __future__ import annotations

import inspect
import threading
import time
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from orchestrator.remote import sampler

GB = 1024**3


@dataclass
class FakeGpu:
    util: int = 90
    mem_used: int = 30 * GB
    mem_total: int = 80 * GB
    temp: int = 61
    power_mw: int = 412_000
    limit_mw: int = 700_000
    sm_clock: int = 1980
    reasons: int = 0
    ecc: int = 0
    procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)


class FakeHandle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml(types.ModuleType):
    """NVML over made-up GPUs, with nvidia-ml-py's function names and signatures; counts calls.

    Args:
        gpus: the devices.
        unsupported: function names that raise NVML_ERROR_NOT_SUPPORTED.
        missing: function names that raise NVML_ERROR_FUNCTION_NOT_FOUND (an older driver).
        xids: (gpu index, XID code) events pending in the event set.
        no_driver: nvmlInit raises NVML_ERROR_DRIVER_NOT_LOADED.
    """

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    nvmlEventTypeXidCriticalError = 0x8

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    def __init__(self, gpus: list[FakeGpu], unsupported: tuple[str, ...] = (), missing: tuple[str, ...] = (),
                 xids: tuple[tuple[int, int], ...] = (), no_driver: bool = False) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.unsupported = set(unsupported)
        self.missing = set(missing)
        self.xids = list(xids)
        self.no_driver = no_driver
        self.calls: Counter[str] = Counter()
        self.handles: list[FakeHandle] = []

    def _enter(self, name: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        self.calls[name] += 1
        if name in self.unsupported:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        if name in self.missing:
            raise self.NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        if handle is None:
            return None
        assert handle in self.handles, "a handle NVML did not hand out"
        return self.gpus[handle.index]

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.no_driver:
            raise self.NVMLError(self.NVML_ERROR_DRIVER_NOT_LOADED)

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        handle = FakeHandle(index)
        self.handles.append(handle)
        return handle

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return handle.index

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        return types.SimpleNamespace(gpu=gpu.util, memory=gpu.util // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        return types.SimpleNamespace(total=gpu.mem_total, used=gpu.mem_used, free=gpu.mem_total - gpu.mem_used)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._enter("nvmlDeviceGetTemperature", handle).temp

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetEnforcedPowerLimit", handle).limit_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        assert type == self.NVML_CLOCK_SM
        return self._enter("nvmlDeviceGetClockInfo", handle).sm_clock

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle).reasons

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle).reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, errorType: int, counterType: int) -> int:
        assert (errorType, counterType) == (self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.NVML_VOLATILE_ECC)
        return self._enter("nvmlDeviceGetTotalEccErrors", handle).ecc

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        gpu = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.procs]

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, eventTypes: int, eventSet: object) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)

    def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        if not self.xids:
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        index, code = self.xids.pop(0)
        return types.SimpleNamespace(device=self.handles[index], eventType=self.nvmlEventTypeXidCriticalError,
                                     eventData=code, gpuInstanceId=0, computeInstanceId=0)

    def nvmlEventSetFree(self, eventSet: object) -> None:
        self._enter("nvmlEventSetFree")


NVML_FUNCTIONS = [name for name in vars(FakeNvml) if name.startswith("nvml") and callable(getattr(FakeNvml, name))]


@pytest.mark.parametrize("name", NVML_FUNCTIONS)
def test_fake_has_the_signature_of_nvidia_ml_py(name: str) -> None:
    fake = inspect.signature(getattr(FakeNvml([]), name))
    real = inspect.signature(getattr(pynvml, name))
    assert list(fake.parameters) == list(real.parameters)


def test_handles_are_opened_once_across_many_samples() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu()])
    gpus = sampler.NvmlGpus(nvml)
    for _ in range(50):
        gpus.read([])
    gpus.close()
    assert nvml.calls["nvmlInit"] == 1 and nvml.calls["nvmlShutdown"] == 1
    assert nvml.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 100


def test_gpu_sample_converts_units_and_names_throttle_reasons() -> None:
    gpu = FakeGpu(util=87, mem_used=40 * GB, mem_total=80 * GB, temp=83, power_mw=698_500, limit_mw=700_000,
                  sm_clock=1755, reasons=0x4 | 0x40, ecc=2, procs=[(101, 20 * GB), (102, 10 * GB), (999, 5 * GB)])
    (sample,) = sampler.NvmlGpus(FakeNvml([gpu])).read([101, 102])
    assert sample == {
        "gpu": 0, "source": "nvml", "util": 87, "mem_used_mb": 40960.0, "mem_total_mb": 81920.0, "temp_c": 83,
        "power_w": 698.5, "power_limit_w": 700.0, "sm_clock_mhz": 1755, "throttle": ["sw_power_cap", "hw_thermal"],
        "ecc_uncorrected": 2, "xid": 0, "xid_last": None, "job_mem_mb": 30720.0,
    }


def test_unsupported_reading_is_null_and_not_asked_again() -> None:
    nvml = FakeNvml([FakeGpu()], unsupported=("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage"))
    gpus = sampler.NvmlGpus(nvml)
    samples = [gpus.read([])[0] for _ in range(5)]
    assert all(s["ecc_uncorrected"] is None and s["power_w"] is None for s in samples)
    assert samples[-1]["temp_c"] == 61
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == 1 and nvml.calls["nvmlDeviceGetPowerUsage"] == 1


def test_older_driver_without_clock_event_reasons_uses_throttle_reasons() -> None:
    nvml = FakeNvml([FakeGpu(reasons=0x20)], missing=("nvmlDeviceGetCurrentClocksEventReasons",))
    (sample,) = sampler.NvmlGpus(nvml).read([])
    assert sample["throttle"] == ["sw_thermal"]


def test_xid_events_are_counted_per_gpu_with_the_last_code() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu()], xids=((1, 79), (1, 48)))
    first, second = sampler.NvmlGpus(nvml).read([])
    assert (first["xid"], first["xid_last"]) == (0, None)
    assert (second["xid"], second["xid_last"]) == (2, 48)


def test_xid_is_null_where_events_cannot_be_registered() -> None:
    nvml = FakeNvml([FakeGpu()], unsupported=("nvmlDeviceRegisterEvents",))
    (sample,) = sampler.NvmlGpus(nvml).read([])
    assert sample["xid"] is None and sample["util"] == 90


def test_no_driver_means_no_gpu_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler.shutil, "which", lambda _name: None)
    assert sampler.open_gpus(FakeNvml([FakeGpu()], no_driver=True)) is None


def test_run_sends_host_and_gpu_samples_and_shuts_nvml_down() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu(util=3)])
    events: list[tuple[str, dict[str, Any]]] = []
    done = threading.Event()
    thread = threading.Thread(target=sampler.run, args=(0.25, "no-such-job", lambda ev, **f: events.append((ev, f)),
                                                       done), kwargs={"nvml": nvml})
    thread.start()
    time.sleep(1.2)
    done.set()
    thread.join(5)
    kinds = [(ev, f["kind"], f.get("gpu")) for ev, f in events]
    assert kinds[:3] == [("tel", "host", None), ("tel", "gpu", 0), ("tel", "gpu", 1)]
    assert 3 <= kinds.count(("tel", "host", None)) <= 5
    gpu1 = [f for _, f in events if f.get("gpu") == 1]
    assert all(f["util"] == 3 and f["host"] == events[0][1]["host"] for f in gpu1)
    assert nvml.calls["nvmlDeviceGetHandleByIndex"] == 2 and nvml.calls["nvmlShutdown"] == 1
