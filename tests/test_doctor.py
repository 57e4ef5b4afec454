"""Doctor's checks on handmade facts, its table and JSON, its exit status, and launch's preflight."""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.ssh import SshBackend
from orchestrator.doctor.bandwidth import BandwidthReport, SizeResult, parse_results
from orchestrator.doctor.bandwidth_check import bandwidth_check
from orchestrator.doctor.command import exit_code
from orchestrator.facts import Connect, EntryPoint, HostFacts, Listen
from orchestrator.fanout.group import Group
from orchestrator.hostcheck import preflight as doctor_preflight
from orchestrator.hostcheck.checks import NOT_TOLD, Check, Context, Status, flight_recorder_missing, run_checks
from orchestrator.hostcheck.probe import LATE, ProbeResult, import_options, probe_round
from orchestrator.hostcheck.render import render_table, to_json
from orchestrator.plan import HostPlan, LaunchPlan
from orchestrator.spec import job_from_text
from orchestrator.spec.model import Inventory, JobSpec, NodeSpec, Rendezvous, TransportKind
from orchestrator.store import Store
from orchestrator.transport.base import REACH_HINT

GIB = 1 << 30
MASTER_ADDR = "10.0.0.10"
PORT = 29500


def device(index: int) -> dict[str, Any]:
    return {"index": index, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "memory_used_mib": 0,
            "ecc_uncorrected": 0, "persistence": True, "processes": []}


def host_facts(index: int, gpus: int = 0) -> dict[str, Any]:
    """A healthy host as the full probe reports it; node0 is the master."""
    facts: dict[str, Any] = {
        "hostname": f"node{index}", "python": "3.11.7", "torch": "2.13.0", "gpus": gpus,
        "interfaces": {"lo": ["127.0.0.1/8"], "eth0": [f"10.0.0.{10 + index}/24"]},
        "torch_info": {"imported": bool(gpus), "version": "2.13.0", "cuda": "12.8" if gpus else None,
                       "cuda_available": bool(gpus) or None, "nccl": "2.27.3" if gpus else None,
                       "cudnn": "91002" if gpus else None, "gloo": True, "nccl_available": bool(gpus) or None,
                       "error": None},
        "gpu": {"source": "nvml" if gpus else "none", "driver": "570.86.15" if gpus else None,
                "devices": [device(i) for i in range(gpus)]},
        "shm": {"path": "/dev/shm", "exists": True, "total": 64 * GIB, "free": 64 * GIB},
        "entry": {"kind": "script", "name": "train.py", "ok": True, "found": "/work/train.py", "error": None},
        "memlock": None,
        "pyspy": {"path": "/opt/venv/bin/py-spy", "ptrace_scope": 1, "uid": 1000},
        "disk": {"path": "/work", "exists": True, "total": 900 * GIB, "free": 500 * GIB},
        "clock": 1_700_000_000.0, "clock_skew": 0.01,
        "deepspeed": "0.19.8", "extensions": {"root": "/home/u/.cache/torch_extensions", "locks": []},
    }
    if index == 0:
        facts["listen"] = {"port": PORT, "ok": True, "error": None, "accepted": []}
    else:
        facts["connect"] = {"addr": MASTER_ADDR, "port": PORT, "ok": True, "error": None, "ms": 0.3}
        facts["resolved"] = {MASTER_ADDR: {"addrs": [MASTER_ADDR], "error": None},
                             "node0": {"addrs": [MASTER_ADDR], "error": None}}
    return facts


