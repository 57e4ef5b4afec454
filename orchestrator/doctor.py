"""`distrun doctor`: probe every host at once and check what makes multi-host jobs hang.

Every selected host runs the shipped probe (`orchestrator.remote.probe`, `full` facts) with
its own python. The master's probe also listens on the rendezvous port while every other
host's probe opens a TCP connection to it, so firewalls and wrong interfaces show up before
a job hangs on them. `run_checks` turns the facts into checks (pure: unit-tested on
handmade facts); `launch_preflight` is the fast subset `distrun launch` runs first.

Exit status: 3 when any selected host could not be reached over SSH (authentication
included), even when other checks failed too: the report is incomplete and the
infrastructure comes first (the reachable hosts are still checked and reported); otherwise
1 when any check is an error (or a warning, with --strict); otherwise 0.

JSON output (`--json`), schema version 1:

    {
      "schema": 1,
      "seconds": 1.42,                      # wall time of the whole run
      "master": {"node": "node0", "addr": "10.0.0.10" | null, "port": 29500 | null},
      "hosts": {                            # every selected host, in inventory order
        "node0": {
          "reachable": true,                # false: SSH connection or authentication failed
          "error": null | "why the host was not reached or its probe failed",
          "facts": null | {...}             # the probe's facts, as below
        }
      },
      "checks": [                           # in the order of the table
        {"name": "torch", "status": "ok" | "warn" | "error",
         "hosts": ["node2"],                # the hosts the status concerns (all, when ok)
         "detail": "torch differs: node[0-1]: 2.13.0; node2: 2.0.0",
         "hint": "one-line fix; empty when ok"}
      ],
      "bandwidth": null | {                 # with --bandwidth
        "backend": "gloo" | "nccl", "nnodes": 3, "world_size": 3, "job_id": "...",
        "min_busbw_gbps": 0.1, "error": null | "why it did not run",
        "results": [{"bytes": 1048576, "time_s": 0.004, "algbw_gbps": 0.26, "busbw_gbps": 0.35}]
      },
      "summary": {"ok": 17, "warn": 1, "error": 0},
      "exit_code": 0
    }

Check names: reachable, probe, python, torch, cuda, nccl, driver, backend, gpus, gpu-busy,
ecc, shm, memlock, disk, clock, iface, master-resolves, port-free, port-reachable, bandwidth.

Facts (per host; sizes in bytes, null when unknown): hostname, python, python_path, torch
(version from package metadata), gpus (count from /proc), interfaces {name: ["addr/prefix"]},
home, route_iface, free_port | port_exact_free, os, kernel, torch_info {imported, version,
cuda, cuda_available, nccl, cudnn, gloo, nccl_available, error}, gpu {source: nvml |
nvidia-smi | none, driver, devices: [{index, name, memory_total_mib, memory_used_mib,
ecc_uncorrected, persistence, processes: [{pid, used_mib}]}]}, cpus, cpus_usable, memory
{total, available}, shm {path, exists, total, free}, memlock (null = unlimited), disk {path,
exists, total, free}, clock (the host's time.time()), clock_skew (seconds the host's clock is
ahead of the controller's when the facts arrived; added by the controller), on the master: listen {port, ok,
error, accepted: [peer addresses]}; on the others: connect {addr, port, ok, error, ms} and
resolved {name: {addrs, error}}.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from importlib import util
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator import remote
from orchestrator.display import fold_hosts
from orchestrator.errors import DistrunError, ExitCode, InfraError, UsageError
from orchestrator.parallel import failures, for_each
from orchestrator.plan import DEFAULT_PORT, HostFacts, choose_master_addr
from orchestrator.spec.model import Inventory, JobSpec, NodeSpec
from orchestrator.transport import RemoteProcess, Transport, transport_for

if TYPE_CHECKING:
    from orchestrator.bandwidth import BandwidthReport
    from orchestrator.launch import Prepared

SCHEMA = 1
GIB = 1 << 30
MIB = 1 << 20
PROBE_TIMEOUT = 60.0
LISTEN_SECONDS = 60.0
POLL = 0.01
EXIT_GRACE = 5.0
EVENT = "\x1e"
MARKS = {"ok": "✓", "warn": "!", "error": "✗"}
COLOURS = {"ok": 32, "warn": 33, "error": 31}


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    ERROR = "error"


@dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, how it went, on which hosts, how to fix it."""

    name: str
    status: Status
    hosts: list[str]
    detail: str
    hint: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "hosts": self.hosts,
                "detail": self.detail, "hint": self.hint}


@dataclass
class HostResult:
    """What became of one host: its facts, or why there are none."""

    node: str
    facts: dict[str, Any] | None = None
    error: str | None = None
    unreachable: bool = False  # SSH connection or authentication failed (else: the probe failed)


@dataclass(frozen=True)
class Thresholds:
    min_shm: int = GIB
    min_disk: int = 10 * GIB
    max_skew: float = 2.0


