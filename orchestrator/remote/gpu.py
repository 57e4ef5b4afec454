"""The host's NVIDIA GPUs, read the one way the probe, the sampler and the supervisor share. Stdlib only.

A value the driver cannot give is unknown, whichever way it is read: nvidia-smi prints it empty,
as `N/A`, `Not Supported` or a note in brackets (`[N/A]`, `[Not Supported]`, `[Unknown Error]`,
`[Insufficient Permissions]`), and NVML gives a process's `usedGpuMemory` as None. Each becomes
None, never 0, and a row with an unknown value is kept: a process whose memory is not shown
(in a container, on MIG) still holds its GPU.

After a job, `GpuHolders` finds the job's processes that still hold GPU memory, and says what
ending them freed ("freed 2.1 GB on gpu0 held by pid 4242").
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
SMI_TIMEOUT = 20.0
SMI_NOTES = ("", "N/A", "Not Supported")
SHIPPED_NVML = "distrun_pynvml"  # the name the controller ships nvidia-ml-py's module under
SMI_FACT_FIELDS = (
    "index,name,memory.total,memory.used,driver_version,persistence_mode,"
    "ecc.errors.uncorrected.volatile.total,uuid"
)
SMI_APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
SMI_INDEX_FIELDS = ("index", "uuid")
RELEASE_WAIT = 5.0  # how long the driver may take to free an ended process's memory
RELEASE_POLL = 0.1
HELD_BY = " held by pid "  # in every line `GpuHolders.released` words


# ---------------------------------------------------------------- nvidia-smi


def smi_cell(text: str) -> str | None:
    """One CSV cell of nvidia-smi; None when it says the value is not available."""
    text = text.strip()
    return None if text in SMI_NOTES or text.startswith("[") else text


def smi_number(text: str) -> float | None:
    value = smi_cell(text)
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def smi_int(text: str) -> int | None:
    value = smi_number(text)
    return None if value is None else int(value)


def parse_smi_csv(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-...=<fields> --format=csv,noheader,nounits`, cells stripped;
    lines with another number of cells ("No devices were found", an error) are left out."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == len(fields):
            rows.append(dict(zip(fields, cells, strict=True)))
    return rows


@dataclass(frozen=True)
class SmiApp:
    """A compute process on a GPU, as `--query-compute-apps` shows it."""

    uuid: str
    pid: int
    used_mib: float | None


def parse_smi_apps(text: str) -> list[SmiApp]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits`."""
    apps = []
    for row in parse_smi_csv(text, SMI_APP_FIELDS):
        pid = smi_int(row["pid"])
        if pid is not None:
            apps.append(SmiApp(row["gpu_uuid"], pid, smi_number(row["used_memory"])))
    return apps