def set_in(facts: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        facts = facts[key]
    facts[last] = value


def make(n: int = 3, gpus: int = 0, changes: dict[int, dict[str, Any]] | None = None,
         job: JobSpec | None = None, inventory_gpus: int | None = None,
         iface: str | None = "eth0") -> tuple[dict[str, ProbeResult], Context]:
    """n healthy hosts, then `changes` {host index: {"dotted.path": value}} applied."""
    results = {}
    for i in range(n):
        facts = host_facts(i, gpus)
        for path, value in (changes or {}).get(i, {}).items():
            set_in(facts, path, value)
        results[f"node{i}"] = ProbeResult(f"node{i}", facts=HostFacts.from_probe(f"node{i}", facts))
    nodes = tuple(NodeSpec(name=f"node{i}", host=f"10.0.0.{10 + i}", iface=iface, gpus=inventory_gpus)
                  for i in range(n))
    return results, Context(nodes, "node0", MASTER_ADDR, None, "node0", job)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def check(name: str, results: dict[str, ProbeResult], ctx: Context) -> Check:
    return by_name(run_checks(results, ctx))[name]


# ---------------------------------------------------------------- every check


@pytest.mark.parametrize("gpus", [0, 8])
def test_healthy_hosts_pass_every_check(gpus):
    results, ctx = make(gpus=gpus, inventory_gpus=gpus or None)
    checks = run_checks(results, ctx)
    assert [c.name for c in checks if c.status is not Status.OK] == []
    assert {c.name for c in checks} == {
        "reachable", "probe", "python", "torch", "cuda", "nccl", "driver", "backend", "gpus", "gpu-busy", "ecc",
        "shm", "memlock", "py-spy", "disk", "clock", "iface", "master-resolves", "port-free", "port-reachable", "entry",
        "deepspeed", "build-locks"}


def test_identical_values_are_gathered_into_one_host_range():
    results, ctx = make(gpus=8)
    checks = by_name(run_checks(results, ctx))
    assert checks["torch"].detail == "node[0-2]: torch 2.13.0"
    assert checks["gpus"].detail == "node[0-2]: 8 × NVIDIA H100 80GB HBM3 80 GiB"


def test_a_torch_mismatch_names_the_odd_host_and_every_version():
    results, ctx = make(changes={2: {"torch_info.version": "2.12.0"}})
    torch = check("torch", results, ctx)
    assert torch.status is Status.ERROR
    assert torch.detail == "torch differs: node[0-1]: 2.13.0; node2: 2.12.0"
    assert torch.hosts == ["node2"]
    assert "same torch" in torch.hint


def test_a_mismatch_without_a_majority_concerns_every_host():
    results, ctx = make(n=2, changes={1: {"python": "3.12.1"}})
    python = check("python", results, ctx)
    assert python.status is Status.ERROR and python.hosts == ["node0", "node1"]
    assert python.detail == "python differs: node0: 3.11.7; node1: 3.12.1"


@pytest.mark.parametrize(("name", "path", "value"), [
    ("cuda", "torch_info.cuda", "12.4"),
    ("nccl", "torch_info.nccl", "2.21.5"),
    ("driver", "gpu.driver", "550.54.15"),
])
def test_cuda_nccl_and_driver_must_match_on_every_host(name, path, value):
    results, ctx = make(gpus=8, changes={1: {path: value}})
    found = check(name, results, ctx)
    assert found.status is Status.ERROR and found.hosts == ["node1"]
    assert found.detail.startswith(f"{name} differs: node[0,2]: ") and found.detail.endswith(f"node1: {value}")


def test_torch_that_fails_to_import_is_an_error_even_when_every_host_agrees():
    error = "ImportError: libcudnn.so.9: cannot open shared object file"
    results, ctx = make(changes={i: {"torch_info.error": error} for i in range(3)})
    torch = check("torch", results, ctx)
    assert torch.status is Status.ERROR and torch.hosts == ["node0", "node1", "node2"]
    assert error in torch.detail


def test_a_torch_without_the_control_plane_is_one_warning_in_doctor_and_one_line_in_the_summary():
    results, ctx = make(changes={2: {"torch_info.control_plane": False, "torch_info.version": "2.13.0"}})
    torch = check("torch", results, ctx)
    assert (torch.status, torch.hosts) == (Status.WARN, ["node2"])
    assert torch.detail == ("node2: torch 2.13.0: no Flight Recorder served: its torch has no control plane "
                            "(torch.distributed.elastic.control_plane)")
    probed = {name: result.facts for name, result in results.items() if result.facts is not None}
    assert flight_recorder_missing(probed) == [
        "Flight Recorder: not served on node2: its torch has no control plane (torch.distributed.elastic."
        "control_plane); hangs there are diagnosed from the stacks (a newer torch has it)"]
    healthy, _ = make()
    assert flight_recorder_missing({n: r.facts for n, r in healthy.items() if r.facts is not None}) == []


def test_torch_missing_on_one_host_is_named():
    results, ctx = make(changes={1: {"torch_info.version": None, "torch": None}})
    torch = check("torch", results, ctx)
    assert torch.status is Status.ERROR and "node1: not installed" in torch.detail


def test_an_unreachable_host_is_an_error_and_the_others_are_still_checked():
    results, ctx = make()
    results["node2"] = ProbeResult("node2", error="node2 (10.0.0.12:22): connection timed out after 10 s",
                                  unreachable=True)
    checks = by_name(run_checks(results, ctx))
    assert checks["reachable"].status is Status.ERROR and checks["reachable"].hosts == ["node2"]
    assert "timed out" in checks["reachable"].detail
    assert checks["python"].status is Status.OK and checks["python"].detail == "node[0-1]: python 3.11.7"
    assert checks["probe"].status is Status.OK


def test_a_probe_that_failed_on_a_reachable_host_is_reported_apart():
    results, ctx = make()
    results["node1"] = ProbeResult("node1", error="node1: probe failed using python '/opt/venv/bin/python': "
                                  "No such file or directory")
    checks = by_name(run_checks(results, ctx))
    assert checks["reachable"].status is Status.OK
    assert checks["probe"].status is Status.ERROR and checks["probe"].hosts == ["node1"]
    assert "`python:`" in checks["probe"].hint


def test_clock_skew_over_two_seconds_warns():
    results, ctx = make(changes={1: {"clock_skew": -3.5}, 2: {"clock_skew": 1.9}})
    clock = check("clock", results, ctx)
    assert clock.status is Status.WARN and clock.hosts == ["node1"]
    assert clock.detail == "node1: clock 3.5 s behind the controller"


@pytest.mark.parametrize(("shm", "shown"), [({"path": "/dev/shm", "exists": True, "total": 64 << 20, "free": 0},
                                             "/dev/shm 64 MiB (under 1.0 GiB)"), (None, "no /dev/shm")])
def test_small_or_missing_shm_warns(shm, shown):
    results, ctx = make(changes={2: {"shm": shm}})
    found = check("shm", results, ctx)
    assert found.status is Status.WARN and found.detail.startswith(f"node2: {shown}")


def test_pyspy_missing_or_ptrace_forbidden_warns_naming_the_host_and_why():
    results, ctx = make(changes={1: {"pyspy.path": None}, 2: {"pyspy.ptrace_scope": 2}})
    found = check("py-spy", results, ctx)
    assert found.status is Status.WARN
    assert found.detail == ("node1: py-spy not found beside the host's python nor on its PATH; "
                            "node2: kernel.yama.ptrace_scope is 2: only root (CAP_SYS_PTRACE) may trace the ranks")
    results, ctx = make(changes={2: {"pyspy.ptrace_scope": 2, "pyspy.uid": 0}})
    assert check("py-spy", results, ctx).status is Status.OK


def test_a_limited_memlock_warns_on_gpu_hosts_only():
    results, ctx = make(gpus=8, changes={1: {"memlock": 64 * 1024}})
    assert check("memlock", results, ctx).detail == "node1: ulimit -l 64 KiB on a GPU host"
    results, ctx = make(gpus=0, changes={1: {"memlock": 64 * 1024}})
    assert check("memlock", results, ctx).status is Status.OK


def test_uncorrectable_ecc_errors_are_an_error():
    results, ctx = make(gpus=2, changes={2: {"gpu.devices": [device(0), {**device(1), "ecc_uncorrected": 3}]}})
    ecc = check("ecc", results, ctx)
    assert ecc.status is Status.ERROR and ecc.detail == "node2: GPU 1: 3 uncorrectable ECC error(s)"


def test_a_gpu_already_running_a_process_warns_with_its_pid():
    busy = {**device(0), "processes": [{"pid": 4242, "used_mib": 30702}]}
    results, ctx = make(gpus=1, changes={1: {"gpu.devices": [busy]}})
    found = check("gpu-busy", results, ctx)
    assert found.status is Status.WARN and found.detail == "node1: GPU 0: pid 4242 (30702 MiB)"


def test_a_gpu_count_unlike_the_inventory_is_an_error():
    results, ctx = make(gpus=8, inventory_gpus=8, changes={1: {"gpu.devices": [device(i) for i in range(4)]}})
    gpus = check("gpus", results, ctx)
    assert gpus.status is Status.ERROR and gpus.detail == "node1: 4 GPU(s) found, the inventory says gpus: 8"


def test_nproc_per_node_above_the_gpu_count_is_an_error():
    job = JobSpec(path="job.yaml", name="j", nproc_per_node=8)
    results, ctx = make(gpus=4, job=job)
    gpus = check("gpus", results, ctx)
    assert gpus.status is Status.ERROR and gpus.detail == "node[0-2]: nproc_per_node 8 > 4 GPU(s)"


def test_a_gpu_host_whose_torch_cannot_see_cuda_is_a_backend_error():
    results, ctx = make(gpus=8, changes={0: {"torch_info.cuda_available": False}})
    backend = check("backend", results, ctx)
    assert backend.status is Status.ERROR and backend.hosts == ["node0"] and "does not see the GPUs" in backend.detail


def test_a_missing_iface_is_an_error_naming_the_interfaces_there_are():
    results, ctx = make(iface="ib0")
    iface = check("iface", results, ctx)
    assert iface.status is Status.ERROR
    assert iface.detail == "node[0-2]: no interface ib0 (the host has eth0, lo)"


def test_an_iface_without_an_address_is_an_error():
    results, ctx = make(changes={1: {"interfaces": {"lo": ["127.0.0.1/8"], "eth0": []}}})
    assert check("iface", results, ctx).detail == "node1: eth0 has no IPv4 address"


def test_little_free_disk_warns_and_a_missing_job_workdir_is_an_error():
    results, ctx = make(changes={1: {"disk.free": 2 * GIB}})
    disk = check("disk", results, ctx)
    assert disk.status is Status.WARN and disk.detail == "node1: 2.0 GiB free in /work (under 10 GiB)"
    job = JobSpec(path="job.yaml", name="j", workdir="/work")
    results, ctx = make(job=job, changes={2: {"disk.exists": False}})
    disk = check("disk", results, ctx)
    assert disk.status is Status.ERROR and disk.detail == "node2: workdir /work does not exist"


def test_a_master_address_that_does_not_resolve_is_an_error():
    results, ctx = make(changes={2: {"resolved": {MASTER_ADDR: {"addrs": [], "error": "Name or service not known"}}}})
    found = check("master-resolves", results, ctx)
    assert found.status is Status.ERROR and found.hosts == ["node2"]


def test_an_unresolvable_master_host_name_warns_and_is_an_error_for_c10d():
    unresolved = {MASTER_ADDR: {"addrs": [MASTER_ADDR], "error": None},
                  "node0": {"addrs": [], "error": "Name or service not known"}}
    results, ctx = make(changes={1: {"resolved": unresolved}})
    found = check("master-resolves", results, ctx)
    assert found.status is Status.WARN and found.detail == "node1: cannot resolve node0 (Name or service not known)"
    results, ctx = make(job=JobSpec(path="job.yaml", name="j", rendezvous=Rendezvous(backend="c10d")),
                        changes={1: {"resolved": unresolved}})
    assert check("master-resolves", results, ctx).status is Status.ERROR


def test_a_busy_port_on_the_master_is_an_error_and_reachability_is_not_tested():
    results, ctx = make(changes={0: {"listen": {"port": PORT, "ok": False, "error": "address already in use",
                                                "accepted": []}}})
    checks = by_name(run_checks(results, ctx))
    assert checks["port-free"].status is Status.ERROR
    assert checks["port-free"].detail == "node0: port 29500 is in use (address already in use)"
    assert "ss -ltnp" in checks["port-free"].hint
    assert checks["port-reachable"].status is Status.SKIP and "skipped" in checks["port-reachable"].detail


def test_hosts_that_cannot_connect_to_the_master_port_are_named_with_port_and_reason():
    failed = {"addr": MASTER_ADDR, "port": PORT, "ok": False, "error": "timed out after 2 s", "ms": 2000.0}
    results, ctx = make(changes={1: {"connect": failed}, 2: {"connect": failed}})
    found = check("port-reachable", results, ctx)
    assert found.status is Status.ERROR and found.hosts == ["node1", "node2"]
    assert found.detail == "node[1-2]: cannot connect to node0 at 10.0.0.10:29500 (timed out after 2 s)"
    assert "allow TCP port 29500 into node0" in found.hint


def untried(results: dict[str, ProbeResult], host: str, why: str) -> None:
    """Mark `host`'s connection as one it could not try, as the probe round does."""
    facts = results[host].facts
    assert facts is not None and facts.connect is not None
    results[host] = ProbeResult(host, facts=replace(facts, connect=replace(facts.connect, ok=False,
                                                                           error="connection refused", skipped=why)))


def test_a_host_that_could_not_try_is_skipped_with_its_reason_never_failed_nor_ok():
    results, ctx = make(n=4)
    untried(results, "node2", LATE)
    untried(results, "node3", LATE)
    found = check("port-reachable", results, ctx)
    assert found.status is Status.SKIP and found.hosts == ["node2", "node3"]
    assert found.detail == (f"node[2-3]: skipped: {LATE}; node1: connect to node0 at 10.0.0.10:29500")
    assert exit_code(run_checks(results, ctx), results, strict=False) == 0


def test_a_host_whose_probe_got_no_address_to_connect_to_is_skipped_not_failed():
    results, ctx = make()
    facts = results["node2"].facts
    assert facts is not None
    results["node2"] = ProbeResult("node2", facts=replace(facts, connect=None))
    found = check("port-reachable", results, ctx)
    assert found.status is Status.SKIP and found.hosts == ["node2"]
    assert found.detail.startswith(f"node2: skipped: {NOT_TOLD}; ")


def test_hosts_that_failed_to_connect_stay_errors_and_those_that_could_not_try_are_named_apart():
    failed = {"addr": MASTER_ADDR, "port": PORT, "ok": False, "error": "timed out after 2 s", "ms": 2000.0}
    results, ctx = make(n=4, changes={1: {"connect": failed}})
    untried(results, "node3", LATE)
    found = check("port-reachable", results, ctx)
    assert found.status is Status.ERROR and found.hosts == ["node1"]
    assert found.detail == (f"node1: cannot connect to node0 at 10.0.0.10:29500 (timed out after 2 s); "
                            f"node3: skipped: {LATE}")


def test_a_loopback_master_address_for_several_hosts_is_an_error():
    results, ctx = make()
    ctx = Context(ctx.nodes, "node0", None, "node0: master address 127.0.0.1 is a loopback address", "node0")
    found = check("port-reachable", results, ctx)
    assert found.status is Status.ERROR and "loopback" in found.detail


def test_with_the_master_unreachable_the_port_and_name_checks_are_skipped():
    results, ctx = make()
    results["node0"] = ProbeResult("node0", error="node0 (10.0.0.10:22): connection refused", unreachable=True)
    ctx = Context(ctx.nodes, "node0")
    checks = by_name(run_checks(results, ctx))
    for name in ("port-free", "master-resolves"):
        assert checks[name].status is Status.SKIP and checks[name].detail.startswith("skipped")


# ---------------------------------------------------------------- exit status and output


def test_exit_status_is_3_when_a_host_is_unreachable_even_with_other_errors():
    results, ctx = make(changes={1: {"python": "3.10.0"}})
    results["node2"] = ProbeResult("node2", error="timed out", unreachable=True)
    assert exit_code(run_checks(results, ctx), results, strict=False) == 3


def test_exit_status_is_1_on_an_error_and_on_a_warning_only_when_strict():
    results, ctx = make(changes={1: {"python": "3.10.0"}})
    assert exit_code(run_checks(results, ctx), results, strict=False) == 1
    results, ctx = make(changes={1: {"clock_skew": 30.0}})
    assert exit_code(run_checks(results, ctx), results, strict=False) == 0
    assert exit_code(run_checks(results, ctx), results, strict=True) == 1


def test_the_table_marks_each_status_and_puts_the_fix_under_each_failure():
    results, ctx = make(changes={2: {"torch_info.version": "2.12.0", "clock_skew": 9.0}})
    table = render_table(run_checks(results, ctx), ctx, 1.5)
    lines = table.splitlines()
    torch = next(i for i, line in enumerate(lines) if "torch differs" in line)
    assert lines[torch].startswith("✗ torch")
    assert "fix: install the same torch" in lines[torch + 1]
    assert any(line.startswith("! clock") for line in lines)
    assert any(line.startswith("✓ python") and "node[0-2]: python 3.11.7" in line for line in lines)
    assert lines[-1] == "21 ok, 1 warning(s), 1 error(s) in 1.5 s"
    assert "\x1b[" not in table
    assert "\x1b[31m✗\x1b[0m" in render_table(run_checks(results, ctx), ctx, 1.5, colour=True)


def test_every_host_unreachable_folds_the_checks_skipped_for_one_reason_and_says_the_fix_once():
    results, ctx = make()
    for name in list(results):
        results[name] = ProbeResult(name, error=f"{name} (10.0.0.1:22): authentication failed", unreachable=True)
    lines = render_table(run_checks(results, ctx), ctx, 1.5).splitlines()

    assert len(lines) <= 14, "\n".join(lines)
    assert any(line.startswith("- 17 checks ") and line.endswith("no host was probed: python, torch, cuda, nccl, "
               "driver, backend, gpus, gpu-busy, ecc, shm, memlock, py-spy, disk, clock, iface, deepspeed, "
               "build-locks") for line in lines)
    assert sum("fix the errors above" in line for line in lines) == 1
    assert lines[-1] == "0 ok, 0 warning(s), 1 error(s), 22 skipped in 1.5 s"


def test_json_has_the_documented_keys_and_the_same_statuses_as_the_checks():
    results, ctx = make(changes={2: {"torch_info.version": "2.12.0"}})
    checks = run_checks(results, ctx)
    data = json.loads(json.dumps(to_json(results, checks, ctx, 1.25, 1, None)))
    assert set(data) == {"schema", "seconds", "master", "hosts", "checks", "bandwidth", "summary", "exit_code"}
    assert data["master"] == {"node": "node0", "addr": MASTER_ADDR, "port": PORT}
    assert {c["name"]: c["status"] for c in data["checks"]} == {c.name: c.status.value for c in checks}
    assert data["hosts"]["node2"]["facts"]["torch_info"]["version"] == "2.12.0"
    assert data["summary"] == {"ok": 22, "warn": 0, "error": 1, "skip": 0} and data["exit_code"] == 1


# ---------------------------------------------------------------- bandwidth


def test_busbw_is_algbw_scaled_by_2_n_minus_1_over_n():
    result = SizeResult(bytes=64 << 20, time_s=0.1, ranks=4)
    assert result.algbw == pytest.approx((64 << 20) / 0.1 / 1e9)
    assert result.busbw == pytest.approx(result.algbw * 1.5)


def test_rank_zeros_metrics_line_becomes_per_size_results():
    metrics = {"final": True, "allreduce": {"backend": "gloo", "world_size": 3,
                                            "results": [{"bytes": 1 << 20, "time_s": 0.002}]}}
    ranks, results = parse_results(metrics)
    assert ranks == 3 and results == [SizeResult(1 << 20, 0.002, 3)]
    assert parse_results(None) == (0, [])


def test_bandwidth_under_the_threshold_warns_and_a_failed_job_is_an_error():
    report = BandwidthReport("gloo", 3, "job", 3, [SizeResult(64 << 20, 1.0, 3)])
    low = bandwidth_check(report, 0.1, ["node0", "node1", "node2"])
    assert low.status is Status.WARN and "under 0.1 GB/s" in low.detail
    assert bandwidth_check(report, 0.01, ["node0"]).status is Status.OK
    failed = BandwidthReport("gloo", 3, "job", error="all-reduce job job failed")
    assert bandwidth_check(failed, 0.1, ["node0"]).status is Status.ERROR


def test_one_rank_has_no_link_to_measure_and_is_not_warned_about():
    # Seen on a lent H200 (one GPU, one NCCL rank): "busbw up to 0.00 GB/s (under 10 GB/s)".
    report = BandwidthReport("nccl", 1, "job", 1, [SizeResult(256 << 20, 1e-5, 1)])
    check = bandwidth_check(report, 10.0, ["gpu0"])
    assert (check.status, check.detail) == (Status.OK, "nccl all-reduce over 1 rank: no link to measure")


# ---------------------------------------------------------------- launch's preflight, on two local "hosts"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local_nodes() -> list[NodeSpec]:
    return [NodeSpec(name=f"local{i}", host="localhost", python=sys.executable, transport=TransportKind.LOCAL)
            for i in range(2)]


def two_host_plan(port: int) -> LaunchPlan:
    hosts = [HostPlan(node=n.name, host=n.host, node_rank=i, nproc=1, python=n.python, workdir="/tmp", argv=[],
                      env={}, secret_names=[], iface=None) for i, n in enumerate(local_nodes())]
    return LaunchPlan(job_id="j", job_name="j", spec_path="j.yaml", inventory_path="inv.yaml", backend="ssh",
                      master_node="local0", master_addr="127.0.0.1", master_port=port, nnodes=2, hosts=hosts,
                      secrets={})


def launch_round(port: int) -> dict[str, HostFacts]:
    """The facts of the one probe round a launch runs: the master listens on `port`, the other connects."""
    nodes = local_nodes()
    with Group(nodes) as group:
        return probe_round(group, nodes[0], {}, port, "127.0.0.1", resolve=False).check()


def preflight(port: int, facts: dict[str, HostFacts]) -> None:
    doctor_preflight.launch_preflight(two_host_plan(port), {n.name: n for n in local_nodes()}, facts)


def test_preflight_passes_on_the_facts_of_a_launch_round_where_the_port_was_reachable():
    port = free_port()
    facts = launch_round(port)
    assert facts["local0"].listen is not None and facts["local0"].listen.ok
    assert facts["local1"].connect is not None and facts["local1"].connect.ok
    assert facts["local1"].resolved == {}  # a launch looks no names up
    preflight(port, facts)


def test_preflight_refuses_with_doctors_message_when_torch_differs():
    facts = {name: HostFacts(name, python="3.11.7", torch=version, listen=Listen(PORT, ok=True),
                             connect=Connect(MASTER_ADDR, PORT, ok=True))
             for name, version in (("local0", "2.13.0"), ("local1", "2.0.0"))}
    with pytest.raises(doctor_preflight.PreflightError) as caught:
        preflight(PORT, facts)
    message = str(caught.value)
    assert "nothing was started" in message
    assert "✗ torch  torch differs: local0: 2.13.0; local1: 2.0.0" in message
    assert caught.value.exit_code == 1


def test_preflight_refuses_a_missing_entry_with_exit_2_naming_the_host():
    entries = {"local0": EntryPoint("script", "train.py", ok=True, found="/work/train.py"),
               "local1": EntryPoint("script", "train.py", error="no such file")}
    facts = {name: HostFacts(name, python="3.11.7", torch="2.13.0", listen=Listen(PORT, ok=True),
                             connect=Connect(MASTER_ADDR, PORT, ok=True), entry=entry)
             for name, entry in entries.items()}
    with pytest.raises(doctor_preflight.PreflightError) as caught:
        preflight(PORT, facts)
    assert "✗ entry  local1: script train.py: no such file" in str(caught.value)
    assert caught.value.exit_code == 2


def test_the_entry_check_says_why_it_did_not_look():
    results, ctx = make()
    results = {name: ProbeResult(name, facts=replace(r.facts, entry=None)) for name, r in results.items()}
    skipped = check("entry", results, ctx)
    assert skipped.status is Status.SKIP and skipped.detail.startswith("skipped: no job given")
    job = job_from_text("name: j\nmodule: train\nsync: true\n", "job.yaml")
    assert "sync: true" in check("entry", results, Context(ctx.nodes, ctx.master, job=job)).detail
    assert import_options(ctx.nodes, job, "/w")["node0"].keys() == {"import_from"}


def test_a_synced_job_whose_script_lies_outside_the_synced_directory_is_looked_for_on_the_hosts(tmp_path: Path):
    outside = tmp_path / "train.py"
    outside.write_text("print('hi')\n")
    ctx = make()[1]
    inside = job_from_text("name: j\nscript: tests/cluster/jobs/hang_worker.py\nsync: true\n", "job.yaml")
    assert import_options(ctx.nodes, inside, "/w")["node0"].keys() == {"import_from"}
    far = job_from_text(f"name: j\nscript: {outside}\nsync: true\n", str(tmp_path / "job.yaml"))
    assert import_options(ctx.nodes, far, "/w")["node0"]["entry"] == {"script": str(outside), "cwd": "/w"}


def test_preflight_refuses_when_the_rendezvous_port_was_taken_during_the_launch_round():
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        facts = launch_round(port)
    with pytest.raises(doctor_preflight.PreflightError, match=r"port .* is in use") as caught:
        preflight(port, facts)
    assert caught.value.exit_code == 2  # a busy port is the operator's to change: exit 2


def test_preflight_refuses_an_unreachable_port_with_exit_3_and_a_missing_entry_still_with_2():
    cut = Connect(MASTER_ADDR, PORT, ok=False, error="timed out after 2 s")
    facts = {"local0": HostFacts("local0", python="3.11.7", torch="2.13.0", listen=Listen(PORT, ok=True)),
             "local1": HostFacts("local1", python="3.11.7", torch="2.13.0", connect=cut)}
    with pytest.raises(doctor_preflight.PreflightError, match="cannot connect to local0") as caught:
        preflight(PORT, facts)
    assert caught.value.exit_code == 3
    missing = EntryPoint("script", "train.py", error="no such file")
    facts = {name: replace(f, entry=missing) for name, f in facts.items()}
    with pytest.raises(doctor_preflight.PreflightError) as caught:
        preflight(PORT, facts)
    assert caught.value.exit_code == 2


STANDIN = "9.9.9+standin"


def standin_torch(where: Path) -> Path:
    """A torch with no version.py and no package metadata, as a source tree on PYTHONPATH has it."""
    (where / "torch").mkdir(parents=True)
    (where / "torch" / "__init__.py").write_text(f'__version__ = "{STANDIN}"\n')
    return where


def test_each_probe_imports_and_looks_for_the_entry_as_its_job_would_with_the_jobs_env_and_no_secret():
    nodes = [NodeSpec(name="a", host="a", python="/opt/py/bin/python", env={"PYTHONPATH": "/inv", "X": "1"}),
             NodeSpec(name="b", host="b")]
    job = job_from_text("name: t\nmodule: m\nenv: {PYTHONPATH: /job, TOKEN: '${env:TOKEN}'}\n", "j.yaml")
    assert import_options(nodes, job, "/work") == {
        "a": {"import_from": {"python": "/opt/py/bin/python", "cwd": "/work", "env": {"PYTHONPATH": "/job", "X": "1"}},
              "entry": {"module": "m"}},
        "b": {"import_from": {"python": "python3", "cwd": "/work", "env": {"PYTHONPATH": "/job"}},
              "entry": {"module": "m"}},
    }


def test_a_script_jobs_probe_looks_first_where_its_workers_do_the_scripts_own_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    nodes = [NodeSpec(name="a", host="a")]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)

    def first(job_text: str | None) -> str:
        job = job_from_text(job_text, "j.yaml") if job_text else None
        return import_options(nodes, job, "/work")["a"]["import_from"]["cwd"]

    assert first("name: t\nscript: src/train.py\n") == "/work/src"
    assert first(f"name: t\nscript: {tmp_path}/src/train.py\n") == f"{tmp_path}/src"
    assert first("name: t\nmodule: m\n") == "/work"
    assert first(None) == "/work"


