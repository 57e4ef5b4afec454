"""Doctor's checks: pure functions from every host's typed facts (and the inventory, the job and the
master) to one row each of the report. Unit-tested on handmade facts; no host needed.

Check names, in the report's order: reachable, probe, python, torch, cuda, nccl, driver,
backend, gpus, gpu-busy, ecc, shm, memlock, py-spy, disk, clock, iface, deepspeed, build-locks,
master-resolves, port-free, port-reachable, entry (and bandwidth, with --bandwidth).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from orchestrator.console.display import fold_hosts, size_text
from orchestrator.facts import HostFacts, Listen
from orchestrator.fanout.group import fold_errors
from orchestrator.hostcheck.probe import ProbeResult
from orchestrator.plan import DEFAULT_PORT
from orchestrator.spec.model import JobSpec, NodeSpec
from orchestrator.transport.base import REACH_HINT

GIB = 1 << 30


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    ERROR = "error"
    SKIP = "skip"  # the check could not run (no host probed, or what it needs failed first)


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


def run_checks(results: Mapping[str, ProbeResult], ctx: Context) -> list[Check]:
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
    if not shown:
        return skipped(name, "no host was probed")
    return Check(name, Status.OK, list(shown), listing(shown))


def consistency(name: str, values: Mapping[str, str], hint: str, broken: frozenset[str] = frozenset()) -> Check:
    """Error when the hosts' values differ (or any host is `broken`), naming each value's hosts.

    The check's hosts are the odd ones out: those outside the one value most hosts share
    (every host when no value has a majority), and the broken ones.
    """
    if not values:
        return skipped(name, "no host was probed")
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
    return Check(name, Status.OK, list(values), listing(labelled))


def check_reachable(results: Mapping[str, ProbeResult]) -> Check:
    down = {name: r.error or f"{name}: unreachable" for name, r in results.items() if r.unreachable}
    if down:
        return Check("reachable", Status.ERROR, list(down), "; ".join(fold_errors(down)),
                     f"{REACH_HINT}; the other hosts were still checked")
    return Check("reachable", Status.OK, list(results), f"{fold_hosts(results)}: connected")


def check_probe(results: Mapping[str, ProbeResult]) -> Check:
    failed = {name: r.error or f"{name}: no facts" for name, r in results.items()
              if not r.unreachable and r.facts is None}
    ran = [name for name, r in results.items() if r.facts is not None]
    if failed:
        return Check("probe", Status.ERROR, list(failed), "; ".join(fold_errors(failed)),
                     "set the node's `python:` in the inventory to an interpreter that exists on the host")
    if not ran:
        return skipped("probe", "no host was reached")
    return Check("probe", Status.OK, ran, f"{fold_hosts(ran)}: probe ran")


def check_python(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    return consistency("python", {h: str(f.python) for h, f in probed.items()},
                       "point every node's `python:` at an environment with the same Python version")


def check_torch(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    values = {}
    for host, facts in probed.items():
        error = facts.torch_info.error
        version = facts.torch_version
        values[host] = f"{version} ({error})" if version and error else (version or error or "not installed")
    broken = frozenset(h for h, f in probed.items() if f.torch_info.error or not f.torch_version)
    found = consistency("torch", values, "install the same torch in every node's python (`python:` in the "
                        "inventory names the interpreter)", broken)
    lacking = without_control_plane(probed)
    if found.status is not Status.OK or not lacking:
        return found
    return Check("torch", Status.WARN, list(lacking),
                 f"{listing(lacking)}: no Flight Recorder served: {NO_CONTROL_PLANE}",
                 "a newer torch has torch.distributed.elastic.control_plane; the job runs as it is, and a hang "
                 "is diagnosed from the ranks' stacks")


NO_CONTROL_PLANE = "its torch has no control plane (torch.distributed.elastic.control_plane)"


def without_control_plane(probed: Mapping[str, HostFacts]) -> dict[str, str]:
    """{host: "torch VERSION"} for each host whose torch is known to lack the control plane that
    serves a rank's Flight Recorder (remote/distrun_worker.py)."""
    return {host: f"torch {facts.torch_version}" for host, facts in probed.items()
            if facts.torch_info.control_plane is False}


