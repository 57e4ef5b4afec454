"""What the shipped probe (`orchestrator.remote.probe`) found on a host, as one typed dataclass.

The probe prints JSON; `HostFacts.from_probe` reads it once, tolerating what an older or a
partial probe leaves out, and every reader (the plan, doctor's checks, the launch preflight,
the report) uses the typed fields. `raw` keeps the JSON as it came, for facts.json and
`distrun doctor --json` (whose `facts` are the probe's own keys).

Sizes are bytes; None means unknown (or, where a field says so, unlimited / not probed).
The fast facts (hostname .. port_exact_free) come from every probe; the full ones (os ..
disk) only from doctor's `full` probe; listen/connect/resolved only from a probe round where
the master listened and the others connected to it; entry only when the job's entry was asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True)
class TorchInfo:
    """What the host's torch is: imported (GPU hosts) or read from its files (elsewhere)."""

    imported: bool = False
    version: str | None = None
    cuda: str | None = None  # the CUDA torch was built for; None: a CPU build
    cuda_available: bool | None = None
    nccl: str | None = None  # the NCCL torch loaded (GPU hosts only)
    cudnn: str | None = None
    gloo: bool | None = None
    nccl_available: bool | None = None
    error: str | None = None  # why torch did not import (or is not installed)
    control_plane: bool | None = None  # it serves a rank's Flight Recorder (None: not known)

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> TorchInfo:
        return cls(imported=bool(data.get("imported")), version=_str(data.get("version")), cuda=_str(data.get("cuda")),
                   cuda_available=_bool(data.get("cuda_available")), nccl=_str(data.get("nccl")),
                   cudnn=_str(data.get("cudnn")), gloo=_bool(data.get("gloo")),
                   nccl_available=_bool(data.get("nccl_available")), error=_str(data.get("error")),
                   control_plane=_bool(data.get("control_plane")))


@dataclass(frozen=True)
class GpuProcess:
    pid: int | None
    used_mib: int = 0


@dataclass(frozen=True)
class GpuDevice:
    index: int | None
    name: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    ecc_uncorrected: int | None = None  # None: ECC not reported
    persistence: bool | None = None
    processes: tuple[GpuProcess, ...] = ()

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> GpuDevice:
        processes = tuple(GpuProcess(_int(p.get("pid")), _int(p.get("used_mib")) or 0)
                          for p in data.get("processes") or [] if isinstance(p, Mapping))
        return cls(index=_int(data.get("index")), name=_str(data.get("name")),
                   memory_total_mib=_int(data.get("memory_total_mib")),
                   memory_used_mib=_int(data.get("memory_used_mib")),
                   ecc_uncorrected=_int(data.get("ecc_uncorrected")), persistence=_bool(data.get("persistence")),
                   processes=processes)


@dataclass(frozen=True)
class GpuInfo:
    source: str = "none"  # nvml | nvidia-smi | none
    driver: str | None = None
    devices: tuple[GpuDevice, ...] = ()

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> GpuInfo:
        devices = tuple(GpuDevice.from_probe(d) for d in data.get("devices") or [] if isinstance(d, Mapping))
        return cls(source=str(data.get("source") or "none"), driver=_str(data.get("driver")), devices=devices)


@dataclass(frozen=True)
class Space:
    """A file system: the path asked about, whether it exists, its size and free space."""

    path: str | None = None
    exists: bool = True
    total: int | None = None
    free: int | None = None

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> Space:
        exists = data.get("exists")
        return cls(path=_str(data.get("path")), exists=exists if isinstance(exists, bool) else True,
                   total=_int(data.get("total")), free=_int(data.get("free")))


@dataclass(frozen=True)
class Memory:
    total: int | None = None
    available: int | None = None


@dataclass(frozen=True)
class Listen:
    """The master's test listener on the rendezvous port."""

    port: int | None = None
    ok: bool = False
    error: str | None = None
    accepted: tuple[str, ...] = ()


@dataclass(frozen=True)
class Connect:
    """Another host's test connection to the master's address and port.

    `skipped` (set by the controller, not the probe): why this host could not try, e.g. its
    probe ran after the master had stopped listening; such a test failed nothing.
    """

    addr: str | None = None
    port: int | None = None
    ok: bool = False
    error: str | None = None
    ms: float | None = None
    skipped: str | None = None


@dataclass(frozen=True)
class Resolved:
    """A name looked up on the host."""

    addrs: tuple[str, ...] = ()
    error: str | None = None

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> Resolved:
        return cls(tuple(str(a) for a in data.get("addrs") or []), _str(data.get("error")))


@dataclass(frozen=True)
class EntryPoint:
    """The job's script or module as the host's python would find it (probe option `entry`)."""

    kind: str = "script"  # script | module
    name: str = ""
    ok: bool = False
    found: str | None = None
    error: str | None = None

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> EntryPoint:
        return cls(kind=str(data.get("kind") or "script"), name=str(data.get("name") or ""),
                   ok=bool(data.get("ok")), found=_str(data.get("found")), error=_str(data.get("error")))


@dataclass(frozen=True)
class ExtensionLock:
    """A torch C++ extension build lock on a host: its path, age, and whether a process builds there."""

    path: str
    age_s: float | None = None
    building: bool = False

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> ExtensionLock:
        return cls(str(data.get("path")), _float(data.get("age_s")), bool(data.get("building")))