def launch_torch(node: NodeSpec, job_text: str) -> str | None:
    """The torch version that a launch's one probe round found on `node` (a one-node job)."""
    backend = SshBackend(Store.__new__(Store).job_dir)
    try:
        backend.plan_on(job_from_text(job_text, "j.yaml"), Inventory("inv.yaml", (node,)), [node], "j")
        return backend.facts[node.name].torch
    finally:
        backend.release()


@pytest.mark.parametrize(("where", "expected"), [
    ("the inventory's PYTHONPATH", STANDIN),
    ("the job's workdir", STANDIN),
    ("the inventory's PYTHONPATH, hidden by the job's", metadata.version("torch")),
])
def test_a_launchs_probe_reports_the_torch_the_job_will_import(tmp_path: Path, where: str, expected: str):
    site = standin_torch(tmp_path / "site")
    (tmp_path / "empty").mkdir()
    env = {"PYTHONPATH": str(site)} if "inventory" in where else {}
    node = NodeSpec(name="local0", host="localhost", python=sys.executable, transport=TransportKind.LOCAL, env=env)
    job = "name: t\nmodule: m\n"
    if "workdir" in where:
        job += f"workdir: {site}\n"
    if "hidden" in where:
        job += f"env: {{PYTHONPATH: {tmp_path / 'empty'}}}\n"
    assert launch_torch(node, job) == expected