@dataclass(frozen=True)
class Context:
    """What the checks compare the facts with: the inventory's nodes, the job, the master."""

    nodes: tuple[NodeSpec, ...]
    master: str
    master_addr: str | None = None
    master_addr_error: str | None = None
    master_hostname: str | None = None
    job: JobSpec | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)

    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.nodes if n.name == name)


class PreflightError(DistrunError):
    """A check failed before anything started: exit 1, nothing was launched."""

    exit_code = ExitCode.FAILED


# ---------------------------------------------------------------- running the probes


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def pynvml_source() -> str | None:
    """The source of this controller's nvidia-ml-py `pynvml` module, to ship to hosts without it."""
    spec = util.find_spec("pynvml")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as fh:
        return fh.read()


class ProbeRun:
    """One host's probe as the controller runs it: started, talked to, its facts collected."""

    def __init__(self, transport: Transport, options: dict[str, Any]) -> None:
        self.transport = transport
        self.options = options
        self.proc: RemoteProcess | None = None
        self.listening: dict[str, Any] | None = None
        self.facts: dict[str, Any] | None = None
        self.stderr: list[str] = []
        self.unreachable = False
        self._heard = threading.Event()

    @property
    def name(self) -> str:
        return self.transport.name

    def start(self) -> None:
        """Connect (when not yet connected), start the probe on the host, send it its options.

        Raises:
            InfraError: the host could not be reached (`unreachable` is set) or the command not started.
        """
        try:
            self.transport.connect()
        except Exception:
            self.unreachable = True
            raise
        payload = remote.bundle("probe", ["probe"])
        self.proc = self.transport.start(remote.bootstrap_argv(self.transport.node.python, payload, "distrun-probe"))
        self.proc.stream(self._on_stdout, self.stderr.append)
        self.proc.write(payload + _line(self.options))

    def send(self, message: dict[str, Any]) -> None:
        if self.proc is not None:
            self.proc.write(_line(message))

    def _on_stdout(self, line: str) -> None:
        try:
            data = json.loads(line.removeprefix(EVENT))
        except ValueError:
            return  # a login script's chatter, not the probe
        if not isinstance(data, dict):
            return
        if line.startswith(EVENT):
            self._on_event(data)
            return
        if isinstance(data.get("clock"), (int, float)):
            data["clock_skew"] = data["clock"] - time.time()
        self.facts = data
        self._heard.set()

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("ev") == "listening":
            self.listening = event
            self._heard.set()
        elif event.get("ev") == "need":
            self.send({"module": event.get("module"), "source": pynvml_source()})

    def _wait_heard(self, timeout: float) -> None:
        """Until a line the controller waits for arrives, the probe exits, or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not self._heard.wait(POLL) and time.monotonic() < deadline:
            if self.proc is None or self.proc.wait(0) is not None:
                return

    def wait_listening(self, timeout: float) -> dict[str, Any] | None:
        """The master's `listening` event, or None when the probe ended or timed out first."""
        self._wait_heard(timeout)
        self._heard.clear()
        return self.listening

    def wait_facts(self, timeout: float) -> None:
        """Until the facts arrive, the probe exits, or `timeout` passes."""
        if self.facts is None:
            self._wait_heard(timeout)

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for the facts, then for the probe to exit.

        Raises:
            InfraError: no facts came: the probe failed or timed out.
        """
        if self.proc is None:
            raise InfraError(f"{self.name}: probe not started")
        self.wait_facts(timeout)
        self.proc.close_stdin()
        rc = self.proc.wait(EXIT_GRACE)
        if rc is None:
            self.proc.terminate()
        if self.facts is not None:
            return self.facts
        last = (self.stderr or [f"no output (exit code {rc})" if rc is not None else "timed out"])[-1]
        raise InfraError(f"{self.name}: probe failed using python '{self.transport.node.python}': {last}")


@dataclass
class Round:
    """A probe on every host, the master listening while the others connect."""

    results: dict[str, HostResult]
    master_addr: str | None = None
    master_addr_error: str | None = None
    master_hostname: str | None = None


def probe_round(transports: Mapping[str, Transport], master: NodeSpec, base: dict[str, Any],
                port: int | None, master_addr: str | None,
                per_host: Mapping[str, dict[str, Any]] | None = None) -> Round:
    """Run the probe on every host at once; the master listens, the others connect to it.

    Args:
        transports: Every selected node's transport, by node name; each is connected first.
        master: The rendezvous host, one of `transports`.
        base: Options for every host's probe (e.g. {"full": True}).
        port: The rendezvous port to listen on; None = the first free one from 29500.
        master_addr: The address the others connect to; None = chosen as launch would.
        per_host: More options for some hosts' probes, by node name.

    Returns:
        Every host's result (facts or error) and the master's address as used.
    """
    runs = {name: ProbeRun(t, _options(name == master.name, {**base, **(per_host or {}).get(name, {})}, port))
            for name, t in transports.items()}
    started = for_each(runs.values(), lambda r: r.start(), key=lambda r: r.name)
    results = {name: HostResult(name, error=_one_line(exc), unreachable=runs[name].unreachable)
               for name, exc in failures(started).items()}
    live = {name: run for name, run in runs.items() if name not in results}
    master_run = live.pop(master.name, None)
    listening = master_run.wait_listening(PROBE_TIMEOUT) if master_run else None
    outcome = Round(results)
    if listening is not None:
        outcome.master_hostname = listening.get("hostname")
        outcome.master_addr, outcome.master_addr_error = _master_addr(
            master, listening, transports[master.name], len(transports), master_addr)
    message = _connect_message(listening, outcome)
    for run in live.values():
        run.send(message)
    deadline = time.monotonic() + PROBE_TIMEOUT
    for run in live.values():
        run.wait_facts(max(0.0, deadline - time.monotonic()))
    if master_run is not None:
        live[master.name] = master_run
        master_run.send({"stop": True})
    finished = for_each(live.values(), lambda r: r.finish(PROBE_TIMEOUT), key=lambda r: r.name)
    for name, value in finished.items():
        results[name] = HostResult(name, error=_one_line(value)) if isinstance(value, Exception) \
            else HostResult(name, facts=value)
    return outcome


def _options(is_master: bool, base: dict[str, Any], port: int | None) -> dict[str, Any]:
    if not is_master:
        return {**base, "connect_later": True}
    return {**base, "listen_seconds": LISTEN_SECONDS, **({"port_exact": port} if port else {"port_from": DEFAULT_PORT})}


def _master_addr(master: NodeSpec, listening: dict[str, Any], transport: Transport, nnodes: int,
                 given: str | None) -> tuple[str | None, str | None]:
    """(address, None), or (None, why) when only a loopback address is known for several hosts."""
    if given:
        return given, None
    facts = HostFacts.from_probe(master.name, {"interfaces": listening.get("interfaces") or {}})
    try:
        return choose_master_addr(master, facts, transport.peer_address(), nnodes), None
    except UsageError as exc:
        return None, str(exc)


def _connect_message(listening: dict[str, Any] | None, outcome: Round) -> dict[str, Any]:
    """What the other hosts' probes are told: where to connect (None: nothing listens), what to
    resolve, and the address whose route names the interface they would use."""
    names = [n for n in (outcome.master_addr, outcome.master_hostname) if n]
    target = None
    if listening is not None and listening.get("ok") and outcome.master_addr:
        target = [outcome.master_addr, listening["port"]]
    return {"connect_to": target, "resolve": names, "route_to": outcome.master_addr}


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def close_transports(transports: Mapping[str, Transport]) -> None:
    for_each(transports.values(), lambda t: t.close(), key=lambda t: t.name)


def collect(nodes: list[NodeSpec], master: NodeSpec, job: JobSpec | None) -> tuple[dict[str, HostResult], Context]:
    """Reach every node at once, run the full probe round, and build the checks' context.

    Returns:
        Every node's result, in node order, and the context for `run_checks`.
    """
    transports = {n.name: transport_for(n) for n in nodes}
    workdir = (job.workdir if job else None) or os.getcwd()
    base = {"full": True, "workdir": workdir}
    # torch as the job would import it: the node's python, in the workdir, with the job's env.
    job_env = job.env if job else {}
    contexts = {n.name: {"import_from": {"python": n.python, "cwd": workdir, "env": {**n.env, **job_env}}}
                for n in nodes}
    try:
        outcome = probe_round(transports, master, base, job.rendezvous.port if job else None, None, contexts)
    finally:
        close_transports(transports)
    ctx = Context(tuple(nodes), master.name, outcome.master_addr, outcome.master_addr_error,
                  outcome.master_hostname, job)
    return {n.name: outcome.results[n.name] for n in nodes}, ctx


# ---------------------------------------------------------------- checks


def run_checks(results: Mapping[str, HostResult], ctx: Context) -> list[Check]:
    """Every check over the hosts' facts; hosts without facts are left out of all but the first two.

    Args:
        results: Every selected host's result, in node order.
        ctx: The nodes, job and master the facts are checked against.

    Returns:
        One check per row of the report, in a fixed order.
    """
    probed = {name: r.facts for name, r in results.items() if r.facts is not None}
    return [check_reachable(results), check_probe(results), *(check(probed, ctx) for check in FACT_CHECKS)]


def grouped(values: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    """(value, hosts) pairs, the value most hosts share first; ties keep first-seen order."""
    groups: dict[str, list[str]] = {}
    for host, value in values.items():
        groups.setdefault(value, []).append(host)
    return sorted(groups.items(), key=lambda item: -len(item[1]))


def listing(values: Mapping[str, str]) -> str:
    """`node[0-1]: 2.13.0; node2: 2.0.0`: hosts with identical values gathered."""
    return "; ".join(f"{fold_hosts(hosts)}: {value}" for value, hosts in grouped(values))


def verdict(name: str, problems: Mapping[str, str], shown: Mapping[str, str], status: Status,
            hint: str) -> Check:
    """`status` on the hosts with problems, listing them; else ok, listing what each host has."""
    if problems:
        return Check(name, status, list(problems), listing(problems), hint)
    return Check(name, Status.OK, list(shown), listing(shown) or "no host to check")


def consistency(name: str, values: Mapping[str, str], hint: str, broken: frozenset[str] = frozenset()) -> Check:
    """Error when the hosts' values differ (or any host is `broken`), naming each value's hosts.

    The check's hosts are the odd ones out: those outside the one value most hosts share
    (every host when no value has a majority), and the broken ones.
    """
    labelled = {host: f"{name} {value}" for host, value in values.items()}
    groups = grouped(values)
    if len(groups) > 1:
        top = len(groups[0][1])
        sole_majority = sum(1 for _, hosts in groups if len(hosts) == top) == 1
        majority = set(groups[0][1]) if sole_majority else set()
        odd = [h for h in values if h not in majority or h in broken]
        return Check(name, Status.ERROR, odd, f"{name} differs: {listing(values)}", hint)
    if broken:
        return Check(name, Status.ERROR, [h for h in values if h in broken], listing(labelled), hint)
    return Check(name, Status.OK, list(values), listing(labelled) or "no host to check")


def check_reachable(results: Mapping[str, HostResult]) -> Check:
    down = {name: r.error or "unreachable" for name, r in results.items() if r.unreachable}
    if down:
        return Check("reachable", Status.ERROR, list(down), "; ".join(down.values()),
                     "check the host is up and `ssh USER@HOST` works with the inventory's user, port and "
                     "identity_file; the other hosts were still checked")
    return Check("reachable", Status.OK, list(results), f"{fold_hosts(results)}: connected")


def check_probe(results: Mapping[str, HostResult]) -> Check:
    failed = {name: r.error or "no facts" for name, r in results.items() if not r.unreachable and r.facts is None}
    ran = [name for name, r in results.items() if r.facts is not None]
    if failed:
        return Check("probe", Status.ERROR, list(failed), "; ".join(failed.values()),
                     "set the node's `python:` in the inventory to an interpreter that exists on the host")
    return Check("probe", Status.OK, ran, f"{fold_hosts(ran)}: probe ran" if ran else "no host to probe")


def torch_info(facts: Mapping[str, Any]) -> dict[str, Any]:
    return facts.get("torch_info") or {}


def torch_version(facts: Mapping[str, Any]) -> str | None:
    return torch_info(facts).get("version") or facts.get("torch")


def devices(facts: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((facts.get("gpu") or {}).get("devices") or [])


def gpu_total(facts: Mapping[str, Any]) -> int:
    """GPUs on the host: NVML's or nvidia-smi's list, else the driver's /proc count."""
    return len(devices(facts)) if facts.get("gpu") else int(facts.get("gpus") or 0)


