"""Host and GPU telemetry, sampled on the host and sent to the controller as events.

Runs in a thread of the supervisor (`run`), stdlib only: the job's processes are read from
/proc (psutil where a host has none), and the NVML bindings (nvidia-ml-py's `pynvml`, or the
copy the controller ships as `distrun_pynvml`) are used when they import; without NVML
bindings the GPUs are read with `nvidia-smi`; a host without GPUs sends host samples only.
NVML is initialised and its device handles are opened once, when the sampler starts.

Every sample is one event `emit("tel", **fields)`, which the supervisor writes as the line
`\\x1e{"ev": "tel", ...}` on the same channel as the job's log lines; the supervisor also has
the sampler append every sample as a JSON line to `<node>.telemetry.jsonl` in the job's
host-side directory, beside `<node>.log`, which outlives the controller. A field the host
or driver does not expose is null. Every sample has:

    kind        "host" or "gpu"
    t           wall-clock time of the sample on the host (seconds since the epoch)
    host        the host's name

`kind: "host"`, one per interval:

    interval                    seconds between samples
    cpus                        logical CPUs
    cpu_pct                     whole-host CPU busy over the last interval, 0-100 (all CPUs)
    load1                       1-minute load average
    mem_used_mb, mem_total_mb   MemTotal - MemAvailable, and MemTotal
    net_rx_bytes, net_tx_bytes  cumulative bytes received/sent on every interface but lo
    net_rx_bps, net_tx_bps      bytes per second over the last interval
    job_procs                   processes of the job found (DISTRUN_JOB_ID=<job id> in their environment)
    job_cpu_pct                 their CPU over the last interval, % of one CPU (200 = two CPUs busy)
    job_rss_mb                  their resident memory, summed
    sampler_cpu_s               CPU seconds the sampler thread has used so far
    rdzv                        while torchrun has no workers yet: its connection to the rendezvous
                                endpoint, "established", "connecting" or "none" (remote/rdzvconn.py);
                                absent from the first sample with workers on

`kind: "gpu"`, one per GPU per interval:

    gpu                         index, as NVML and nvidia-smi number the GPUs
    source                      "nvml" or "nvidia-smi"
    util                        % of the last sample period in which a kernel ran
    mem_used_mb, mem_total_mb   device memory
    temp_c, power_w, power_limit_w, sm_clock_mhz
    throttle                    active clock-throttle reasons, e.g. ["sw_power_cap", "hw_thermal"]
    ecc_uncorrected             uncorrectable ECC errors since the driver loaded (volatile count)
    xid                         XID critical-error events seen since the sampler started (NVML only)
    xid_last                    the last XID code seen
    job_mem_mb                  device memory held by the job's processes
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from orchestrator.remote.gpu import (
    SMI_APP_FIELDS,
    import_nvml,
    parse_smi_apps,
    parse_smi_csv,
    smi_cell,
    smi_int,
    smi_number,
    used_bytes,
)
from orchestrator.remote.private import open_private
from orchestrator.remote.rdzvconn import connection, proc_address

MIN_INTERVAL = 0.25
REDISCOVER_EVERY = 5  # samples between scans of /proc for the job's processes
SMI_TIMEOUT = 10.0
XID_DRAIN_MAX = 64
MB = 1024 * 1024

# NVML's clock-throttle ("clocks event") reason bits and the names samples carry.
THROTTLE_REASONS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"), (0x80, "hw_power_brake"),
    (0x100, "display_clock"),
)
# NVML error codes that mean "never on this GPU": stop asking.
NVML_NOT_SUPPORTED = 3
NVML_FUNCTION_NOT_FOUND = 13

SMI_GPU_FIELDS = (
    "index", "uuid", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu", "power.draw",
    "power.limit", "clocks.sm", "clocks_throttle_reasons.active", "ecc.errors.uncorrected.volatile.total",
)


def throttle_names(mask: int | None) -> list[str] | None:
    """The names of the reason bits set in an NVML throttle mask."""
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


# ---------------------------------------------------------------- host


def read_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs together, from /proc/stat."""
    with open("/proc/stat", "rb") as fh:
        values = [int(v) for v in fh.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = values + [0] * (8 - len(values))
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def read_memory() -> tuple[float, float]:
    """(used, total) MB: MemTotal - MemAvailable, and MemTotal."""
    fields: dict[bytes, int] = {}
    with open("/proc/meminfo", "rb") as fh:
        for line in fh:
            key, _, rest = line.partition(b":")
            if key in (b"MemTotal", b"MemAvailable"):
                fields[key] = int(rest.split()[0])
            if len(fields) == 2:
                break
    total = fields.get(b"MemTotal", 0) / 1024
    return total - fields.get(b"MemAvailable", 0) / 1024, total


def read_network() -> tuple[int, int]:
    """(received, sent) bytes on every interface but loopback, from /proc/net/dev."""
    rx = tx = 0
    with open("/proc/net/dev", "rb") as fh:
        for line in fh.readlines()[2:]:
            name, _, rest = line.partition(b":")
            if name.strip() == b"lo":
                continue
            values = rest.split()
            rx += int(values[0])
            tx += int(values[8])
    return rx, tx


def _rate(now: int, before: int, seconds: float) -> float | None:
    """Per-second rate of a counter; a counter that went back (interface reset) reads 0."""
    return round(max(0, now - before) / seconds, 1) if seconds > 0 else None


# ---------------------------------------------------------------- the job's processes


_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def read_proc_stat(pid: int) -> tuple[float, int] | None:
    """(CPU seconds, RSS bytes) of a process from /proc/PID/stat; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the name: state is field 3 of proc(5); utime 14, stime 15, rss 24.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK, int(fields[21]) * _PAGE


class PsutilReader:
    """(CPU seconds, RSS bytes) through psutil, keeping one Process object per pid."""

    def __init__(self, psutil: Any) -> None:
        self.psutil = psutil
        self.procs: dict[int, Any] = {}

    def __call__(self, pid: int) -> tuple[float, int] | None:
        try:
            proc = self.procs.get(pid) or self.procs.setdefault(pid, self.psutil.Process(pid))
            with proc.oneshot():
                times = proc.cpu_times()
                rss = proc.memory_info().rss
        except self.psutil.Error:
            self.procs.pop(pid, None)
            return None
        return times.user + times.system, rss


def process_reader() -> Callable[[int], tuple[float, int] | None]:
    """/proc where the host has one (no import: psutil's costs every host about 20 ms of CPU at
    the job's start, beside the ranks' own imports), else psutil when it imports."""
    if os.path.exists("/proc/self/stat"):
        return read_proc_stat
    try:
        import psutil
    except ImportError:
        return read_proc_stat
    return PsutilReader(psutil)


class JobProcesses:
    """The job's processes on this host and their CPU and memory.

    Finding them means reading every process's environment, so the set is kept and
    refreshed every REDISCOVER_EVERY samples, when one has gone, or while none is found.
    """

    def __init__(self, job_id: str, reader: Callable[[int], tuple[float, int] | None],
                 node: str | None = None) -> None:
        self.job_id = job_id
        self.node = node
        self.reader = reader
        self.pids: list[int] = []
        self.cpu: dict[int, float] = {}
        self.samples = 0

    def _discover(self) -> None:
        # The bundle installs this module before the supervisor, so import it when used.
        from orchestrator.remote.supervisor import job_processes

        self.pids = job_processes(self.job_id, os.getpid(), self.node)

    def sample(self, seconds: float) -> tuple[list[int], float | None, float]:
        """(pids, CPU % of one core over `seconds`, RSS MB) of the job's processes."""
        if not self.pids or self.samples % REDISCOVER_EVERY == 0:
            self._discover()
        self.samples += 1
        cpu: dict[int, float] = {}
        rss = 0
        for pid in self.pids:
            usage = self.reader(pid)
            if usage is not None:
                cpu[pid], pid_rss = usage
                rss += pid_rss
        if len(cpu) < len(self.pids):
            self.samples = 0
        # A process seen for the first time contributes from its next sample on.
        used = sum(t - self.cpu[pid] for pid, t in cpu.items() if pid in self.cpu)
        had_before = bool(self.cpu)
        self.cpu = cpu
        self.pids = list(cpu)
        pct = 100.0 * used / seconds if had_before and seconds > 0 else None
        return self.pids, pct, rss / MB


class HostSampler:
    """Whole-host figures and the job's processes, as rates over the time between samples."""

    def __init__(self, job_id: str, interval: float,
                 reader: Callable[[int], tuple[float, int] | None] | None = None, node: str | None = None,
                 rdzv: tuple[str, int] | None = None) -> None:
        self.interval = interval
        self.rdzv = proc_address(*rdzv) if rdzv else None  # read until the workers start
        self.host = socket.gethostname()
        self.cpus = os.cpu_count() or 1
        self.job = JobProcesses(job_id, reader or process_reader(), node)
        self.last_at = time.monotonic()
        self.last_cpu = read_cpu()
        self.last_net = read_network()

    def sample(self) -> tuple[dict[str, Any], list[int]]:
        """One host sample and the job's pids (for the GPUs' per-process memory)."""
        now = time.monotonic()
        seconds = now - self.last_at
        busy, total = read_cpu()
        d_total = total - self.last_cpu[1]
        cpu_pct = 100.0 * (busy - self.last_cpu[0]) / d_total if d_total > 0 else None
        used_mb, total_mb = read_memory()
        rx, tx = read_network()
        pids, job_cpu, job_rss = self.job.sample(seconds)
        sample = {
            "kind": "host", "t": time.time(), "host": self.host, "interval": self.interval, "cpus": self.cpus,
            "cpu_pct": _round(cpu_pct), "load1": round(os.getloadavg()[0], 2),
            "mem_used_mb": _round(used_mb), "mem_total_mb": _round(total_mb),
            "net_rx_bytes": rx, "net_tx_bytes": tx,
            "net_rx_bps": _rate(rx, self.last_net[0], seconds), "net_tx_bps": _rate(tx, self.last_net[1], seconds),
            "job_procs": len(pids), "job_cpu_pct": _round(job_cpu), "job_rss_mb": _round(job_rss),
            "sampler_cpu_s": round(time.thread_time(), 4),
        }
        if self.rdzv and len(pids) > 1:
            self.rdzv = None  # torchrun started its workers: it is past the rendezvous
        if self.rdzv:
            sample["rdzv"] = connection(self.rdzv, pids)
        self.last_at, self.last_cpu, self.last_net = now, (busy, total), (rx, tx)
        return sample, pids


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


# ---------------------------------------------------------------- GPUs


class GpuReader(Protocol):
    source: str

    def read(self, job_pids: list[int]) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class XidEvents:
    """XID critical errors, counted per GPU from an NVML event set (when the driver allows it)."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml = nvml
        self.counts = [0] * len(handles)
        self.last: list[int | None] = [None] * len(handles)
        try:
            self.events: Any = nvml.nvmlEventSetCreate()
            for handle in handles:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self.events)
        except (nvml.NVMLError, AttributeError):
            self.events = None

    def drain(self) -> None:
        """Count the events that arrived since the last call, without waiting."""
        if self.events is None:
            return
        for _ in range(XID_DRAIN_MAX):
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
                index = self.nvml.nvmlDeviceGetIndex(data.device)
            except self.nvml.NVMLError:
                return  # NVML_ERROR_TIMEOUT: nothing (more) is pending
            if 0 <= index < len(self.counts):
                self.counts[index] += 1
                self.last[index] = int(data.eventData)

    def count(self, index: int) -> tuple[int | None, int | None]:
        return (None, None) if self.events is None else (self.counts[index], self.last[index])

    def close(self) -> None:
        if self.events is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self.events)


class NvmlGpus:
    """Every GPU through NVML; handles are opened once, in the constructor.

    Raises:
        nvml.NVMLError: NVML cannot be initialised (no driver, no library).
    """

    source = "nvml"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.unsupported: set[tuple[str, int]] = set()
        self.reasons = _throttle_function(nvml, self.handles)
        self.xid = XidEvents(nvml, self.handles)

    def _get(self, what: str, index: int, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None when this GPU cannot say; never asks again what it does not support."""
        if (what, index) in self.unsupported:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) in (NVML_NOT_SUPPORTED, NVML_FUNCTION_NOT_FOUND):
                self.unsupported.add((what, index))
            return None

    def read(self, job_pids: list[int]) -> list[dict[str, Any]]:
        self.xid.drain()
        return [self._read_one(i, h, set(job_pids)) for i, h in enumerate(self.handles)]

    def _read_one(self, index: int, handle: Any, job_pids: set[int]) -> dict[str, Any]:
        nvml, get = self.nvml, self._get
        util = get("util", index, nvml.nvmlDeviceGetUtilizationRates, handle)
        mem = get("mem", index, nvml.nvmlDeviceGetMemoryInfo, handle)
        power = get("power", index, nvml.nvmlDeviceGetPowerUsage, handle)
        limit = get("limit", index, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        mask = get("throttle", index, self.reasons, handle) if self.reasons else None
        procs = get("procs", index, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        xid, xid_last = self.xid.count(index)
        return {
            "gpu": index, "source": self.source,
            "util": None if util is None else util.gpu,
            "mem_used_mb": None if mem is None else _round(mem.used / MB),
            "mem_total_mb": None if mem is None else _round(mem.total / MB),
            "temp_c": get("temp", index, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
            "power_w": None if power is None else _round(power / 1000),
            "power_limit_w": None if limit is None else _round(limit / 1000),
            "sm_clock_mhz": get("clock", index, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            "throttle": throttle_names(mask),
            "ecc_uncorrected": get("ecc", index, nvml.nvmlDeviceGetTotalEccErrors, handle,
                                   nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
            "xid": xid, "xid_last": xid_last,
            "job_mem_mb": None if procs is None else job_memory(
                [None if used_bytes(p) is None else used_bytes(p) / MB for p in procs if p.pid in job_pids]),
        }

    def close(self) -> None:
        self.xid.close()
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def _throttle_function(nvml: Any, handles: list[Any]) -> Callable[[Any], int] | None:
    """The newer `...ClocksEventReasons` where the driver has it, else `...ClocksThrottleReasons`."""
    names = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    candidates = [getattr(nvml, name) for name in names if hasattr(nvml, name)]
    for fn in candidates:
        try:
            if handles:
                fn(handles[0])
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == NVML_FUNCTION_NOT_FOUND:
                continue
        return fn
    return None


def job_memory(used_mb: list[float | None]) -> float | None:
    """MB the job's processes hold on one GPU: unknown (None) when one's memory is."""
    return None if None in used_mb else _round(sum(mb for mb in used_mb if mb is not None))


def _smi_hex(text: str) -> int | None:
    value = smi_cell(text)
    try:
        return None if value is None else int(value, 16)
    except ValueError:
        return None


def parse_smi_gpus(text: str) -> list[dict[str, Any]]:
    """GPU samples from `nvidia-smi --query-gpu=<SMI_GPU_FIELDS> --format=csv,noheader,nounits`.

    Values nvidia-smi cannot give (`[N/A]`, `[Not Supported]`) become None. Each sample has
    the uuid under `uuid`, for matching the compute-apps query.
    """
    samples = []
    for row in parse_smi_csv(text, SMI_GPU_FIELDS):
        index = smi_int(row["index"])
        if index is None:
            continue
        mask = _smi_hex(row["clocks_throttle_reasons.active"])
        ecc, util, temp, clock = (smi_int(row[k]) for k in (
            "ecc.errors.uncorrected.volatile.total", "utilization.gpu", "temperature.gpu", "clocks.sm"))
        samples.append({
            "gpu": index, "source": "nvidia-smi", "uuid": row["uuid"],
            "util": util,
            "mem_used_mb": smi_number(row["memory.used"]), "mem_total_mb": smi_number(row["memory.total"]),
            "temp_c": temp,
            "power_w": smi_number(row["power.draw"]), "power_limit_w": smi_number(row["power.limit"]),
            "sm_clock_mhz": clock,
            "throttle": throttle_names(mask),
            "ecc_uncorrected": ecc,
            "xid": None, "xid_last": None,
        })
    return samples


class SmiGpus:
    """Every GPU through `nvidia-smi` queries, when no NVML bindings import."""

    source = "nvidia-smi"

    def __init__(self, path: str) -> None:
        self.path = path

    def _query(self, *args: str) -> str:
        result = subprocess.run(
            [self.path, *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
            timeout=SMI_TIMEOUT, check=False,
        )
        return result.stdout if result.returncode == 0 else ""

    def read(self, job_pids: list[int]) -> list[dict[str, Any]]:
        gpus = parse_smi_gpus(self._query(f"--query-gpu={','.join(SMI_GPU_FIELDS)}"))
        apps = parse_smi_apps(self._query(f"--query-compute-apps={','.join(SMI_APP_FIELDS)}")) if job_pids else []
        pids = set(job_pids)
        for gpu in gpus:
            uuid = gpu.pop("uuid")
            gpu["job_mem_mb"] = job_memory([app.used_mib for app in apps if app.uuid == uuid and app.pid in pids])
        return gpus

    def close(self) -> None:
        """Nothing is held between queries."""


def open_gpus(nvml: Any = None) -> GpuReader | None:
    """NVML (`nvml`, or the bindings that import) when it sees GPUs, else nvidia-smi, else None."""
    nvml = nvml or import_nvml()
    if nvml is not None:
        try:
            gpus = NvmlGpus(nvml)
        except nvml.NVMLError:
            gpus = None
        if gpus is not None and gpus.handles:
            return gpus
        if gpus is not None:
            gpus.close()
    path = shutil.which("nvidia-smi")
    if path is not None:
        smi = SmiGpus(path)
        if smi.read([]):
            return smi
    return None


# ---------------------------------------------------------------- the loop


def run(interval: float, job_id: str, emit: Callable[..., None], done: threading.Event, nvml: Any = None,
        keep: str | None = None, node: str | None = None, rdzv: tuple[str, int] | None = None) -> None:
    """Send a host sample and one sample per GPU every `interval` seconds until `done` is set.

    Args:
        interval: seconds between samples (at least MIN_INTERVAL).
        job_id: the job whose processes are measured (DISTRUN_JOB_ID in their environment).
        emit: `emit("tel", **fields)` sends one sample; `emit("note", msg=...)` a message.
        done: set when the job has ended.
        nvml: NVML bindings to use instead of importing them (tests pass a fake).
        keep: a file on the host to append every sample to as a JSON line, so the samples
            outlive the controller's connection.
        node: the job's node name on this host (DISTRUN_NODE), for hosts sharing a process table.
        rdzv: the rendezvous address and port, whose connection the samples tell until the workers start.
    """
    interval = max(float(interval), MIN_INTERVAL)
    host = HostSampler(job_id, interval, node=node, rdzv=rdzv)
    gpus = open_gpus(nvml)
    kept = open_private(keep, "a", encoding="utf-8") if keep else None  # closed below
    reported: set[str] = set()
    next_at = time.monotonic()
    try:
        while True:
            next_at = max(next_at + interval, time.monotonic())
            if done.wait(next_at - time.monotonic()):
                return
            try:
                sample_once(host, gpus, emit, kept)
            except Exception as exc:  # a sampler must outlive one bad reading
                message = f"telemetry: sampling failed: {type(exc).__name__}: {exc}"
                if message not in reported:
                    reported.add(message)
                    emit("note", msg=message)
    finally:
        if gpus is not None:
            gpus.close()
        if kept is not None:
            kept.close()


def sample_once(host: HostSampler, gpus: GpuReader | None, emit: Callable[..., None], kept: TextIO | None) -> None:
    """Send one host sample and, when there are GPUs, one sample per GPU."""
    sample, pids = host.sample()
    send([sample], emit, kept)
    if gpus is not None:
        send([{"kind": "gpu", "t": sample["t"], "host": host.host, **gpu} for gpu in gpus.read(pids)], emit, kept)


def send(samples: list[dict[str, Any]], emit: Callable[..., None], kept: TextIO | None) -> None:
    for sample in samples:
        emit("tel", **sample)
    if kept is not None:
        kept.write("".join(json.dumps(sample) + "\n" for sample in samples))
        kept.flush()