def test_the_master_is_the_inventorys_when_selected():
    nodes = [NodeSpec(name="a", host="a"), NodeSpec(name="b", host="b")]
    assert Inventory("inv.yaml", tuple(nodes), master="b").master_of(nodes).name == "b"
    assert Inventory("inv.yaml", tuple(nodes), master="c").master_of(nodes[:1]).name == "a"


# ---------------------------------------------------------------- checks that could not run


def test_with_no_host_reached_every_check_is_skipped_and_none_is_ok():
    results, ctx = make()
    for name in results:
        results[name] = ProbeResult(name, error=f"{name} ({name}.lab:22): connection timed out after 3 s",
                                   unreachable=True)
    checks = run_checks(results, ctx)
    statuses = {c.name: c.status for c in checks}
    assert statuses.pop("reachable") is Status.ERROR
    assert set(statuses.values()) == {Status.SKIP}
    table = render_table(checks, ctx, 3.1)
    assert "✓" not in table and "0 ok, 0 warning(s), 1 error(s), 22 skipped in 3.1 s" in table


def test_hosts_unreachable_for_the_same_reason_share_one_line_with_the_fix():
    results, ctx = make()
    for i in (1, 2):
        results[f"node{i}"] = ProbeResult(f"node{i}", unreachable=True, error=(
            f"node{i} (10.0.0.1{i}:22): authentication failed as root with key /k (check identity_file / user)"))
    found = check("reachable", results, ctx)
    assert found.status is Status.ERROR and found.hosts == ["node1", "node2"]
    assert found.detail == "node[1-2]: authentication failed as root with key /k (check identity_file / user)"
    assert found.hint.startswith(REACH_HINT)