def parse_smi_facts(text: str, apps: list[SmiApp]) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=SMI_FACT_FIELDS --format=csv,noheader,nounits` -> gpu facts."""
    devices = []
    driver = None
    for row in parse_smi_csv(text, tuple(SMI_FACT_FIELDS.split(","))):
        index = smi_int(row["index"])
        if index is None:
            continue
        driver = driver or smi_cell(row["driver_version"])
        mode = smi_cell(row["persistence_mode"])
        devices.append({
            "index": index,
            "name": row["name"],
            "memory_total_mib": smi_int(row["memory.total"]),
            "memory_used_mib": smi_int(row["memory.used"]),
            "ecc_uncorrected": smi_int(row["ecc.errors.uncorrected.volatile.total"]),
            "persistence": None if mode is None else mode.lower() == "enabled",
            "processes": [{"pid": app.pid, "used_mib": None if app.used_mib is None else int(app.used_mib)}
                          for app in apps if app.uuid == row["uuid"]],
        })
    return {"source": "nvidia-smi", "driver": driver, "devices": devices}


def smi_query(*args: str) -> str | None:
    """What `nvidia-smi ARGS --format=csv,noheader,nounits` printed; None when it is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        result = subprocess.run([smi, *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                timeout=SMI_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def smi_facts() -> dict[str, Any] | None:
    """GPU facts from nvidia-smi, or None when it is missing or fails."""
    gpus = smi_query(f"--query-gpu={SMI_FACT_FIELDS}")
    if gpus is None:
        return None
    apps = smi_query(f"--query-compute-apps={','.join(SMI_APP_FIELDS)}") or ""
    return parse_smi_facts(gpus, parse_smi_apps(apps))


# ---------------------------------------------------------------- NVML


def gpu_count() -> int:
    """GPUs the NVIDIA driver exposes, without loading any library."""
    try:
        return len([d for d in os.listdir("/proc/driver/nvidia/gpus") if d])
    except OSError:
        return 0


def has_nvidia_driver() -> bool:
    return gpu_count() > 0 or os.path.exists("/dev/nvidiactl")


def import_nvml() -> Any:
    """The host's own NVML bindings, else the copy the controller shipped, else None."""
    for name in ("pynvml", SHIPPED_NVML):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def used_bytes(process: Any) -> int | None:
    """An NVML process record's device memory; None when NVML cannot tell."""
    used = getattr(process, "usedGpuMemory", None)
    return None if used is None else int(used)


def nvml_facts(nv: Any) -> dict[str, Any]:
    """Driver and per-GPU facts through an NVML binding module (nvidia-ml-py's `pynvml`).

    Raises:
        nv.NVMLError: NVML could not be initialised or a required query failed.
    """
    nv.nvmlInit()
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        devices = [_nvml_device(nv, index) for index in range(nv.nvmlDeviceGetCount())]
    finally:
        nv.nvmlShutdown()
    return {"source": "nvml", "driver": driver, "devices": devices}


def _nvml_device(nv: Any, index: int) -> dict[str, Any]:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    memory = nv.nvmlDeviceGetMemoryInfo(handle)

    def optional(query: Callable[[], Any]) -> Any:
        try:
            return query()
        except nv.NVMLError:
            return None

    ecc = optional(lambda: nv.nvmlDeviceGetTotalEccErrors(
        handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
    persistence = optional(lambda: nv.nvmlDeviceGetPersistenceMode(handle))
    processes = optional(lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle)) or []
    return {
        "index": index,
        "name": _text(nv.nvmlDeviceGetName(handle)),
        "memory_total_mib": int(memory.total) // MIB,
        "memory_used_mib": int(memory.used) // MIB,
        "ecc_uncorrected": None if ecc is None else int(ecc),
        "persistence": None if persistence is None else persistence == 1,
        "processes": [{"pid": int(p.pid), "used_mib": None if used_bytes(p) is None else used_bytes(p) // MIB}
                      for p in processes],
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------- what a job left on its GPUs


@dataclass(frozen=True)
class Holder:
    """A process holding memory on a GPU (bytes None: the driver does not say how much)."""

    gpu: int
    pid: int
    used: int | None

    def size(self) -> str:
        return "memory" if self.used is None else f"{self.used / 1e9:.1f} GB"


class GpuHolders:
    """Which processes hold memory on this host's GPUs: NVML when it starts, else nvidia-smi."""

    def __init__(self, nvml: Any = None) -> None:
        self.nvml = nvml

    @classmethod
    def open(cls) -> GpuHolders | None:
        """A reader for this host, or None when it has no NVIDIA driver or neither NVML nor nvidia-smi works."""
        if not has_nvidia_driver():
            return None
        nvml = import_nvml()
        if nvml is not None:
            try:
                nvml.nvmlInit()
                return cls(nvml)
            except Exception:  # no driver library, driver/library mismatch: try nvidia-smi
                pass
        return cls() if shutil.which("nvidia-smi") else None

    def all(self) -> list[Holder]:
        """Every compute process on every GPU."""
        return self._nvml() if self.nvml is not None else self._smi()

    def _nvml(self) -> list[Holder]:
        nv, found = self.nvml, []
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            try:
                processes = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except nv.NVMLError:
                continue
            found += [Holder(index, int(p.pid), used_bytes(p)) for p in processes]
        return found

    def _smi(self) -> list[Holder]:
        gpus = parse_smi_csv(smi_query(f"--query-gpu={','.join(SMI_INDEX_FIELDS)}") or "", SMI_INDEX_FIELDS)
        index = {row["uuid"]: smi_int(row["index"]) for row in gpus}
        apps = parse_smi_apps(smi_query(f"--query-compute-apps={','.join(SMI_APP_FIELDS)}") or "")
        return [Holder(index[app.uuid], app.pid, None if app.used_mib is None else int(app.used_mib * MIB))
                for app in apps if index.get(app.uuid) is not None]

    def held_by(self, pids: set[int]) -> list[Holder]:
        return [holder for holder in self.all() if holder.pid in pids]

    def released(self, held: list[Holder], wait: float = RELEASE_WAIT) -> list[str]:
        """Once the processes in `held` were ended: a line for each, saying whether its memory came
        back within `wait` seconds ("freed 2.1 GB on gpu0 held by pid 4242")."""
        deadline = time.monotonic() + wait
        still = set(held)
        while still and time.monotonic() < deadline:
            now = {(h.gpu, h.pid) for h in self.all()}
            still = {h for h in still if (h.gpu, h.pid) in now}
            if still:
                time.sleep(RELEASE_POLL)
        return [f"{holder.size()} on gpu{holder.gpu}{HELD_BY}{holder.pid} not freed {wait:g} s after SIGKILL"
                if holder in still else f"freed {holder.size()} on gpu{holder.gpu}{HELD_BY}{holder.pid}"
                for holder in held]

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