def flight_recorder_missing(probed: Mapping[str, HostFacts]) -> list[str]:
    """The summary's line on hosts whose ranks served no Flight Recorder, or none."""
    lacking = without_control_plane(probed)
    if not lacking:
        return []
    return [f"Flight Recorder: not served on {fold_hosts(lacking)}: {NO_CONTROL_PLANE}; hangs there are "
            "diagnosed from the stacks (a newer torch has it)"]


def _version_check(name: str, probed: Mapping[str, HostFacts], value: Callable[[HostFacts], str | None],
                   missing: str, hint: str) -> Check:
    return consistency(name, {h: str(value(f) or missing) for h, f in probed.items()}, hint)


def check_cuda(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    return _version_check("cuda", probed, lambda f: f.torch_info.cuda, "none (CPU build)",
                          "install the torch build for the same CUDA on every host (pip index-url cuXXX)")


def check_nccl(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    return _version_check("nccl", probed, lambda f: f.torch_info.nccl, "not loaded (no GPU)",
                          "use the same torch and nvidia-nccl-cu* wheels everywhere; unset LD_LIBRARY_PATH "
                          "entries that load another libnccl")


def check_driver(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    return _version_check("driver", probed, lambda f: f.gpu.driver if f.gpu else None, "none (no GPU)",
                          "install the same NVIDIA driver on every host")


def check_backend(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    """NCCL usable on GPU hosts (torch sees CUDA, has NCCL); gloo elsewhere."""
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        info = facts.torch_info
        if facts.gpu_total:
            shown[host] = "nccl"
            if info.error or not info.imported:
                problems[host] = "torch did not import, NCCL unknown"
            elif not info.cuda_available:
                problems[host] = f"torch {info.version} does not see the GPUs (CPU build, or driver too old)"
            elif not info.nccl_available:
                problems[host] = "torch was built without NCCL"
        else:
            shown[host] = "gloo"
            if info.gloo is False:
                problems[host] = "torch was built without gloo"
    return verdict("backend", problems, shown, Status.ERROR,
                   "install a CUDA build of torch matching the driver (torch.cuda.is_available() must be True)")


def _gpu_summary(facts: HostFacts) -> str:
    found = facts.devices
    if not found:
        return f"{facts.gpu_total} GPU(s)" if facts.gpu_total else "no GPU"
    names = sorted({f"{d.name} {round((d.memory_total_mib or 0) / 1024)} GiB" for d in found})
    return f"{len(found)} × {', '.join(names)}"


def check_gpus(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    """The GPU count against the inventory's `gpus` and the job's `nproc_per_node`."""
    nproc = ctx.job.nproc_per_node if ctx.job else None
    problems: dict[str, str] = {}
    for host, facts in probed.items():
        found = facts.gpu_total
        declared = ctx.node(host).gpus
        if declared is not None and declared != found:
            problems[host] = f"{found} GPU(s) found, the inventory says gpus: {declared}"
        elif nproc is not None and found and nproc > found:
            problems[host] = f"nproc_per_node {nproc} > {found} GPU(s)"
    return verdict("gpus", problems, {h: _gpu_summary(f) for h, f in probed.items()}, Status.ERROR,
                   "correct the node's `gpus:` in the inventory, or the job's nproc_per_node")


def check_gpu_busy(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    problems: dict[str, str] = {}
    for host, facts in probed.items():
        busy = [f"GPU {d.index}: pid {', '.join(str(p.pid) for p in d.processes)} "
                f"({sum(p.used_mib for p in d.processes)} MiB)"
                for d in facts.devices if d.processes]
        if busy:
            problems[host] = "; ".join(busy)
    shown = {h: "no compute process on its GPUs" if f.devices else "no GPU" for h, f in probed.items()}
    return verdict("gpu-busy", problems, shown, Status.WARN,
                   "stop those processes (nvidia-smi lists them) or choose other nodes with --nodes")


def check_ecc(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        counts = {d.index: d.ecc_uncorrected for d in facts.devices}
        bad = [f"GPU {i}: {n} uncorrectable ECC error(s)" for i, n in counts.items() if n]
        if bad:
            problems[host] = "; ".join(bad)
        known = [n for n in counts.values() if n is not None]
        shown[host] = "no GPU" if not counts else ("no uncorrectable errors" if known else "ECC not reported")
    return verdict("ecc", problems, shown, Status.ERROR,
                   "drain the host: reset the GPU (nvidia-smi -r) or have it replaced before running jobs")


def check_shm(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        total = facts.shm.total if facts.shm else None
        shown[host] = f"/dev/shm {size_text(total)}" if total is not None else "no /dev/shm"
        if total is None or total < ctx.thresholds.min_shm:
            problems[host] = f"{shown[host]} (under {size_text(ctx.thresholds.min_shm)})"
    return verdict("shm", problems, shown, Status.WARN,
                   "give /dev/shm more room (containers: --shm-size=16g or --ipc=host); data loaders and NCCL use it")


def check_memlock(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    """A limited `ulimit -l` on a GPU host stops NCCL from pinning memory for RDMA."""
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        limit = facts.memlock
        shown[host] = "ulimit -l unlimited" if limit is None else f"ulimit -l {size_text(limit)}"
        if limit is not None and facts.gpu_total:
            problems[host] = f"{shown[host]} on a GPU host"
    return verdict("memlock", problems, shown, Status.WARN,
                   "set memlock unlimited (/etc/security/limits.conf `* - memlock unlimited`; docker --ulimit "
                   "memlock=-1)")


def check_pyspy(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    """py-spy, which `distrun stack` and the hang watchdog run beside the ranks, and ptrace allowing it."""
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        if facts.pyspy is None:
            continue
        shown[host] = f"py-spy {facts.pyspy.path}"
        problem = facts.pyspy.problem()
        if problem is not None:
            problems[host] = problem
    return verdict("py-spy", problems, shown, Status.WARN,
                   "pip install py-spy into the python the job runs (distrun stack and hang_timeout use it); "
                   "a non-root user needs kernel.yama.ptrace_scope 0 or 1 and the ranks run as that user")


def check_disk(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    """Free space in the job's workdir; a missing workdir is an error for a job that names it."""
    problems: dict[str, str] = {}
    missing = False
    minimum = ctx.thresholds.min_disk
    for host, facts in probed.items():
        disk = facts.disk
        if not disk.exists:
            missing = True
            problems[host] = f"workdir {disk.path} does not exist"
        elif disk.free is not None and disk.free < minimum:
            problems[host] = f"{size_text(disk.free)} free in {disk.path} (under {size_text(minimum)})"
    shown = {h: f"at least {size_text(minimum)} free in {f.disk.path}" for h, f in probed.items()}
    status = Status.ERROR if missing and ctx.job is not None and ctx.job.workdir else Status.WARN
    hint = ("create the workdir on those hosts, or set `workdir:` in the job (without it a job runs in the "
            "controller's current directory)") if missing else "free space there (old checkpoints, caches)"
    return verdict("disk", problems, shown, status, hint)


def check_clock(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    """The host's clock against the controller's when its facts arrived (`clock_skew`)."""
    limit = ctx.thresholds.max_skew
    problems: dict[str, str] = {}
    for host, facts in probed.items():
        skew = facts.clock_skew
        if skew is not None and abs(skew) > limit:
            problems[host] = f"clock {abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} the controller"
    shown = {h: f"clock within {limit:g} s of the controller" for h in probed}
    return verdict("clock", problems, shown, Status.WARN,
                   "run NTP on every host (timedatectl set-ntp true, or chrony); skewed clocks scramble logs")


def check_iface(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    """The node's `iface` exists on the host and has an IPv4 address."""
    problems: dict[str, str] = {}
    shown: dict[str, str] = {}
    for host, facts in probed.items():
        iface = ctx.node(host).iface
        have = facts.interfaces
        if iface is None:
            route = facts.route_iface
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


def skipped(name: str, why: str) -> Check:
    """A check that could not run, and why; it passes nothing and fails nothing."""
    return Check(name, Status.SKIP, [], f"skipped: {why}", "fix the errors above, then run doctor again")


def check_resolves(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    """The master's address (and its host name, which c10d rendezvous hands out) resolve everywhere."""
    others = {h: f for h, f in probed.items() if h != ctx.master}
    if len(ctx.nodes) == 1:
        return Check("master-resolves", Status.OK, [ctx.master], "single host: nothing to resolve")
    if not others:
        return skipped("master-resolves", "no host but the master was probed")
    if not ctx.master_addr:
        return skipped("master-resolves", f"no address for the master {ctx.master}")
    c10d = ctx.job is not None and ctx.job.rendezvous.backend == "c10d"
    problems: dict[str, str] = {}
    severe = False
    for host, facts in others.items():
        failed = {name: r.error for name, r in facts.resolved.items() if r.error}
        if failed:
            severe = severe or ctx.master_addr in failed or c10d
            problems[host] = "; ".join(f"cannot resolve {name} ({why})" for name, why in failed.items())
    names = ", ".join(n for n in (ctx.master_addr, ctx.master_hostname) if n)
    shown = {h: f"resolve {names}" for h in others}
    return verdict("master-resolves", problems, shown, Status.ERROR if severe else Status.WARN,
                   f"add {ctx.master} to DNS or to /etc/hosts on those hosts (c10d rendezvous hands out the "
                   "master's host name)")


def check_port_free(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    master = probed.get(ctx.master)
    listen = master.listen if master is not None else None
    if listen is None:
        return skipped("port-free", f"the master {ctx.master} was not probed")
    port = listen.port
    if listen.ok:
        return Check("port-free", Status.OK, [ctx.master], f"{ctx.master}: port {port} free")
    if not port:
        return Check("port-free", Status.ERROR, [ctx.master], f"{ctx.master}: no free port from {DEFAULT_PORT}",
                     "stop what holds the ports from 29500, or set rendezvous.port in the job")
    return Check("port-free", Status.ERROR, [ctx.master],
                 f"{ctx.master}: port {port} is in use ({listen.error})",
                 f"stop what holds it (`ss -ltnp 'sport = :{port}'` on {ctx.master}), or set `rendezvous.port: auto`")


def check_port_reachable(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    """Every other host opened a TCP connection to the master's address and rendezvous port.

    A host that could not try (see `Connect.skipped`) is named as skipped, never as failed.
    """
    others = {h: f for h, f in probed.items() if h != ctx.master}
    master = probed.get(ctx.master)
    listen = master.listen if master is not None and master.listen is not None else Listen()
    if ctx.master_addr_error:
        return Check("port-reachable", Status.ERROR, [ctx.master], ctx.master_addr_error,
                     "give the master a `host` or `iface` the other hosts can reach")
    if len(ctx.nodes) == 1:
        return Check("port-reachable", Status.OK, [ctx.master], "single host: nothing to connect")
    if not others:
        return skipped("port-reachable", "no host but the master was probed")
    if not listen.ok:
        return skipped("port-reachable", f"nothing listens for the test on the master {ctx.master}")
    target = f"{ctx.master} at {ctx.master_addr}:{listen.port}"
    untried = {h: f.connect.skipped if f.connect else NOT_TOLD for h, f in others.items()
               if f.connect is None or f.connect.skipped}
    tried = {h: f.connect for h, f in others.items() if f.connect is not None and h not in untried}
    problems = {h: f"cannot connect to {target} ({c.error or 'failed'})" for h, c in tried.items() if not c.ok}
    shown = {h: f"connect to {target}" for h in tried}
    found = verdict("port-reachable", problems, shown, Status.ERROR,
                    f"allow TCP port {listen.port} into {ctx.master} from the other hosts (iptables/nftables, "
                    "security groups), or set `iface:` to the network the hosts share")
    return with_untried(found, untried) if untried else found


NOT_TOLD = "the master's address did not reach this host's probe in time"


def with_untried(found: Check, untried: Mapping[str, str]) -> Check:
    """`found` with the hosts that could not try named as skipped: an error stays an error on its
    own hosts; otherwise the row is skipped, on those hosts, listing what the others did."""
    text = listing({h: f"skipped: {why}" for h, why in untried.items()})
    if found.status is Status.ERROR:
        return replace(found, detail=f"{found.detail}; {text}")
    detail = text if found.status is Status.SKIP else f"{text}; {found.detail}"
    return Check(found.name, Status.SKIP, list(untried), detail,
                 "run doctor again on those hosts (--nodes); their probe ran too late to test the port")


def check_entry(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    """The job's script or module is there on every host, as the job's python, env and workdir find it."""
    entries = {h: f.entry for h, f in probed.items() if f.entry is not None}
    if not entries:
        if ctx.job is None:
            why = "no job given (doctor --job JOB.yaml looks for its script or module on every host)"
        elif ctx.job.sync:
            why = "sync: true brings the workdir at launch, so the entry is not looked for on the hosts before"
        else:
            why = "the probe did not look for the entry"
        return Check("entry", Status.SKIP, [], f"skipped: {why}")
    problems = {h: f"{e.kind} {e.name}: {e.error}" for h, e in entries.items() if not e.ok}
    shown = {h: f"{e.kind} {e.name} found" for h, e in entries.items()}
    kind = next(iter(entries.values())).kind
    hint = ("install it into the node's python or fix the job's `module:` (looked for as `python -m` would, "
            "in the job's workdir with its env)") if kind == "module" else (
            "the script lies outside the current directory, which `sync: true` sends: run distrun from a "
            "directory that holds it, or put it on those hosts at that path") if ctx.job and ctx.job.sync else (
            "put the script in the job's workdir on those hosts (or set `sync: true`), or fix the job's `script:`")
    return verdict("entry", problems, shown, Status.ERROR, hint)


DS_IMPORT = re.compile(r"^\s*(?:import|from)\s+deepspeed\b", re.MULTILINE)


def uses_deepspeed(job: JobSpec | None) -> bool:
    """Whether the job runs DeepSpeed: its script imports deepspeed, or its module is deepspeed's."""
    if job is None:
        return False
    if job.module:
        return job.module.split(".")[0] == "deepspeed"
    try:
        return bool(DS_IMPORT.search(Path(str(job.script)).read_text(errors="replace")))
    except OSError:
        return False


def check_deepspeed(probed: Mapping[str, HostFacts], ctx: Context) -> Check:
    """DeepSpeed's version alike on every host; on every host when the job uses it."""
    found = {h: f.deepspeed for h, f in probed.items() if f.deepspeed}
    if not probed:
        return skipped("deepspeed", "no host was probed")
    if not uses_deepspeed(ctx.job):
        if not found:
            return skipped("deepspeed", "not installed, and no job that uses it given")
        return consistency("deepspeed", found, DS_HINT)
    missing = {h: str(f.python_path or ctx.node(h).python) for h, f in probed.items() if not f.deepspeed}
    if missing:
        install = f"deepspeed=={next(iter(grouped(found)))[0]}" if found else "deepspeed"
        where = "; ".join(f"{fold_hosts(hosts)}: {python} -m pip install '{install}'"
                          for python, hosts in grouped(missing))
        return Check("deepspeed", Status.ERROR, list(missing),
                     f"{fold_hosts(missing)}: deepspeed not installed in the job's python, which the job imports",
                     f"install it there ({where})")
    return consistency("deepspeed", found, DS_HINT)


DS_HINT = "install the same deepspeed in every node's python (`python:` in the inventory names the interpreter)"


def check_extension_locks(probed: Mapping[str, HostFacts], _ctx: Context) -> Check:
    """torch extension build locks that no process is building under: every build of that op waits for ever."""
    stale = {h: [lock for lock in f.extension_locks if not lock.building] for h, f in probed.items()}
    stale = {h: locks for h, locks in stale.items() if locks}
    if stale:
        detail = "; ".join(f"{h}: {lock.path} ({duration(lock.age_s)} old, no build running)"
                           for h, locks in stale.items() for lock in locks)
        first_host, first = next(iter(stale.items()))
        return Check("build-locks", Status.ERROR, list(stale), f"stale torch extension build lock: {detail}",
                     "a JIT build (DeepSpeed's ops) that was killed left it, and every later build of that op waits "
                     f"on it for ever: remove it, e.g. distrun exec --nodes {first_host} rm {first[0].path}")
    roots = {h: f"no stale build lock in {f.extensions_root}" for h, f in probed.items() if f.extensions_root}
    return verdict("build-locks", {}, roots, Status.ERROR, "")


def duration(seconds: float | None) -> str:
    """`3 s`, `12 min`, `5 h`; `?` when unknown."""
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.0f} h"


FACT_CHECKS: tuple[Callable[[Mapping[str, HostFacts], Context], Check], ...] = (
    check_python, check_torch, check_cuda, check_nccl, check_driver, check_backend, check_gpus,
    check_gpu_busy, check_ecc, check_shm, check_memlock, check_pyspy, check_disk, check_clock, check_iface,
    check_deepspeed, check_extension_locks, check_resolves, check_port_free, check_port_reachable, check_entry,
)