# ---------------------------------------------------------------- DeepSpeed: its version, torch's stale build locks

DS_JOB = "name: ds\nscript: jobs/deepspeed_zero.py\n"
STALE = {"extensions.locks": [{"path": "/home/u/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm/lock",
                               "age_s": 4000.0, "building": False}]}


def test_a_deepspeed_version_that_differs_between_hosts_is_an_error_naming_the_odd_host():
    results, ctx = make(changes={2: {"deepspeed": "0.17.0"}})
    found = check("deepspeed", results, ctx)
    assert (found.status, found.hosts) == (Status.ERROR, ["node2"])
    assert found.detail == "deepspeed differs: node[0-1]: 0.19.8; node2: 0.17.0"


def test_deepspeed_missing_where_the_job_imports_it_names_the_hosts_and_how_to_install():
    job = job_from_text(DS_JOB, "job.yaml")
    results, ctx = make(changes={1: {"deepspeed": None, "python_path": "/opt/venv/bin/python"}}, job=job)
    found = check("deepspeed", results, ctx)
    assert (found.status, found.hosts) == (Status.ERROR, ["node1"])
    assert "node1: deepspeed not installed in the job's python" in found.detail
    assert "node1: /opt/venv/bin/python -m pip install 'deepspeed==0.19.8'" in found.hint