@dataclass(frozen=True)
class PySpy:
    """py-spy on a host: its path (None: not found), kernel.yama.ptrace_scope, the probing user's uid."""

    path: str | None = None
    ptrace_scope: int | None = None
    uid: int | None = None

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> PySpy:
        return cls(_str(data.get("path")), _int(data.get("ptrace_scope")), _int(data.get("uid")))

    def problem(self) -> str | None:
        """Why py-spy cannot dump this host's ranks; None when it can."""
        if self.path is None:
            return "py-spy not found beside the host's python nor on its PATH"
        if self.ptrace_scope == 3:
            return "kernel.yama.ptrace_scope is 3: no process may be traced"
        if self.ptrace_scope == 2 and self.uid != 0:
            return "kernel.yama.ptrace_scope is 2: only root (CAP_SYS_PTRACE) may trace the ranks"
        return None


@dataclass(frozen=True)
class HostFacts:
    """Everything the probe found on one host (see the module docstring for which probe gives what).

    Attributes:
        node: The inventory name of the host.
        gpus: GPUs the driver exposes (/proc); `gpu_total` prefers the NVML/nvidia-smi list.
        interfaces: Interface name -> IPv4 addresses with prefix length ("10.0.0.10/24").
        route_iface: The interface whose route reaches the master.
        free_port: On the master: the first free port found (auto port).
        port_exact_free: On the master: whether the job's fixed port is free.
        memlock: The soft `ulimit -l`; None: unlimited (or not probed).
        pyspy: py-spy on the host (for `distrun stack` and the hang watchdog); None: not probed.
        clock_skew: Seconds the host's clock is ahead of the controller's (added by the controller).
        entry: The job's entry on the host, when the probe was asked to look for it.
        deepspeed: The version of the deepspeed the job's python finds; None: not installed (or not probed).
        extensions_root: Where torch JIT-builds C++ extensions on the host (None: not probed).
        extension_locks: The build locks found there.
        raw: The probe's JSON as it came.
    """

    node: str
    hostname: str | None = None
    python: str | None = None
    python_path: str | None = None
    torch: str | None = None
    gpus: int = 0
    interfaces: dict[str, list[str]] = field(default_factory=dict)
    home: str = "~"
    route_iface: str | None = None
    free_port: int | None = None
    port_exact_free: bool | None = None
    os: str | None = None
    kernel: str | None = None
    torch_info: TorchInfo = field(default_factory=TorchInfo)
    gpu: GpuInfo | None = None
    cpus: int | None = None
    cpus_usable: int | None = None
    memory: Memory = field(default_factory=Memory)
    shm: Space | None = None
    memlock: int | None = None
    disk: Space = field(default_factory=Space)
    pyspy: PySpy | None = None
    clock: float | None = None
    clock_skew: float | None = None
    listen: Listen | None = None
    connect: Connect | None = None
    resolved: dict[str, Resolved] = field(default_factory=dict)
    entry: EntryPoint | None = None
    deepspeed: str | None = None
    extensions_root: str | None = None
    extension_locks: tuple[ExtensionLock, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_probe(cls, node: str, data: Mapping[str, Any]) -> HostFacts:
        """Read a probe's JSON; missing or mistyped values become the defaults (unknown)."""
        listen, connect, memory = _dict(data.get("listen")), _dict(data.get("connect")), _dict(data.get("memory"))
        extensions = _dict(data.get("extensions"))
        return cls(
            node=node, hostname=_str(data.get("hostname")), python=_str(data.get("python")),
            python_path=_str(data.get("python_path")), torch=_str(data.get("torch")), gpus=_int(data.get("gpus")) or 0,
            interfaces={str(k): [str(a) for a in v or []] for k, v in _dict(data.get("interfaces")).items()},
            home=str(data.get("home") or "~"), route_iface=_str(data.get("route_iface")),
            free_port=_int(data.get("free_port")), port_exact_free=_bool(data.get("port_exact_free")),
            os=_str(data.get("os")), kernel=_str(data.get("kernel")),
            torch_info=TorchInfo.from_probe(_dict(data.get("torch_info"))),
            gpu=GpuInfo.from_probe(data["gpu"]) if isinstance(data.get("gpu"), Mapping) else None,
            cpus=_int(data.get("cpus")), cpus_usable=_int(data.get("cpus_usable")),
            memory=Memory(_int(memory.get("total")), _int(memory.get("available"))),
            shm=Space.from_probe(data["shm"]) if isinstance(data.get("shm"), Mapping) else None,
            memlock=_int(data.get("memlock")), disk=Space.from_probe(_dict(data.get("disk"))),
            pyspy=PySpy.from_probe(data["pyspy"]) if isinstance(data.get("pyspy"), Mapping) else None,
            clock=_float(data.get("clock")), clock_skew=_float(data.get("clock_skew")),
            listen=Listen(_int(listen.get("port")), bool(listen.get("ok")), _str(listen.get("error")),
                          tuple(str(a) for a in listen.get("accepted") or [])) if listen else None,
            connect=Connect(_str(connect.get("addr")), _int(connect.get("port")), bool(connect.get("ok")),
                            _str(connect.get("error")), _float(connect.get("ms"))) if connect else None,
            resolved={str(name): Resolved.from_probe(_dict(r)) for name, r in _dict(data.get("resolved")).items()},
            entry=EntryPoint.from_probe(data["entry"]) if isinstance(data.get("entry"), Mapping) else None,
            deepspeed=_str(data.get("deepspeed")), extensions_root=_str(extensions.get("root")),
            extension_locks=tuple(ExtensionLock.from_probe(_dict(lock)) for lock in extensions.get("locks") or []),
            raw=dict(data),
        )

    @property
    def devices(self) -> tuple[GpuDevice, ...]:
        return self.gpu.devices if self.gpu is not None else ()

    @property
    def gpu_total(self) -> int:
        """GPUs on the host: NVML's or nvidia-smi's list, else the driver's /proc count."""
        return len(self.devices) if self.gpu is not None else self.gpus

    @property
    def torch_version(self) -> str | None:
        """torch's version: as torch reports it (full probe), else from its package files."""
        return self.torch_info.version or self.torch