def check_python(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    return consistency("python", {h: str(f.get("python")) for h, f in probed.items()},
                       "point every node's `python:` at an environment with the same Python version")


def check_torch(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    values = {}
    for host, facts in probed.items():
        error = torch_info(facts).get("error")
        version = torch_version(facts)
        values[host] = f"{version} ({error})" if version and error else (version or error or "not installed")
    broken = frozenset(h for h, f in probed.items() if torch_info(f).get("error") or not torch_version(f))
    return consistency("torch", values, "install the same torch in every node's python (`python:` in the "
                       "inventory names the interpreter)", broken)


def _version_check(name: str, probed: Mapping[str, dict[str, Any]], value: Callable[[dict[str, Any]], Any],
                   missing: str, hint: str) -> Check:
    return consistency(name, {h: str(value(f) or missing) for h, f in probed.items()}, hint)


def check_cuda(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    return _version_check("cuda", probed, lambda f: torch_info(f).get("cuda"), "none (CPU build)",
                          "install the torch build for the same CUDA on every host (pip index-url cuXXX)")


def check_nccl(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    return _version_check("nccl", probed, lambda f: torch_info(f).get("nccl"), "not loaded (no GPU)",
                          "use the same torch and nvidia-nccl-cu* wheels everywhere; unset LD_LIBRARY_PATH "
                          "entries that load another libnccl")


def check_driver(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    return _version_check("driver", probed, lambda f: (f.get("gpu") or {}).get("driver"), "none (no GPU)",
                          "install the same NVIDIA driver on every host")


def check_backend(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    """NCCL usable on GPU hosts (torch sees CUDA, has NCCL); gloo elsewhere."""
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        info = torch_info(facts)
        if gpu_total(facts):
            shown[host] = "nccl"
            if info.get("error") or not info.get("imported"):
                problems[host] = "torch did not import, NCCL unknown"
            elif not info.get("cuda_available"):
                problems[host] = f"torch {info.get('version')} does not see the GPUs (CPU build, or driver too old)"
            elif not info.get("nccl_available"):
                problems[host] = "torch was built without NCCL"
        else:
            shown[host] = "gloo"
            if info.get("gloo") is False:
                problems[host] = "torch was built without gloo"
    return verdict("backend", problems, shown, Status.ERROR,
                   "install a CUDA build of torch matching the driver (torch.cuda.is_available() must be True)")


def _gpu_summary(facts: Mapping[str, Any]) -> str:
    found = devices(facts)
    if not found:
        return f"{gpu_total(facts)} GPU(s)" if gpu_total(facts) else "no GPU"
    names = sorted({f"{d.get('name')} {round((d.get('memory_total_mib') or 0) / 1024)} GiB" for d in found})
    return f"{len(found)} × {', '.join(names)}"


def check_gpus(probed: Mapping[str, dict[str, Any]], ctx: Context) -> Check:
    """The GPU count against the inventory's `gpus` and the job's `nproc_per_node`."""
    nproc = ctx.job.nproc_per_node if ctx.job else None
    problems: dict[str, str] = {}
    for host, facts in probed.items():
        found = gpu_total(facts)
        declared = ctx.node(host).gpus
        if declared is not None and declared != found:
            problems[host] = f"{found} GPU(s) found, the inventory says gpus: {declared}"
        elif nproc is not None and found and nproc > found:
            problems[host] = f"nproc_per_node {nproc} > {found} GPU(s)"
    return verdict("gpus", problems, {h: _gpu_summary(f) for h, f in probed.items()}, Status.ERROR,
                   "correct the node's `gpus:` in the inventory, or the job's nproc_per_node")


def check_gpu_busy(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    problems: dict[str, str] = {}
    for host, facts in probed.items():
        busy = [f"GPU {d.get('index')}: pid {', '.join(str(p.get('pid')) for p in d.get('processes') or [])} "
                f"({sum(p.get('used_mib') or 0 for p in d.get('processes') or [])} MiB)"
                for d in devices(facts) if d.get("processes")]
        if busy:
            problems[host] = "; ".join(busy)
    shown = {h: "no compute process on its GPUs" if devices(f) else "no GPU" for h, f in probed.items()}
    return verdict("gpu-busy", problems, shown, Status.WARN,
                   "stop those processes (nvidia-smi lists them) or choose other nodes with --nodes")


def check_ecc(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        counts = {d.get("index"): d.get("ecc_uncorrected") for d in devices(facts)}
        bad = [f"GPU {i}: {n} uncorrectable ECC error(s)" for i, n in counts.items() if n]
        if bad:
            problems[host] = "; ".join(bad)
        known = [n for n in counts.values() if n is not None]
        shown[host] = "no GPU" if not counts else ("no uncorrectable errors" if known else "ECC not reported")
    return verdict("ecc", problems, shown, Status.ERROR,
                   "drain the host: reset the GPU (nvidia-smi -r) or have it replaced before running jobs")


def size_text(value: float) -> str:
    """Bytes as people read them: `512 MiB`, `24 GiB`."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.0f} {unit}" if value / scale >= 10 else f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def check_shm(probed: Mapping[str, dict[str, Any]], ctx: Context) -> Check:
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        total = (facts.get("shm") or {}).get("total")
        shown[host] = f"/dev/shm {size_text(total)}" if total is not None else "no /dev/shm"
        if total is None or total < ctx.thresholds.min_shm:
            problems[host] = f"{shown[host]} (under {size_text(ctx.thresholds.min_shm)})"
    return verdict("shm", problems, shown, Status.WARN,
                   "give /dev/shm more room (containers: --shm-size=16g or --ipc=host); data loaders and NCCL use it")


def check_memlock(probed: Mapping[str, dict[str, Any]], _ctx: Context) -> Check:
    """A limited `ulimit -l` on a GPU host stops NCCL from pinning memory for RDMA."""
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        limit = facts.get("memlock")
        shown[host] = "ulimit -l unlimited" if limit is None else f"ulimit -l {size_text(limit)}"
        if limit is not None and gpu_total(facts):
            problems[host] = f"{shown[host]} on a GPU host"
    return verdict("memlock", problems, shown, Status.WARN,
                   "set memlock unlimited (/etc/security/limits.conf `* - memlock unlimited`; docker --ulimit "
                   "memlock=-1)")


def check_disk(probed: Mapping[str, dict[str, Any]], ctx: Context) -> Check:
    """Free space in the job's workdir; a missing workdir is an error for a job that names it."""
    problems: dict[str, str] = {}
    missing = False
    minimum = ctx.thresholds.min_disk
    for host, facts in probed.items():
        disk = facts.get("disk") or {}
        if not disk.get("exists", True):
            missing = True
            problems[host] = f"workdir {disk.get('path')} does not exist"
        elif disk.get("free") is not None and disk["free"] < minimum:
            problems[host] = f"{size_text(disk['free'])} free in {disk.get('path')} (under {size_text(minimum)})"
    shown = {h: f"at least {size_text(minimum)} free in {(f.get('disk') or {}).get('path')}"
             for h, f in probed.items()}
    status = Status.ERROR if missing and ctx.job is not None and ctx.job.workdir else Status.WARN
    hint = ("create the workdir on those hosts, or set `workdir:` in the job (without it a job runs in the "
            "controller's current directory)") if missing else "free space there (old checkpoints, caches)"
    return verdict("disk", problems, shown, status, hint)


def check_clock(probed: Mapping[str, dict[str, Any]], ctx: Context) -> Check:
    """The host's clock against the controller's when its facts arrived (`clock_skew`)."""
    limit = ctx.thresholds.max_skew
    problems: dict[str, str] = {}
    for host, facts in probed.items():
        skew = facts.get("clock_skew")
        if skew is not None and abs(skew) > limit:
            problems[host] = f"clock {abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} the controller"
    shown = {h: f"clock within {limit:g} s of the controller" for h in probed}
    return verdict("clock", problems, shown, Status.WARN,
                   "run NTP on every host (timedatectl set-ntp true, or chrony); skewed clocks scramble logs")


def check_iface(probed: Mapping[str, dict[str, Any]], ctx: Context) -> Check:
    """The node's `iface` exists on the host and has an IPv4 address."""
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        iface = ctx.node(host).iface
        have = facts.get("interfaces") or {}
        if iface is None:
            route = facts.get("route_iface")
            shown[host] = f"not set (auto{': ' + route if route else ''})"
        elif iface not in have:
            problems[host] = f"no interface {iface} (the host has {', '.join(sorted(have)) or 'none'})"
        elif not have[iface]:
            problems[host] = f"{iface} has no IPv4 address"
        else:
            shown[host] = iface
    return verdict("iface", problems, shown, Status.ERROR,
                   "set the node's `iface:` to an interface the hosts share (NCCL_SOCKET_IFNAME / "
                   "GLOO_SOCKET_IFNAME use it)")


def untested(name: str, why: str) -> Check:
    return Check(name, Status.WARN, [], f"not tested: {why}", "fix the errors above, then run doctor again")


def check_resolves(probed: Mapping[str, dict[str, Any]], ctx: Context) -> Check:
    """The master's address (and its host name, which c10d rendezvous hands out) resolve everywhere."""
    others = {h: f for h, f in probed.items() if h != ctx.master}
    if not others:
        return Check("master-resolves", Status.OK, list(probed), "single host: nothing to resolve")
    if not ctx.master_addr:
        return untested("master-resolves", f"no address for the master {ctx.master}")
    c10d = ctx.job is not None and ctx.job.rendezvous.backend == "c10d"
    problems: dict[str, str] = {}
    severe = False
    for host, facts in others.items():
        failed = {name: r.get("error") for name, r in (facts.get("resolved") or {}).items() if r.get("error")}
        if failed:
            severe = severe or ctx.master_addr in failed or c10d
            problems[host] = "; ".join(f"cannot resolve {name} ({why})" for name, why in failed.items())
    names = ", ".join(n for n in (ctx.master_addr, ctx.master_hostname) if n)
    shown = {h: f"resolve {names}" for h in others}
    return verdict("master-resolves", problems, shown, Status.ERROR if severe else Status.WARN,
                   f"add {ctx.master} to DNS or to /etc/hosts on those hosts (c10d rendezvous hands out the "
                   "master's host name)")


def check_port_free(probed: Mapping[str, dict[str, Any]], ctx: Context) -> Check:
    listen = (probed.get(ctx.master) or {}).get("listen")
    if listen is None:
        return untested("port-free", f"the master {ctx.master} was not probed")
    port = listen.get("port")
    if listen.get("ok"):
        return Check("port-free", Status.OK, [ctx.master], f"{ctx.master}: port {port} free")
    if not port:
        return Check("port-free", Status.ERROR, [ctx.master], f"{ctx.master}: no free port from {DEFAULT_PORT}",
                     "stop what holds the ports from 29500, or set rendezvous.port in the job")
    return Check("port-free", Status.ERROR, [ctx.master],
                 f"{ctx.master}: port {port} is in use ({listen.get('error')})",
                 f"stop what holds it (`ss -ltnp 'sport = :{port}'` on {ctx.master}), or set `rendezvous.port: auto`")


def check_port_reachable(probed: Mapping[str, dict[str, Any]], ctx: Context) -> Check:
    """Every other host opened a TCP connection to the master's address and rendezvous port."""
    others = {h: f for h, f in probed.items() if h != ctx.master}
    listen = (probed.get(ctx.master) or {}).get("listen") or {}
    if ctx.master_addr_error:
        return Check("port-reachable", Status.ERROR, [ctx.master], ctx.master_addr_error,
                     "give the master a `host` or `iface` the other hosts can reach")
    if not others:
        return Check("port-reachable", Status.OK, list(probed), "single host: nothing to connect")
    if not listen.get("ok"):
        return untested("port-reachable", f"nothing listens for the test on the master {ctx.master}")
    target = f"{ctx.master} at {ctx.master_addr}:{listen.get('port')}"
    problems = {h: f"cannot connect to {target} ({(f.get('connect') or {}).get('error') or 'not tried'})"
                for h, f in others.items() if not (f.get("connect") or {}).get("ok")}
    shown = {h: f"connect to {target}" for h in others}
    return verdict("port-reachable", problems, shown, Status.ERROR,
                   f"allow TCP port {listen.get('port')} into {ctx.master} from the other hosts (iptables/nftables, "
                   "security groups), or set `iface:` to the network the hosts share")


FACT_CHECKS: tuple[Callable[[Mapping[str, dict[str, Any]], Context], Check], ...] = (
    check_python, check_torch, check_cuda, check_nccl, check_driver, check_backend, check_gpus,
    check_gpu_busy, check_ecc, check_shm, check_memlock, check_disk, check_clock, check_iface, check_resolves,
    check_port_free, check_port_reachable,
)


def busbw_threshold(backend: str, requested: float | None) -> float:
    """`--min-busbw` when given, else the backend's default (GB/s)."""
    from orchestrator.bandwidth import DEFAULT_MIN_BUSBW

    return requested if requested is not None else DEFAULT_MIN_BUSBW[backend]


def bandwidth_check(report: BandwidthReport, min_busbw: float, hosts: list[str]) -> Check:
    """Warn when the best busbw over the message sizes is under `min_busbw` GB/s."""
    if report.error:
        return Check("bandwidth", Status.ERROR, hosts, report.error,
                     "run the job by hand with NCCL_DEBUG=INFO to see where it stops")
    best = report.best_busbw() or 0.0
    detail = f"{report.backend} all-reduce over {report.world_size} ranks: busbw up to {best:.2f} GB/s"
    if best < min_busbw:
        return Check("bandwidth", Status.WARN, hosts, f"{detail} (under {min_busbw:g} GB/s)",
                     "check the interface NCCL/gloo use (`iface:`), its link speed, and NCCL_IB_* settings")
    return Check("bandwidth", Status.OK, hosts, f"{detail} (at least {min_busbw:g} GB/s)")


# ---------------------------------------------------------------- output


def exit_code(checks: list[Check], results: Mapping[str, HostResult], strict: bool) -> int:
    """3 when a host could not be reached; else 1 on an error (or a warning with `strict`); else 0."""
    if any(r.unreachable for r in results.values()):
        return int(ExitCode.INFRA)
    failing = {Status.ERROR, Status.WARN} if strict else {Status.ERROR}
    return int(ExitCode.FAILED) if any(c.status in failing for c in checks) else int(ExitCode.OK)


def _paint(text: str, status: Status, colour: bool) -> str:
    return f"\x1b[{COLOURS[status.value]}m{text}\x1b[0m" if colour else text


def render_check(check: Check, width: int, colour: bool = False) -> list[str]:
    """A check's row, and its fix hint under it when it is not ok."""
    lines = [f"{_paint(MARKS[check.status.value], check.status, colour)} {check.name:<{width}}  {check.detail}"]
    if check.status is not Status.OK and check.hint:
        lines.append(f"  {'':<{width}}  fix: {check.hint}")
    return lines


def summary(checks: list[Check]) -> dict[str, int]:
    return {s.value: sum(1 for c in checks if c.status is s) for s in Status}


def render_table(checks: list[Check], ctx: Context, seconds: float, colour: bool = False) -> str:
    """The report people read: a header, one row per check, a summary line."""
    hosts = fold_hosts([n.name for n in ctx.nodes])
    where = f"{ctx.master_addr}" if ctx.master_addr else "address unknown"
    lines = [f"distrun doctor: {len(ctx.nodes)} host(s) {hosts}, master {ctx.master} ({where})", ""]
    width = max(len(c.name) for c in checks)
    for check in checks:
        lines += render_check(check, width, colour)
    counts = summary(checks)
    lines += ["", f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['error']} error(s) in {seconds:.1f} s"]
    return "\n".join(lines)


def render_bandwidth(report: BandwidthReport) -> str:
    """The per-size table of the all-reduce, nccl-tests' columns."""
    if not report.results:
        return ""
    lines = [f"all-reduce ({report.backend}, {report.world_size} ranks on {report.nnodes} host(s)):",
             f"{'size':>10} {'time':>10} {'algbw':>12} {'busbw':>12}"]
    lines += [f"{size_text(r.bytes):>10} {r.time_s * 1000:>7.2f} ms {r.algbw:>7.3f} GB/s {r.busbw:>7.3f} GB/s"
              for r in report.results]
    return "\n".join(lines)


def to_json(results: Mapping[str, HostResult], checks: list[Check], ctx: Context, seconds: float,
            code: int, bandwidth: dict[str, Any] | None) -> dict[str, Any]:
    """The `--json` document (schema in this module's docstring)."""
    master = results.get(ctx.master)
    listen = ((master.facts if master else None) or {}).get("listen") or {}
    return {
        "schema": SCHEMA,
        "seconds": round(seconds, 3),
        "master": {"node": ctx.master, "addr": ctx.master_addr, "port": listen.get("port")},
        "hosts": {name: {"reachable": not r.unreachable, "error": r.error, "facts": r.facts}
                  for name, r in results.items()},
        "checks": [c.to_dict() for c in checks],
        "bandwidth": bandwidth,
        "summary": summary(checks),
        "exit_code": code,
    }


# ---------------------------------------------------------------- the command


@dataclass(frozen=True)
class DoctorRequest:
    """Everything `distrun doctor` was asked."""

    inventory: str | None = None
    job_file: str | None = None
    nodes: list[str] | None = None
    as_json: bool = False
    strict: bool = False
    bandwidth: bool = False
    min_busbw: float | None = None


def master_of(inventory: Inventory, nodes: list[NodeSpec]) -> NodeSpec:
    """The inventory's `master` when selected, else the first selected node (as launch picks)."""
    return next((n for n in nodes if n.name == inventory.master), nodes[0])


def run_doctor(request: DoctorRequest, out: TextIO = sys.stdout) -> int:
    """Check the selected hosts and print the report.

    Returns:
        The exit status (see the module docstring).

    Raises:
        UsageError: the inventory, the job or `--nodes` is invalid.
    """
    from orchestrator.spec import load_job, resolve_inventory_path, select_nodes

    began = time.monotonic()
    inventory = resolve_inventory_path(request.inventory)
    job = load_job(request.job_file) if request.job_file else None
    nodes = select_nodes(job or JobSpec(path="<doctor>", name="doctor"), inventory, request.nodes)
    results, ctx = collect(nodes, master_of(inventory, nodes), job)
    checks = run_checks(results, ctx)
    report = None
    if request.bandwidth:
        check, report = _bandwidth(checks, results, inventory, nodes, ctx, request.min_busbw)
        checks.append(check)
    seconds = time.monotonic() - began
    code = exit_code(checks, results, request.strict)
    if request.as_json:
        data = report.to_dict() | {"min_busbw_gbps": busbw_threshold(report.backend, request.min_busbw)} \
            if report else None
        out.write(json.dumps(to_json(results, checks, ctx, seconds, code, data), indent=2) + "\n")
    else:
        colour = out.isatty() and not os.environ.get("NO_COLOR")
        out.write(render_table(checks, ctx, seconds, colour) + "\n")
        if report is not None and report.results:
            out.write("\n" + render_bandwidth(report) + "\n")
    return code


def _bandwidth(checks: list[Check], results: Mapping[str, HostResult], inventory: Inventory,
               nodes: list[NodeSpec], ctx: Context, min_busbw: float | None) -> tuple[Check, BandwidthReport | None]:
    """Run the all-reduce when every check passed; a job on broken hosts would only hang."""
    from orchestrator.bandwidth import BandwidthReport, measure

    if any(c.status is Status.ERROR for c in checks):
        return untested("bandwidth", "the all-reduce runs only when no check failed"), None
    facts = [r.facts for r in results.values() if r.facts is not None]
    backend = "nccl" if facts and all(gpu_total(f) for f in facts) else "gloo"
    try:
        report = measure(ctx.job, inventory, nodes, backend)
    except DistrunError as exc:
        report = BandwidthReport(backend, len(nodes), "", error=f"the all-reduce job did not start: {exc}")
    return bandwidth_check(report, busbw_threshold(backend, min_busbw), [n.name for n in nodes]), report


# ---------------------------------------------------------------- before a launch


def launch_preflight(prepared: Prepared) -> None:
    """The fast checks before anything starts: python and torch alike on every host, and the
    rendezvous port free on the master and reachable from every other host.

    Raises:
        PreflightError: listing every failed check as doctor shows it.
    """
    plan = prepared.plan
    nodes = tuple(prepared.transports[h.node].node for h in plan.hosts)
    ctx = Context(nodes, plan.master_node, plan.master_addr)
    checks = [check_python(prepared.facts, ctx), check_torch(prepared.facts, ctx)]
    if len(nodes) > 1:
        master = prepared.transports[plan.master_node].node
        outcome = probe_round(prepared.transports, master, {}, plan.master_port, plan.master_addr)
        probed = {n: r.facts for n, r in outcome.results.items() if r.facts is not None}
        checks += [check_probe(outcome.results), check_port_free(probed, ctx), check_port_reachable(probed, ctx)]
    failed = [c for c in checks if c.status is Status.ERROR]
    if failed:
        width = max(len(c.name) for c in failed)
        rows = [line for c in failed for line in render_check(c, width)]
        raise PreflightError("preflight failed; nothing was started (--skip-preflight starts anyway):\n"
                             + "\n".join(rows))