def test_deepspeed_absent_everywhere_is_skipped_for_a_job_that_does_not_use_it():
    results, ctx = make(changes={i: {"deepspeed": None} for i in range(3)},
                        job=job_from_text("name: r\nscript: jobs/train_resnet50.py\n", "job.yaml"))
    assert check("deepspeed", results, ctx).status is Status.SKIP


def test_a_stale_build_lock_is_named_with_its_host_and_how_to_clear_it():
    results, ctx = make(changes={1: STALE})
    found = check("build-locks", results, ctx)
    assert (found.status, found.hosts) == (Status.ERROR, ["node1"])
    assert ("node1: /home/u/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm/lock (67 min old, no build running)"
            in found.detail)
    assert "rm /home/u/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm/lock" in found.hint


def test_a_lock_under_which_a_build_runs_is_not_stale():
    building = {"extensions.locks": [{**STALE["extensions.locks"][0], "building": True}]}
    results, ctx = make(changes={1: building})
    assert check("build-locks", results, ctx).status is Status.OK


def test_preflight_of_a_deepspeed_job_refuses_a_stale_lock_and_a_host_without_deepspeed():
    job = job_from_text(DS_JOB, "job.yaml")
    results, _ = make(n=2, changes={0: STALE, 1: {"deepspeed": None}})
    facts = {f"local{i}": replace(r.facts, node=f"local{i}", listen=Listen(PORT, ok=True),
                                  connect=Connect(MASTER_ADDR, PORT, ok=True))
             for i, r in enumerate(results.values())}
    with pytest.raises(doctor_preflight.PreflightError) as caught:
        doctor_preflight.launch_preflight(two_host_plan(PORT), {n.name: n for n in local_nodes()}, facts, job=job)
    message = str(caught.value)
    assert "✗ deepspeed" in message and "local1: deepspeed not installed" in message
    assert "✗ build-locks" in message and "local0: /home/u/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm/lock" \
        in message
    plain = job_from_text("name: r\nscript: jobs/train_resnet50.py\n", "job.yaml")
    doctor_preflight.launch_preflight(two_host_plan(PORT), {n.name: n for n in local_nodes()}, facts, job=plain)
