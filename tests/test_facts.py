"""Host facts: one typed view of the probe's JSON, tolerant of what an older or partial probe leaves out."""

from __future__ import annotations

from orchestrator.facts import HostFacts


def test_a_fast_probe_gives_the_planning_facts_and_unknowns_for_the_rest():
    raw = {"hostname": "node1", "python": "3.11.7", "torch": "2.13.0", "gpus": 2, "home": "/root",
           "interfaces": {"eth0": ["10.0.0.11/24"]}, "route_iface": "eth0"}
    facts = HostFacts.from_probe("node1", raw)
    assert (facts.gpus, facts.home, facts.route_iface, facts.interfaces) == (2, "/root", "eth0", raw["interfaces"])
    assert facts.torch_version == "2.13.0" and facts.gpu is None and facts.gpu_total == 2
    assert facts.listen is None and facts.connect is None and facts.resolved == {} and facts.memlock is None
    assert facts.raw == raw


def test_mistyped_or_null_values_read_as_unknown_not_as_a_crash():
    facts = HostFacts.from_probe("n", {"gpus": "eight", "interfaces": None, "shm": None, "disk": "full",
                                      "torch_info": {"version": 2.13, "gloo": "yes"}, "clock_skew": True,
                                      "gpu": {"devices": [{"index": 0, "processes": [{"pid": 7}]}, "junk"]}})
    assert facts.gpus == 0 and facts.interfaces == {} and facts.shm is None and facts.disk.exists
    assert facts.torch_info.version == "2.13" and facts.torch_info.gloo is None and facts.clock_skew is None
    assert facts.gpu_total == 1 and facts.devices[0].processes[0].pid == 7


def test_the_full_probes_nested_facts_are_typed():
    facts = HostFacts.from_probe("node0", {
        "torch_info": {"imported": True, "version": "2.13.0+cu128", "cuda": "12.8", "cuda_available": True},
        "gpu": {"source": "nvml", "driver": "570.86.15",
                "devices": [{"index": 0, "name": "H100", "memory_total_mib": 81559, "ecc_uncorrected": 0}]},
        "listen": {"port": 29500, "ok": True, "error": None, "accepted": ["10.0.0.11"]},
        "resolved": {"node0": {"addrs": ["10.0.0.10"], "error": None}}, "memlock": 65536,
    })
    assert facts.torch_version == "2.13.0+cu128" and facts.torch_info.cuda_available is True
    assert facts.gpu is not None and facts.gpu.driver == "570.86.15" and facts.devices[0].ecc_uncorrected == 0
    assert facts.listen is not None and facts.listen.accepted == ("10.0.0.11",)
    assert facts.resolved["node0"].addrs == ("10.0.0.10",) and facts.memlock == 65536


def test_the_probe_finds_deepspeeds_version_and_torchs_build_locks_and_who_builds_under_them(tmp_path):
    import subprocess
    import sys
    from importlib import metadata

    from orchestrator.remote import probe

    stale, busy = tmp_path / "py311_cpu" / "deepspeed_shm_comm", tmp_path / "py311_cpu" / "cpu_adam"
    for folder in (stale, busy):
        folder.mkdir(parents=True)
        (folder / "lock").touch()
    (tmp_path / "py311_cpu" / "fused_adam").mkdir()
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=busy)
    try:
        raw = probe.facts({"import_from": {"env": {"TORCH_EXTENSIONS_DIR": str(tmp_path)}}})
    finally:
        builder.kill()
        builder.wait()
    facts = HostFacts.from_probe("n", raw)
    assert facts.deepspeed == metadata.version("deepspeed")
    assert facts.extensions_root == str(tmp_path)
    assert [(lock.path, lock.building) for lock in facts.extension_locks] == [
        (str(busy / "lock"), True), (str(stale / "lock"), False)]
    assert HostFacts.from_probe("old", {}).extension_locks == () and HostFacts.from_probe("old", {}).deepspeed is None
